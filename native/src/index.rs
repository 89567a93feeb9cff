//! The id -> slot map behind `store/rows/index.py`'s `IdIndex`: open addressing with linear
//! probing over one table of (id, value) entries and a state byte per entry, each call one
//! pass over a whole id array with the GIL released.
//!
//! A key is the pair (tag, id), tag in `0..=MAX_TAG`: one map holds the ids of several tables.
//! The tag lives in the state byte (`FULL + tag`) and moves the probe start, `splitmix64(id ^
//! tag * TAG_MIX)`, so tag 0 is an untagged id. Removal leaves a tombstone; at most half the
//! table is full or tombstoned, so every probe ends at an empty entry.
//!
//! An insert never looks for its keys (callers insert absent ones), so an id given twice in one
//! call, or already present, gets another entry. Of one call's entries for a key, a lookup
//! finds the one given last, a removal frees that one and uncovers the next, and a rehash keeps
//! that order. Each batch computes home positions a few ids ahead of its probes and prefetches
//! them: a table of a million rows is far larger than the caches, and every probe would
//! otherwise wait on memory in turn.

use crate::sketch::splitmix64;

pub const EMPTY: u8 = 0;
pub const TOMB: u8 = 1;
pub const FULL: u8 = 2;
/// The largest tag: a full entry's state, `FULL + tag`, must fit a byte.
pub const MAX_TAG: u8 = u8::MAX - FULL;
const TAG_MIX: u64 = 0xD6E8_FEB8_6659_FD93;
/// How many ids ahead of its probe each batch computes a home position and prefetches it.
const AHEAD: usize = 8;

#[derive(Clone, Copy, Default)]
struct Entry {
    key: u64,
    val: i64,
}

/// The tags of a batch: every id tag 0, or one tag per id.
#[derive(Clone, Copy)]
pub enum Tags<'a> {
    Zero,
    Each(&'a [u8]),
}

impl<'a> Tags<'a> {
    #[inline]
    fn at(self, i: usize) -> u8 {
        match self {
            Tags::Zero => 0,
            Tags::Each(t) => t[i],
        }
    }

    /// The first tag above [`MAX_TAG`], if any.
    pub fn first_bad(self) -> Option<u8> {
        match self {
            Tags::Zero => None,
            Tags::Each(t) => t.iter().copied().find(|&t| t > MAX_TAG),
        }
    }
}

#[inline]
fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(at as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// A table the machine cannot hold (or whose size overflows).
#[derive(Debug)]
pub struct TooLarge;

/// Open-addressing map from (tag, id) to i64. Not thread-safe (the bindings borrow it).
pub struct IdMap {
    entries: Vec<Entry>,
    state: Vec<u8>,
    mask: u64,
    /// Full entries.
    len: usize,
    /// Full entries plus tombstones.
    used: usize,
}

impl IdMap {
    /// A map for `capacity` entries: a power-of-two table at least twice that (and 16).
    pub fn new(capacity: usize) -> Result<IdMap, TooLarge> {
        let mut size = 1usize;
        while size < capacity.max(8).saturating_mul(2) {
            size = size.checked_mul(2).ok_or(TooLarge)?;
        }
        IdMap::with_table(size)
    }

    /// An empty table of `size` entries (a power of two), or [`TooLarge`] where the memory
    /// cannot be had: an error to report, not a reason to abort the process.
    fn with_table(size: usize) -> Result<IdMap, TooLarge> {
        let mut entries = Vec::new();
        entries.try_reserve_exact(size).map_err(|_| TooLarge)?;
        entries.resize(size, Entry::default());
        let mut state = Vec::new();
        state.try_reserve_exact(size).map_err(|_| TooLarge)?;
        state.resize(size, EMPTY);
        Ok(IdMap {
            entries,
            state,
            mask: (size - 1) as u64,
            len: 0,
            used: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Entries in the table (full, tombstoned and empty).
    pub fn table_len(&self) -> usize {
        self.state.len()
    }

    #[inline]
    fn home(&self, id: u64, tag: u8) -> usize {
        home(self.mask, id, tag)
    }

    /// The ids' home positions in `order` (indexes into `ids`), each prefetched [`AHEAD`] ids
    /// before it is yielded. The walk holds no borrow of the map: entries may be written while
    /// it runs, as long as the table is not reallocated.
    fn homes<'a, I: Iterator<Item = usize>>(
        &self,
        ids: &'a [u64],
        tags: Tags<'a>,
        order: I,
    ) -> Homes<'a, I> {
        let mut walk = Homes {
            ids,
            tags,
            mask: self.mask,
            state: self.state.as_ptr(),
            entries: self.entries.as_ptr(),
            order,
            ring: [(0, 0); AHEAD],
            next: 0,
            pending: 0,
        };
        while walk.pending < AHEAD {
            match walk.order.next() {
                Some(i) => {
                    walk.ring[walk.pending] = walk.fetch(i);
                    walk.pending += 1;
                }
                None => break,
            }
        }
        walk
    }

    /// Where (tag, id) sits, probing from `p`.
    #[inline]
    fn find(&self, id: u64, tag: u8, mut p: usize) -> Option<usize> {
        let full = FULL + tag;
        loop {
            let s = self.state[p];
            if s == EMPTY {
                return None;
            }
            if s == full && self.entries[p].key == id {
                return Some(p);
            }
            p = (p + 1) & self.mask as usize;
        }
    }

    /// `out[i]`: the value of (tags[i], ids[i]), -1 where absent.
    pub fn lookup(&self, ids: &[u64], tags: Tags<'_>, out: &mut [i64]) {
        for (i, h) in self.homes(ids, tags, 0..ids.len()) {
            out[i] = match self.find(ids[i], tags.at(i), h) {
                Some(p) => self.entries[p].val,
                None => -1,
            };
        }
    }

    /// Adds an entry per id, at the first free (empty or tombstoned) position from its home,
    /// without looking for one already there. Ids are placed last to first, so of several
    /// entries for one key a lookup finds the last one's first. Where the table must grow first
    /// and cannot, returns [`TooLarge`] having changed nothing.
    pub fn insert(&mut self, ids: &[u64], vals: &[i64], tags: Tags<'_>) -> Result<(), TooLarge> {
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        if (self.used + n).saturating_mul(2) > self.table_len() {
            self.grow(self.len + n)?;
        }
        let mask = self.mask as usize;
        for (i, mut p) in self.homes(ids, tags, (0..n).rev()) {
            while self.state[p] >= FULL {
                p = (p + 1) & mask;
            }
            if self.state[p] == EMPTY {
                self.used += 1;
            }
            self.state[p] = FULL + tags.at(i);
            self.entries[p] = Entry {
                key: ids[i],
                val: vals[i],
            };
        }
        self.len += n;
        Ok(())
    }

    /// `out[i]`: the value (tags[i], ids[i]) had when the call began, -1 where absent; then
    /// tombstones every entry found (an id given twice finds, and frees, the same entry).
    pub fn delete(&mut self, ids: &[u64], tags: Tags<'_>, out: &mut [i64]) {
        let mut found: Vec<usize> = Vec::with_capacity(ids.len());
        for (i, h) in self.homes(ids, tags, 0..ids.len()) {
            out[i] = match self.find(ids[i], tags.at(i), h) {
                Some(p) => {
                    found.push(p);
                    self.entries[p].val
                }
                None => -1,
            };
        }
        for p in found {
            if self.state[p] >= FULL {
                self.state[p] = TOMB;
                self.len -= 1;
            }
        }
    }

    /// Fills `keys` and `vals` (each `len()` long) with every entry's id and value, in table order.
    pub fn items(&self, keys: &mut [u64], vals: &mut [i64]) {
        let full = self.state.iter().enumerate().filter(|(_, &s)| s >= FULL);
        for ((k, v), (p, _)) in keys.iter_mut().zip(vals.iter_mut()).zip(full) {
            *k = self.entries[p].key;
            *v = self.entries[p].val;
        }
    }

    /// Rehashes (dropping tombstones) into a table where `need` entries fill at most a third.
    ///
    /// A third, not a half: the rehash also clears the tombstones that removals leave, and a
    /// table rebuilt exactly at half load would be rebuilt again on the next insert (a tier at
    /// steady size removes and inserts as many rows each step). The old table is read along
    /// its probe chains, starting just after an empty position, so several entries of one key
    /// keep their order.
    fn grow(&mut self, need: usize) -> Result<(), TooLarge> {
        let mut size = self.table_len();
        while need.saturating_mul(3) > size {
            size = size.checked_mul(2).ok_or(TooLarge)?;
        }
        let old = std::mem::replace(self, IdMap::with_table(size)?);
        let old_len = old.table_len();
        let start = old.state.iter().position(|&s| s == EMPTY).unwrap_or(0);
        let mask = self.mask as usize;
        for k in 1..=old_len {
            let p = (start + k) % old_len;
            let s = old.state[p];
            if s < FULL {
                continue;
            }
            let e = old.entries[p];
            let mut q = self.home(e.key, s - FULL);
            while self.state[q] != EMPTY {
                q = (q + 1) & mask;
            }
            self.state[q] = s;
            self.entries[q] = e;
        }
        self.len = old.len;
        self.used = old.len;
        Ok(())
    }
}

#[inline]
fn home(mask: u64, id: u64, tag: u8) -> usize {
    (splitmix64(id ^ (tag as u64).wrapping_mul(TAG_MIX)) & mask) as usize
}

/// The walk of [`IdMap::homes`]: `(i, home of ids[i])`, the next [`AHEAD`] already prefetched.
struct Homes<'a, I> {
    ids: &'a [u64],
    tags: Tags<'a>,
    mask: u64,
    state: *const u8,
    entries: *const Entry,
    order: I,
    ring: [(usize, usize); AHEAD],
    next: usize,
    pending: usize,
}

impl<'a, I: Iterator<Item = usize>> Homes<'a, I> {
    #[inline]
    fn fetch(&self, i: usize) -> (usize, usize) {
        let h = home(self.mask, self.ids[i], self.tags.at(i));
        prefetch(self.state.wrapping_add(h));
        prefetch(self.entries.wrapping_add(h));
        (i, h)
    }
}

impl<'a, I: Iterator<Item = usize>> Iterator for Homes<'a, I> {
    type Item = (usize, usize);

    #[inline]
    fn next(&mut self) -> Option<(usize, usize)> {
        if self.pending == 0 {
            return None;
        }
        let at = self.next;
        let got = self.ring[at];
        match self.order.next() {
            Some(j) => self.ring[at] = self.fetch(j),
            None => self.pending -= 1,
        }
        self.next = (at + 1) % AHEAD;
        Some(got)
    }
}

// pyo3 0.22's #[pymethods] expands to an `.into()` that newer clippy flags (see lib.rs).
#[allow(clippy::useless_conversion)]
pub mod bindings {
    use super::{Tags, MAX_TAG};
    use crate::hashing::buffers::{bad, disjoint, input, output, slice, slice_mut, span};
    use pyo3::buffer::PyBuffer;
    use pyo3::exceptions::PyMemoryError;
    use pyo3::prelude::*;

    /// The tags argument: None (every id tag 0) or a uint8 buffer with one per id, each at
    /// most ``MAX_TAG``.
    fn tag_buffer(
        tags: Option<&Bound<'_, PyAny>>,
        func: &str,
        n: usize,
    ) -> PyResult<Option<PyBuffer<u8>>> {
        let t = match tags {
            Some(t) if !t.is_none() => t,
            _ => return Ok(None),
        };
        let buf = input::<u8>(t, func, "tags", "uint8")?;
        if buf.item_count() != n {
            return Err(bad(format!("{} tags for {} ids", buf.item_count(), n)));
        }
        Ok(Some(buf))
    }

    fn tags_of<'a>(buf: &'a Option<PyBuffer<u8>>) -> Tags<'a> {
        match buf {
            // SAFETY: from `tag_buffer` (checked, held by the caller until it returns).
            Some(b) => Tags::Each(unsafe { slice(b) }),
            None => Tags::Zero,
        }
    }

    fn too_large(entries: usize) -> PyErr {
        PyMemoryError::new_err(format!(
            "IdMap: no memory for a table holding {} ids",
            entries
        ))
    }

    fn check_tags(tags: Tags<'_>) -> PyResult<()> {
        match tags.first_bad() {
            Some(_) => Err(bad(format!("tags must be in [0, {}]", MAX_TAG))),
            None => Ok(()),
        }
    }

    /// A map from uint64 id, or (tag, id) with tag a uint8 in ``[0, MAX_TAG]``, to int64, for
    /// whole id arrays at a time; each call releases the GIL while it runs. Not thread-safe:
    /// a call from another thread while one runs raises (the object is borrowed).
    ///
    /// Arrays are C-contiguous buffers: ids uint64, values int64, tags uint8 (or None: every id
    /// tag 0); outputs are writable int64 buffers, one item per id, sharing no memory with the
    /// inputs. A bad buffer or tag raises ValueError before the map changes.
    #[pyclass(module = "kelp_native")]
    pub struct IdMap {
        map: super::IdMap,
    }

    #[pymethods]
    impl IdMap {
        #[new]
        #[pyo3(signature = (capacity = 1024))]
        fn new(capacity: i64) -> PyResult<IdMap> {
            let map = super::IdMap::new(capacity.max(0) as usize)
                .map_err(|_| too_large(capacity.max(0) as usize))?;
            Ok(IdMap { map })
        }

        fn __len__(&self) -> usize {
            self.map.len()
        }

        /// Entries in the hash table (full, tombstoned or empty): grows as the map does.
        #[getter]
        fn table_len(&self) -> usize {
            self.map.table_len()
        }

        /// Writes into ``out`` each (tag, id)'s value, -1 where absent.
        #[pyo3(signature = (ids, tags, out))]
        fn lookup(
            &self,
            py: Python<'_>,
            ids: &Bound<'_, PyAny>,
            tags: Option<&Bound<'_, PyAny>>,
            out: &Bound<'_, PyAny>,
        ) -> PyResult<()> {
            let idb = input::<u64>(ids, "IdMap.lookup", "ids", "uint64")?;
            let n = idb.item_count();
            let tagb = tag_buffer(tags, "IdMap.lookup", n)?;
            let outb = output::<i64>(out, "IdMap.lookup", "out", "int64", n)?;
            let mut read = vec![span(&idb)];
            read.extend(tagb.as_ref().map(span));
            disjoint("IdMap.lookup", "out", span(&outb), &read)?;
            let tv = tags_of(&tagb);
            check_tags(tv)?;
            // SAFETY: the buffers are checked and held until the end of this function; `out`
            // is disjoint from everything read.
            let (idv, res) = unsafe { (slice(&idb), slice_mut(&outb)) };
            let map = &self.map;
            py.allow_threads(|| map.lookup(idv, tv, res));
            Ok(())
        }

        /// Adds an entry per id with its value from ``vals`` (int64, one per id), without looking
        /// for one already there: callers insert only absent keys, each once.
        #[pyo3(signature = (ids, vals, tags))]
        fn insert(
            &mut self,
            py: Python<'_>,
            ids: &Bound<'_, PyAny>,
            vals: &Bound<'_, PyAny>,
            tags: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<()> {
            let idb = input::<u64>(ids, "IdMap.insert", "ids", "uint64")?;
            let n = idb.item_count();
            let valb = input::<i64>(vals, "IdMap.insert", "vals", "int64")?;
            if valb.item_count() != n {
                return Err(bad(format!(
                    "IdMap.insert: {} vals for {} ids",
                    valb.item_count(),
                    n
                )));
            }
            let tagb = tag_buffer(tags, "IdMap.insert", n)?;
            let tv = tags_of(&tagb);
            check_tags(tv)?;
            // SAFETY: the buffers are checked and held until the end of this function; the map
            // owns its own memory, so nothing written overlaps them.
            let (idv, valv) = unsafe { (slice(&idb), slice(&valb)) };
            let map = &mut self.map;
            let need = map.len() + n;
            py.allow_threads(|| map.insert(idv, valv, tv))
                .map_err(|_| too_large(need))
        }

        /// Writes into ``out`` the value each (tag, id) had, -1 where absent, and removes them.
        #[pyo3(signature = (ids, tags, out))]
        fn delete(
            &mut self,
            py: Python<'_>,
            ids: &Bound<'_, PyAny>,
            tags: Option<&Bound<'_, PyAny>>,
            out: &Bound<'_, PyAny>,
        ) -> PyResult<()> {
            let idb = input::<u64>(ids, "IdMap.delete", "ids", "uint64")?;
            let n = idb.item_count();
            let tagb = tag_buffer(tags, "IdMap.delete", n)?;
            let outb = output::<i64>(out, "IdMap.delete", "out", "int64", n)?;
            let mut read = vec![span(&idb)];
            read.extend(tagb.as_ref().map(span));
            disjoint("IdMap.delete", "out", span(&outb), &read)?;
            let tv = tags_of(&tagb);
            check_tags(tv)?;
            // SAFETY: as in `lookup`.
            let (idv, res) = unsafe { (slice(&idb), slice_mut(&outb)) };
            let map = &mut self.map;
            py.allow_threads(|| map.delete(idv, tv, res));
            Ok(())
        }

        /// Fills ``keys`` (uint64) and ``vals`` (int64), each ``len(map)`` long, with every
        /// entry's id and value, in table order.
        #[pyo3(signature = (keys, vals))]
        fn items(
            &self,
            py: Python<'_>,
            keys: &Bound<'_, PyAny>,
            vals: &Bound<'_, PyAny>,
        ) -> PyResult<()> {
            let n = self.map.len();
            let keyb = output::<u64>(keys, "IdMap.items", "keys", "uint64", n)?;
            let valb = output::<i64>(vals, "IdMap.items", "vals", "int64", n)?;
            disjoint("IdMap.items", "vals", span(&valb), &[span(&keyb)])?;
            // SAFETY: both checked, writable, held until the end and disjoint.
            let (kv, vv) = unsafe { (slice_mut(&keyb), slice_mut(&valb)) };
            let map = &self.map;
            py.allow_threads(|| map.items(kv, vv));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(map: &IdMap, ids: &[u64], tags: Tags<'_>) -> Vec<i64> {
        let mut out = vec![0; ids.len()];
        map.lookup(ids, tags, &mut out);
        out
    }

    #[test]
    fn tags_keep_keys_apart_and_tag_zero_is_untagged() {
        let mut map = IdMap::new(4).unwrap();
        map.insert(&[7, 7], &[0, 1], Tags::Each(&[0, 3])).unwrap();
        assert_eq!(lookup(&map, &[7, 7, 7], Tags::Each(&[3, 0, 1])), [1, 0, -1]);
        assert_eq!(lookup(&map, &[7], Tags::Zero), [0]);
    }

    #[test]
    fn grows_and_drops_tombstones() {
        let mut map = IdMap::new(8).unwrap();
        let ids: Vec<u64> = (0..1000).collect();
        let vals: Vec<i64> = (0..1000).collect();
        map.insert(&ids, &vals, Tags::Zero).unwrap();
        assert_eq!(map.len(), 1000);
        assert!(map.table_len() >= 3000);
        let mut out = vec![0; 500];
        map.delete(&ids[..500], Tags::Zero, &mut out);
        assert_eq!(out, vals[..500]);
        assert_eq!(map.len(), 500);
        assert_eq!(lookup(&map, &ids, Tags::Zero)[499..501], [-1, 500]);
    }

    #[test]
    fn the_last_of_several_entries_for_one_key_is_found_first() {
        let mut map = IdMap::new(8).unwrap();
        map.insert(&[5, 5, 5], &[1, 2, 3], Tags::Zero).unwrap();
        assert_eq!(lookup(&map, &[5], Tags::Zero), [3]);
        let mut out = [0; 2];
        map.delete(&[5, 5], Tags::Zero, &mut out);
        assert_eq!(out, [3, 3]);
        assert_eq!(lookup(&map, &[5], Tags::Zero), [2]);
        map.grow(100).unwrap();
        assert_eq!(lookup(&map, &[5], Tags::Zero), [2]);
    }
}
