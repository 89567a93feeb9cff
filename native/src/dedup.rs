//! Per-column dedup for `consumers/batch.py` (`dedup_ids`, `dedup_many`): each column's sorted
//! unique ids and, per id, its position among them, as `np.unique(ids, return_inverse=True)`
//! gives, for every column of a batch in one call with the GIL released.
//!
//! A hash table (in cache for a batch-sized column) gives each distinct id a number in order
//! of first sight; only the distinct ids are then sorted (a bucket sort, linear for hashed ids),
//! and the numbers are mapped to ranks. A column with many repeats sorts far fewer values than
//! it holds.

/// Reused scratch space, so that the columns of one call allocate once.
#[derive(Default)]
pub struct Dedup {
    /// Open-addressing table: 0 for empty, else 1 + the number of the id stored there.
    table: Vec<u32>,
    /// The distinct ids, in order of first sight.
    seen: Vec<u64>,
    /// `rank[number]`: that id's position among the sorted distinct ids.
    rank: Vec<i64>,
    /// `(id, number)` of each distinct id, ordered by id.
    sorted: Vec<(u64, u32)>,
    /// Bucket bounds of the bucket sort.
    starts: Vec<u32>,
}

/// Table position of `id` among `bits`-bit positions: a multiplicative hash of the id folded
/// onto itself, so that ids differing only in their high or only in their low bits spread.
#[inline]
fn slot(id: u64, bits: u32) -> usize {
    let x = id ^ (id >> 32);
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

impl Dedup {
    /// Writes `ids`' sorted distinct values to the front of `uniques` and each id's position
    /// among them to `inverse` (as long as `ids`); returns how many are distinct.
    pub fn column(&mut self, ids: &[u64], uniques: &mut [u64], inverse: &mut [i64]) -> usize {
        let n = ids.len();
        if n == 0 {
            return 0;
        }
        assert!(
            n < u32::MAX as usize,
            "dedup: a column of 2**32 ids or more"
        );
        let mut bits = 1u32;
        while (1usize << bits) < n.saturating_mul(2) {
            bits += 1;
        }
        let size = 1usize << bits;
        let mask = size - 1;
        self.table.clear();
        self.table.resize(size, 0);
        self.seen.clear();
        for (&id, inv) in ids.iter().zip(inverse.iter_mut()) {
            let mut p = slot(id, bits);
            loop {
                let c = self.table[p];
                if c == 0 {
                    self.table[p] = self.seen.len() as u32 + 1;
                    *inv = self.seen.len() as i64;
                    self.seen.push(id);
                    break;
                }
                if self.seen[(c - 1) as usize] == id {
                    *inv = (c - 1) as i64;
                    break;
                }
                p = (p + 1) & mask;
            }
        }
        let u = self.seen.len();
        self.sort_seen();
        self.rank.clear();
        self.rank.resize(u, 0);
        for (r, &(id, number)) in self.sorted.iter().enumerate() {
            self.rank[number as usize] = r as i64;
            uniques[r] = id;
        }
        for inv in inverse[..n].iter_mut() {
            *inv = self.rank[*inv as usize];
        }
        u
    }

    /// Fills `sorted` with `(id, number)` for every distinct id, ordered by id.
    ///
    /// A bucket sort on the id's offset from the smallest, by its top bits, with about one
    /// bucket per id: hashed ids spread evenly, so buckets hold one id or a few and the pass is
    /// linear; ids packed into a narrow part of their range share a bucket, which a comparison
    /// sort then orders, so no spread of ids costs more than sorting them outright.
    fn sort_seen(&mut self) {
        let u = self.seen.len();
        self.sorted.clear();
        if u <= SMALL {
            self.sorted
                .extend(self.seen.iter().enumerate().map(|(c, &id)| (id, c as u32)));
            self.sorted.sort_unstable_by_key(|p| p.0);
            return;
        }
        let (lo, hi) = self
            .seen
            .iter()
            .fold((u64::MAX, 0u64), |(lo, hi), &id| (lo.min(id), hi.max(id)));
        let mut bits = 0u32;
        while (1usize << bits) < u {
            bits += 1;
        }
        let span_bits = 64 - (hi - lo).leading_zeros();
        let shift = span_bits.saturating_sub(bits);
        let bucket = |id: u64| ((id - lo) >> shift) as usize;
        self.starts.clear();
        self.starts.resize((1usize << bits) + 1, 0);
        for &id in &self.seen {
            self.starts[bucket(id) + 1] += 1;
        }
        for b in 1..self.starts.len() {
            self.starts[b] += self.starts[b - 1];
        }
        self.sorted.resize(u, (0, 0));
        for (c, &id) in self.seen.iter().enumerate() {
            let at = &mut self.starts[bucket(id)];
            self.sorted[*at as usize] = (id, c as u32);
            *at += 1;
        }
        // Each bucket's start moved to its end, which is the next one's start.
        let mut from = 0usize;
        for b in 0..self.starts.len() - 1 {
            let to = self.starts[b] as usize;
            if to - from > 1 {
                let run = &mut self.sorted[from..to];
                if run.len() <= SMALL {
                    insertion_sort(run);
                } else {
                    run.sort_unstable_by_key(|p| p.0);
                }
            }
            from = to;
        }
    }
}

/// Buckets this small are sorted by insertion; columns with this few distinct ids skip the buckets.
const SMALL: usize = 16;

fn insertion_sort(run: &mut [(u64, u32)]) {
    for i in 1..run.len() {
        let item = run[i];
        let mut j = i;
        while j > 0 && run[j - 1].0 > item.0 {
            run[j] = run[j - 1];
            j -= 1;
        }
        run[j] = item;
    }
}

/// Dedups each column on its own: column `c`'s distinct ids go to `uniques` after those of the
/// columns before it, its inverse to `inverse` at the same offset as the column's ids in all
/// the ids. `uniques` and `inverse` hold as many items as all columns together. Returns how
/// many distinct ids each column has.
pub fn columns(cols: &[&[u64]], uniques: &mut [u64], inverse: &mut [i64]) -> Vec<usize> {
    let mut work = Dedup::default();
    let mut counts = Vec::with_capacity(cols.len());
    let (mut u, mut at) = (0, 0);
    for col in cols {
        let n = col.len();
        let c = work.column(col, &mut uniques[u..], &mut inverse[at..at + n]);
        counts.push(c);
        u += c;
        at += n;
    }
    counts
}

// pyo3 0.22's #[pyfunction] expands to an `.into()` that newer clippy flags (see lib.rs).
#[allow(clippy::useless_conversion)]
pub mod bindings {
    use crate::hashing::buffers::{bad, disjoint, input, output, slice, slice_mut, span};
    use pyo3::buffer::PyBuffer;
    use pyo3::prelude::*;

    /// Dedups each of ``columns`` (C-contiguous uint64 buffers, any shape, read flat) on its
    /// own, as ``np.unique(column, return_inverse=True)``. Column ``c``'s sorted distinct ids are
    /// written to ``uniques`` right after those of the columns before it, and its inverse (int64
    /// positions among its own distinct ids) to ``inverse`` at the offset its ids have in all the
    /// columns laid end to end. ``uniques`` (uint64) and ``inverse`` (int64) are writable,
    /// C-contiguous and hold as many items as all columns together. Returns each column's
    /// number of distinct ids. The GIL is released while it runs.
    #[pyfunction]
    #[pyo3(signature = (columns, uniques, inverse))]
    pub fn dedup_columns(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        uniques: &Bound<'_, PyAny>,
        inverse: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<usize>> {
        let bufs = columns
            .iter()
            .map(|c| input::<u64>(c, "dedup_columns", "each column", "uint64"))
            .collect::<PyResult<Vec<PyBuffer<u64>>>>()?;
        if let Some(b) = bufs.iter().find(|b| b.item_count() >= u32::MAX as usize) {
            return Err(bad(format!(
                "dedup_columns: a column of {} ids (at most 2**32 - 2)",
                b.item_count()
            )));
        }
        let total: usize = bufs.iter().map(|b| b.item_count()).sum();
        let ub = output::<u64>(uniques, "dedup_columns", "uniques", "uint64", total)?;
        let ib = output::<i64>(inverse, "dedup_columns", "inverse", "int64", total)?;
        let read: Vec<(usize, usize)> = bufs.iter().map(span).collect();
        disjoint("dedup_columns", "uniques", span(&ub), &read)?;
        disjoint("dedup_columns", "inverse", span(&ib), &read)?;
        disjoint("dedup_columns", "inverse", span(&ib), &[span(&ub)])?;
        // SAFETY: every buffer is checked and held until the end of this function; the two
        // outputs are disjoint from each other and from every column.
        let cols: Vec<&[u64]> = bufs.iter().map(|b| unsafe { slice(b) }).collect();
        let (uv, iv) = unsafe { (slice_mut(&ub), slice_mut(&ib)) };
        Ok(py.allow_threads(|| super::columns(&cols, uv, iv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_uniques_and_inverse_per_column() {
        let a = [7u64, 9, 7, 7, 5, 9, 9, 4];
        let b = [u64::MAX, 0, u64::MAX];
        let mut uniques = [0u64; 11];
        let mut inverse = [0i64; 11];
        let counts = columns(&[&a, &[], &b], &mut uniques, &mut inverse);
        assert_eq!(counts, [4, 0, 2]);
        assert_eq!(uniques[..6], [4, 5, 7, 9, 0, u64::MAX]);
        assert_eq!(inverse, [2, 3, 2, 2, 1, 3, 3, 0, 1, 0, 1]);
    }

    #[test]
    fn ids_apart_only_in_high_bits_are_told_apart() {
        let ids: Vec<u64> = (0..64u64).rev().map(|j| j << 58).collect();
        let mut uniques = vec![0u64; 64];
        let mut inverse = vec![0i64; 64];
        assert_eq!(columns(&[&ids], &mut uniques, &mut inverse), [64]);
        assert_eq!(inverse, (0..64i64).rev().collect::<Vec<_>>());
    }

    /// The plain meaning: sorted distinct ids, and each id's index among them.
    fn reference(ids: &[u64]) -> (Vec<u64>, Vec<i64>) {
        let mut u = ids.to_vec();
        u.sort_unstable();
        u.dedup();
        let inv = ids
            .iter()
            .map(|id| u.binary_search(id).unwrap() as i64)
            .collect();
        (u, inv)
    }

    #[test]
    fn clusters_outliers_and_wide_spreads_sort_exactly() {
        let mut x = 99u64;
        let mut next = || {
            x = crate::sketch::splitmix64(x);
            x
        };
        let hashed: Vec<u64> = (0..3000).map(|_| next()).collect();
        let clusters: Vec<u64> = (0..3000)
            .map(|_| ((next() % 256) << 32) | (next() % 8))
            .collect();
        let mut outlier: Vec<u64> = (0..2000).rev().collect();
        outlier.push(u64::MAX);
        let repeats: Vec<u64> = (0..3000).map(|i| hashed[i % 40]).collect();
        for ids in [hashed, clusters, outlier, repeats] {
            let mut uniques = vec![0u64; ids.len()];
            let mut inverse = vec![0i64; ids.len()];
            let counts = columns(&[&ids], &mut uniques, &mut inverse);
            let (u, inv) = reference(&ids);
            assert_eq!(counts, [u.len()]);
            assert_eq!(uniques[..u.len()], u[..]);
            assert_eq!(inverse, inv);
        }
    }
}
