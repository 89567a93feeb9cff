//! The hot tier's count-min sketch (`store/hot/sketch.py`), done per call in one pass with the
//! GIL released. The counters stay a numpy uint32 `[depth, width]` array owned by Python; each
//! id's cell in row `d` is `splitmix64(id ^ seeds[d]) & mask`, exactly as the numpy code was.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const M1: u64 = 0xBF58_476D_1CE4_E5B9;
const M2: u64 = 0x94D0_49BB_1331_11EB;

/// SplitMix64's finaliser of `x + golden`, as `kelp.store.rows.hashing.splitmix64` (wrapping).
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(M1);
    z = (z ^ (z >> 27)).wrapping_mul(M2);
    z ^ (z >> 31)
}

/// What each id adds: one increment for all, or one per id.
pub enum Inc<'a> {
    All(u32),
    Each(&'a [u32]),
}

/// Adds `inc` to each id's cell in every row of `counts` (`seeds.len()` rows of `mask + 1`
/// counters, row-major), wrapping at 2**32 as numpy's uint32 `add.at` does.
pub fn add(counts: &mut [u32], ids: &[u64], inc: Inc<'_>, seeds: &[u64], mask: u64) {
    let width = (mask as usize) + 1;
    for (row, &seed) in counts.chunks_exact_mut(width).zip(seeds) {
        match inc {
            Inc::All(by) => {
                for &id in ids {
                    let cell = &mut row[(splitmix64(id ^ seed) & mask) as usize];
                    *cell = cell.wrapping_add(by);
                }
            }
            Inc::Each(by) => {
                for (&id, &b) in ids.iter().zip(by) {
                    let cell = &mut row[(splitmix64(id ^ seed) & mask) as usize];
                    *cell = cell.wrapping_add(b);
                }
            }
        }
    }
}

/// Writes into `out` each id's minimum over the rows of `counts` (laid out as for [`add`]).
pub fn estimate(counts: &[u32], ids: &[u64], seeds: &[u64], mask: u64, out: &mut [u32]) {
    let width = (mask as usize) + 1;
    for o in out.iter_mut() {
        *o = u32::MAX;
    }
    for (row, &seed) in counts.chunks_exact(width).zip(seeds) {
        for (&id, o) in ids.iter().zip(out.iter_mut()) {
            let c = row[(splitmix64(id ^ seed) & mask) as usize];
            if c < *o {
                *o = c;
            }
        }
    }
}

// pyo3 0.22's #[pyfunction] expands to an `.into()` that newer clippy flags (see lib.rs).
#[allow(clippy::useless_conversion)]
pub mod bindings {
    use super::{add, estimate, Inc};
    use pyo3::buffer::{Element, PyBuffer};
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::PyInt;

    fn bad(msg: String) -> PyErr {
        PyValueError::new_err(msg)
    }

    /// A C-contiguous buffer of `T`, or a ValueError naming `what`.
    fn buffer<T: Element>(obj: &Bound<'_, PyAny>, what: &str, kind: &str) -> PyResult<PyBuffer<T>> {
        let buf = PyBuffer::<T>::get_bound(obj).map_err(|e| {
            bad(format!(
                "sketch: {} must be a {} buffer ({})",
                what,
                kind,
                e.value_bound(obj.py())
            ))
        })?;
        if !buf.is_c_contiguous() {
            return Err(bad(format!("sketch: {} must be C-contiguous", what)));
        }
        Ok(buf)
    }

    /// The byte range a buffer covers, to refuse overlaps between what is written and read.
    fn span<T: Element>(buf: &PyBuffer<T>) -> (usize, usize) {
        let at = buf.buf_ptr() as usize;
        (at, at + buf.len_bytes())
    }

    fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
        a.0 < b.1 && b.0 < a.1
    }

    /// The counters, checked: uint32 `[len(seeds), mask + 1]`, `mask + 1` a power of two, and
    /// writable if `write`.
    fn counters(
        obj: &Bound<'_, PyAny>,
        seeds: &[u64],
        mask: u64,
        write: bool,
    ) -> PyResult<PyBuffer<u32>> {
        let buf = buffer::<u32>(obj, "counts", "uint32")?;
        if write && buf.readonly() {
            return Err(bad("sketch: counts must be writable".to_string()));
        }
        if seeds.is_empty() {
            return Err(bad(
                "sketch: need at least one seed (depth >= 1)".to_string()
            ));
        }
        let width = mask.wrapping_add(1);
        if width == 0 || !width.is_power_of_two() || width > (usize::MAX as u64) {
            return Err(bad(format!(
                "sketch: mask + 1 must be a power of two, got mask={}",
                mask
            )));
        }
        let shape = buf.shape();
        if shape.len() != 2 || shape[0] != seeds.len() || shape[1] as u64 != width {
            return Err(bad(format!(
                "sketch: counts must have shape [{}, {}] (len(seeds), mask + 1), got {:?}",
                seeds.len(),
                width,
                shape
            )));
        }
        Ok(buf)
    }

    /// Adds ``inc`` (one int for all, or a uint32 buffer with one per id) to each uint64 id's
    /// cell ``splitmix64(id ^ seeds[d]) & mask`` in every row ``d`` of ``counts`` (a writable,
    /// C-contiguous uint32 ``[len(seeds), mask + 1]`` array), wrapping at 2**32. The GIL is
    /// released while it runs. Raises ValueError on any buffer, inc or mask that does not fit,
    /// before anything is written.
    #[pyfunction]
    #[pyo3(signature = (counts, ids, inc, seeds, mask))]
    pub fn sketch_add(
        py: Python<'_>,
        counts: &Bound<'_, PyAny>,
        ids: &Bound<'_, PyAny>,
        inc: &Bound<'_, PyAny>,
        seeds: Vec<u64>,
        mask: u64,
    ) -> PyResult<()> {
        let table = counters(counts, &seeds, mask, true)?;
        let idb = buffer::<u64>(ids, "ids", "uint64")?;
        let n = idb.item_count();
        let written = span(&table);
        if overlap(written, span(&idb)) {
            return Err(bad(
                "sketch: ids must not share memory with counts".to_string()
            ));
        }
        let incb = if inc.is_instance_of::<PyInt>() {
            let by: u32 = inc.extract().map_err(|_| {
                bad("sketch: a scalar inc must be an int in [0, 2**32)".to_string())
            })?;
            Err(by)
        } else {
            let b = buffer::<u32>(inc, "inc", "uint32 (or an int)")?;
            if b.item_count() != n {
                return Err(bad(format!(
                    "sketch: inc has {} values for {} ids",
                    b.item_count(),
                    n
                )));
            }
            if overlap(written, span(&b)) {
                return Err(bad(
                    "sketch: inc must not share memory with counts".to_string()
                ));
            }
            Ok(b)
        };
        // SAFETY: each PyBuffer holds its exporter's buffer until dropped at the end of this
        // function, so the memory stays valid and unresized; lengths come from the buffers, the
        // counters are writable and share no bytes with what is read. Python callers must not
        // write the arrays from another thread meanwhile (the sketch is not thread-safe).
        let cells: &mut [u32] = unsafe {
            std::slice::from_raw_parts_mut(table.buf_ptr() as *mut u32, table.item_count())
        };
        let idv: &[u64] = unsafe { std::slice::from_raw_parts(idb.buf_ptr() as *const u64, n) };
        match incb {
            Err(by) => py.allow_threads(|| add(cells, idv, Inc::All(by), &seeds, mask)),
            Ok(b) => {
                let each: &[u32] =
                    unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u32, n) };
                py.allow_threads(|| add(cells, idv, Inc::Each(each), &seeds, mask))
            }
        }
        Ok(())
    }

    /// Writes into ``out`` (a writable uint32 buffer, one per id) each uint64 id's minimum over
    /// the rows of ``counts`` (uint32 ``[len(seeds), mask + 1]``, read-only allowed) of its cell
    /// ``splitmix64(id ^ seeds[d]) & mask``. The GIL is released while it runs. Raises ValueError
    /// on any buffer or mask that does not fit.
    #[pyfunction]
    #[pyo3(signature = (counts, ids, seeds, mask, out))]
    pub fn sketch_estimate(
        py: Python<'_>,
        counts: &Bound<'_, PyAny>,
        ids: &Bound<'_, PyAny>,
        seeds: Vec<u64>,
        mask: u64,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let table = counters(counts, &seeds, mask, false)?;
        let idb = buffer::<u64>(ids, "ids", "uint64")?;
        let outb = buffer::<u32>(out, "out", "uint32")?;
        let n = idb.item_count();
        if outb.readonly() {
            return Err(bad("sketch: out must be writable".to_string()));
        }
        if outb.item_count() != n {
            return Err(bad(format!(
                "sketch: out has {} values for {} ids",
                outb.item_count(),
                n
            )));
        }
        let written = span(&outb);
        if overlap(written, span(&table)) || overlap(written, span(&idb)) {
            return Err(bad(
                "sketch: out must not share memory with counts or ids".to_string()
            ));
        }
        // SAFETY: as in `sketch_add`; here only `out` is written, and it overlaps nothing read.
        let cells: &[u32] = unsafe {
            std::slice::from_raw_parts(table.buf_ptr() as *const u32, table.item_count())
        };
        let idv: &[u64] = unsafe { std::slice::from_raw_parts(idb.buf_ptr() as *const u64, n) };
        let res: &mut [u32] =
            unsafe { std::slice::from_raw_parts_mut(outb.buf_ptr() as *mut u32, n) };
        py.allow_threads(|| estimate(cells, idv, &seeds, mask, res));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_hashing_py() {
        // kelp.store.rows.hashing's doctest: splitmix64([0]) == 16294208416658607535.
        assert_eq!(splitmix64(0), 16294208416658607535);
    }

    #[test]
    fn add_then_estimate_and_wrap() {
        let seeds = [1u64, 2];
        let mask = 63u64;
        let mut counts = vec![0u32; 2 * 64];
        add(&mut counts, &[7, 9, 7], Inc::Each(&[5, 1, 2]), &seeds, mask);
        let mut out = [0u32; 3];
        estimate(&counts, &[7, 9, 7], &seeds, mask, &mut out);
        assert!(out[0] >= 7 && out[1] >= 1);
        add(&mut counts, &[7], Inc::All(u32::MAX), &seeds, mask);
        estimate(&counts, &[7], &seeds, mask, &mut out[..1]);
        assert_eq!(out[0], 6);
    }
}
