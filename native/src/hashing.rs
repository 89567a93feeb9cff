//! Id hashing (`store/rows/hashing.py`): SplitMix64 over a whole id array, and rendezvous
//! (highest-random-weight) shard choice, each one pass with the GIL released. Bit for bit what
//! the numpy code computes, since shard placement and new rows' init values derive from it.
//!
//! Also home to the buffer checks that the id map and dedup bindings share with these.

use crate::sketch::splitmix64;

/// `out[i] = splitmix64(ids[i])`.
pub fn mix(ids: &[u64], out: &mut [u64]) {
    for (o, &id) in out.iter_mut().zip(ids) {
        *o = splitmix64(id);
    }
}

/// `out[i]` = the index of the first largest `splitmix64(ids[i] ^ seeds[s])` over `s`, as numpy's
/// `argmax` picks among equal weights. `seeds` must not be empty.
pub fn rendezvous(ids: &[u64], seeds: &[u64], out: &mut [i64]) {
    for (o, &id) in out.iter_mut().zip(ids) {
        let mut best = 0usize;
        let mut top = splitmix64(id ^ seeds[0]);
        for (s, &seed) in seeds.iter().enumerate().skip(1) {
            let w = splitmix64(id ^ seed);
            if w > top {
                top = w;
                best = s;
            }
        }
        *o = best as i64;
    }
}

/// Checked views of Python buffers, shared by the bindings of this crate's newer modules: each
/// buffer must be C-contiguous and of the element type asked for, an output also writable and
/// disjoint from the inputs, so that the slices handed to the GIL-free code are sound.
pub(crate) mod buffers {
    use pyo3::buffer::{Element, PyBuffer};
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;

    pub fn bad(msg: String) -> PyErr {
        PyValueError::new_err(msg)
    }

    /// A C-contiguous buffer of `T`, or a ValueError naming the function, argument and type.
    pub fn input<T: Element>(
        obj: &Bound<'_, PyAny>,
        func: &str,
        what: &str,
        kind: &str,
    ) -> PyResult<PyBuffer<T>> {
        let buf = PyBuffer::<T>::get_bound(obj).map_err(|e| {
            bad(format!(
                "{}: {} must be a {} buffer ({})",
                func,
                what,
                kind,
                e.value_bound(obj.py())
            ))
        })?;
        if !buf.is_c_contiguous() {
            return Err(bad(format!("{}: {} must be C-contiguous", func, what)));
        }
        Ok(buf)
    }

    /// As [`input`], and writable with exactly `len` items.
    pub fn output<T: Element>(
        obj: &Bound<'_, PyAny>,
        func: &str,
        what: &str,
        kind: &str,
        len: usize,
    ) -> PyResult<PyBuffer<T>> {
        let buf = input::<T>(obj, func, what, kind)?;
        if buf.readonly() {
            return Err(bad(format!("{}: {} must be writable", func, what)));
        }
        if buf.item_count() != len {
            return Err(bad(format!(
                "{}: {} has {} items, needs {}",
                func,
                what,
                buf.item_count(),
                len
            )));
        }
        Ok(buf)
    }

    /// The byte range a buffer covers.
    pub fn span<T: Element>(buf: &PyBuffer<T>) -> (usize, usize) {
        let at = buf.buf_ptr() as usize;
        (at, at + buf.len_bytes())
    }

    /// A ValueError unless `written` shares no byte with any of `read`.
    pub fn disjoint(
        func: &str,
        what: &str,
        written: (usize, usize),
        read: &[(usize, usize)],
    ) -> PyResult<()> {
        if read.iter().any(|r| written.0 < r.1 && r.0 < written.1) {
            return Err(bad(format!(
                "{}: {} must not share memory with the inputs",
                func, what
            )));
        }
        Ok(())
    }

    /// The items of a checked buffer.
    ///
    /// # Safety
    /// `buf` must come from [`input`] or [`output`] (C-contiguous, aligned, of `T`) and outlive
    /// the slice, and nothing may write it meanwhile.
    pub unsafe fn slice<T: Element>(buf: &PyBuffer<T>) -> &[T] {
        let n = buf.item_count();
        if n == 0 {
            return &[];
        }
        std::slice::from_raw_parts(buf.buf_ptr() as *const T, n)
    }

    /// The items of a checked, writable buffer.
    ///
    /// # Safety
    /// As for [`slice`], `buf` must come from [`output`], and no other slice may cover its bytes.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T: Element>(buf: &PyBuffer<T>) -> &mut [T] {
        let n = buf.item_count();
        if n == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut T, n)
    }
}

// pyo3 0.22's #[pyfunction] expands to an `.into()` that newer clippy flags (see lib.rs).
#[allow(clippy::useless_conversion)]
pub mod bindings {
    use super::buffers::{bad, disjoint, input, output, slice, slice_mut, span};
    use pyo3::prelude::*;

    /// Writes ``splitmix64(ids[i])`` into ``out[i]``: ``ids`` a C-contiguous uint64 buffer of
    /// any shape, ``out`` a writable C-contiguous uint64 buffer of as many items, sharing no
    /// memory with ``ids``. The GIL is released while it runs.
    #[pyfunction]
    #[pyo3(signature = (ids, out))]
    pub fn splitmix64(
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let idb = input::<u64>(ids, "splitmix64", "ids", "uint64")?;
        let outb = output::<u64>(out, "splitmix64", "out", "uint64", idb.item_count())?;
        disjoint("splitmix64", "out", span(&outb), &[span(&idb)])?;
        // SAFETY: both buffers are checked and held until the end of this function; `out` is
        // disjoint from `ids`. Callers must not write them from another thread meanwhile.
        let (idv, res) = unsafe { (slice(&idb), slice_mut(&outb)) };
        py.allow_threads(|| super::mix(idv, res));
        Ok(())
    }

    /// Writes into ``out[i]`` (writable int64, one per id) the index ``s`` of the largest
    /// ``splitmix64(ids[i] ^ seeds[s])``, the first such on ties: each uint64 id's shard by
    /// highest random weight. ``seeds``: a C-contiguous uint64 buffer, at least one. The GIL is
    /// released while it runs.
    #[pyfunction]
    #[pyo3(signature = (ids, seeds, out))]
    pub fn rendezvous(
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        seeds: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let idb = input::<u64>(ids, "rendezvous", "ids", "uint64")?;
        let seedb = input::<u64>(seeds, "rendezvous", "seeds", "uint64")?;
        if seedb.item_count() == 0 {
            return Err(bad("rendezvous: needs at least one shard seed".to_string()));
        }
        let outb = output::<i64>(out, "rendezvous", "out", "int64", idb.item_count())?;
        disjoint(
            "rendezvous",
            "out",
            span(&outb),
            &[span(&idb), span(&seedb)],
        )?;
        // SAFETY: as in `splitmix64`; only `out` is written and it overlaps nothing read.
        let (idv, seedv, res) = unsafe { (slice(&idb), slice(&seedb), slice_mut(&outb)) };
        py.allow_threads(|| super::rendezvous(idv, seedv, res));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_splitmix64_per_id() {
        let mut out = [0u64; 2];
        mix(&[0, 1], &mut out);
        assert_eq!(out[0], 16294208416658607535);
        assert_eq!(out[1], splitmix64(1));
    }

    #[test]
    fn rendezvous_takes_the_first_largest_weight() {
        let seeds = [3u64, 3, 9];
        let mut out = [0i64; 1];
        rendezvous(&[5], &seeds, &mut out);
        let w = [splitmix64(5 ^ 3), splitmix64(5 ^ 9)];
        assert_eq!(out[0], if w[1] > w[0] { 2 } else { 0 });
    }
}
