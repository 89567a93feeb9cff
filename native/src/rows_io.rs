//! Row replies decoded straight into caller-owned buffers, and per-row commands encoded straight
//! from them (`store/redis/_wire/row_replies.py`, `store/redis/_wire/packing.py`).
//!
//! A training pull reads tens of thousands of rows and a write-back writes as many, each row a
//! fixed-width value. Done in numpy, a read kept a Python bytes object of offsets per scan and
//! then gathered the values out of the receive buffer; a write filled a structured array column
//! by column (one strided pass per argument) and copied it into bytes. Here each is one pass
//! over the rows with the GIL released: the reader copies every value into its place in a
//! preallocated array as it finds the record, and the writer lays out each command in turn.

use std::mem::MaybeUninit;

pub const NIL2: &[u8] = b"$-1\r\n";
pub const NIL3: &[u8] = b"_\r\n";
pub const CRLF: &[u8] = b"\r\n";

/// Where a scan stopped: the first byte not taken, records taken, and whether the bytes there are
/// no record of this kind (a foreign reply) rather than a record not all received yet.
#[derive(Debug, PartialEq, Eq)]
pub struct Stop {
    pub cursor: usize,
    pub taken: usize,
    pub foreign: bool,
}

/// Walks whole records chaining from `cursor` in `received`, at most `limit`: each one `$-1\r\n`,
/// `_\r\n` or `header` followed by `width` bytes and CRLF. Calls `each(None)` for a nil and
/// `each(Some(start))` for a value whose bytes start at `start` in `received`.
///
/// Stops without calling it foreign at a record not all received yet, including a head that may
/// still become a record once more bytes arrive: `_` alone, `$` with fewer bytes than the longer
/// of a nil's and a value's head. The scan jumps from record to record, so a `$` inside a value
/// is never looked at.
pub fn walk_records<F: FnMut(Option<usize>)>(
    received: &[u8],
    mut cursor: usize,
    limit: usize,
    header: &[u8],
    width: usize,
    mut each: F,
) -> Stop {
    let record = header
        .len()
        .saturating_add(width)
        .saturating_add(CRLF.len());
    let head = NIL2.len().max(header.len());
    let mut taken = 0usize;
    let mut foreign = false;
    while taken < limit && cursor < received.len() {
        let room = &received[cursor..];
        if room[0] == b'_' {
            if room.len() < NIL3.len() {
                break;
            }
            if !room.starts_with(NIL3) {
                foreign = true;
                break;
            }
            each(None);
            cursor += NIL3.len();
        } else if room[0] == b'$' {
            if room.starts_with(NIL2) {
                each(None);
                cursor += NIL2.len();
            } else if room.starts_with(header) {
                if room.len() < record {
                    break;
                }
                if &room[record - CRLF.len()..record] != CRLF {
                    foreign = true;
                    break;
                }
                each(Some(cursor + header.len()));
                cursor += record;
            } else {
                foreign = room.len() >= head;
                break;
            }
        } else {
            foreign = true;
            break;
        }
        taken += 1;
    }
    Stop {
        cursor,
        taken,
        foreign,
    }
}

/// The RESP head of a `width`-byte bulk string: `$<width>\r\n`.
pub fn bulk_head(width: usize) -> Vec<u8> {
    format!("${}\r\n", width).into_bytes()
}

/// [`walk_records`] that writes each record's flag into `present` (1: a value, 0: nil) from
/// position 0 and each value's bytes into `values` (rows of `width` bytes) from row 0, in reply
/// order. Returns where it stopped and how many values it copied. `present` must have room for
/// `limit` flags and `values` for `limit` rows.
pub fn take_into(
    received: &[u8],
    cursor: usize,
    limit: usize,
    width: usize,
    present: &mut [u8],
    values: &mut [u8],
) -> (Stop, usize) {
    let header = bulk_head(width);
    let mut flags = present.iter_mut();
    let mut rows = values.chunks_exact_mut(width.max(1));
    let mut stored = 0usize;
    let stop = walk_records(received, cursor, limit, &header, width, |value| {
        if let Some(flag) = flags.next() {
            *flag = value.is_some() as u8;
        }
        if let Some(start) = value {
            if width > 0 {
                if let Some(row) = rows.next() {
                    row.copy_from_slice(&received[start..start + width]);
                }
            }
            stored += 1;
        }
    });
    (stop, stored)
}

/// One argument column of fixed-width values: `width` bytes per row, back to back.
pub struct Column<'a> {
    pub bytes: &'a [u8],
    pub width: usize,
}

/// The bytes of one command per row: `head` (the array header and the constant words), then per
/// column a bulk string of the row's value, for the rows `rows` names (all rows, in order, when
/// `None`): the bytes numpy's structured records of the same columns hold.
///
/// `out` may be uninitialised memory (a new Python bytes object, filled off the GIL without
/// being zeroed first): every byte of it is written, none is read. It must hold exactly
/// [`record_len`] times the rows taken; a shorter one panics before anything is written past it.
pub fn pack_into(
    head: &[u8],
    columns: &[Column<'_>],
    heads: &[Vec<u8>],
    rows: Rows<'_>,
    out: &mut [MaybeUninit<u8>],
) {
    let mut at = 0usize;
    let mut put = |bytes: &[u8], at: &mut usize| {
        let to = &mut out[*at..*at + bytes.len()];
        // SAFETY: `to` is a bounds-checked slice of `bytes.len()` writable bytes, and `bytes` cannot
        // overlap it (a column or constant is read-only input, `out` a fresh buffer).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), to.as_mut_ptr() as *mut u8, bytes.len())
        };
        *at += bytes.len();
    };
    let mut one = |r: usize, at: &mut usize| {
        put(head, at);
        for (c, h) in columns.iter().zip(heads) {
            put(h, at);
            put(&c.bytes[r * c.width..(r + 1) * c.width], at);
            put(CRLF, at);
        }
    };
    match rows {
        Rows::All(n) => (0..n).for_each(|r| one(r, &mut at)),
        Rows::Picked(picked) => picked.iter().for_each(|&r| one(r as usize, &mut at)),
    }
}

/// Which rows a pack takes: the first `n` in order, or the ones named.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    All(usize),
    Picked(&'a [i64]),
}

/// The length of one packed record: `head`, and per column its bulk head, value and CRLF.
pub fn record_len(head: &[u8], columns: &[Column<'_>], heads: &[Vec<u8>]) -> usize {
    head.len()
        + columns
            .iter()
            .zip(heads)
            .map(|(c, h)| h.len() + c.width + CRLF.len())
            .sum::<usize>()
}

/// The most digits an integer reply taken by [`take_ints`] may have: longer ones (never an `HSET`
/// count) are left to the caller's general reader, and 18 digits always fit an i64.
pub const MAX_INT_DIGITS: usize = 18;

/// Integer replies `:<digits>\r\n` (1 to [`MAX_INT_DIGITS`] digits) chaining from `cursor` in
/// `received`, at most `limit` and at most `out.len()`, each value written to `out` in turn.
///
/// Stops at the first line that is no such reply (`foreign`: an error, another type, a sign or a
/// longer number, handed on as a whole) and, without calling it foreign, at a line not all
/// received yet.
pub fn take_ints(received: &[u8], mut cursor: usize, limit: usize, out: &mut [i64]) -> Stop {
    let mut taken = 0usize;
    let mut foreign = false;
    while taken < limit && taken < out.len() && cursor < received.len() {
        let room = &received[cursor..];
        let lf = match room.iter().position(|&b| b == b'\n') {
            Some(at) => at,
            None => break,
        };
        let line = &room[..=lf];
        let valid = line.len() >= 4
            && line.len() - 3 <= MAX_INT_DIGITS
            && line[0] == b':'
            && line[lf - 1] == b'\r'
            && line[1..lf - 1].iter().all(u8::is_ascii_digit);
        if !valid {
            foreign = true;
            break;
        }
        out[taken] = line[1..lf - 1]
            .iter()
            .fold(0i64, |v, &d| v * 10 + i64::from(d - b'0'));
        taken += 1;
        cursor += lf + 1;
    }
    Stop {
        cursor,
        taken,
        foreign,
    }
}

// pyo3 0.22's #[pyfunction] expands to an `.into()` on the error type that newer clippy flags;
// the crate stays on 0.22 for rustc 1.63 (Debian 12), so the lint is silenced for the bindings.
#[allow(clippy::useless_conversion)]
pub mod bindings {
    use super::{bulk_head, pack_into, record_len, take_into, take_ints, Column, Rows};
    use crate::hashing::buffers::{bad, disjoint, input, slice, slice_mut, span};
    use pyo3::buffer::PyBuffer;
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList};
    use std::mem::MaybeUninit;

    const TAKE: &str = "take_rows_into";
    const PACK: &str = "pack_rows";

    /// Walks the Redis replies in ``buf[:got]`` from ``cursor`` on, at most ``limit`` records, each
    /// a nil (``$-1\r\n`` or ``_\r\n``) or ``$<width>\r\n<width bytes>\r\n``, and writes each
    /// record's flag into ``present[taken]`` onwards (uint8: 1 a value, 0 nil) and each value's
    /// bytes into row ``stored`` onwards of ``values`` (uint8, ``width`` bytes a row).
    /// Returns the new cursor, the records and the values taken, and whether the scan stopped at
    /// a foreign reply (an error, another type or width). The GIL is released while it runs.
    #[pyfunction]
    #[pyo3(signature = (buf, cursor, got, limit, width, present, values, taken, stored))]
    #[allow(clippy::too_many_arguments)]
    pub fn take_rows_into(
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        cursor: usize,
        got: usize,
        limit: usize,
        width: usize,
        present: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        taken: usize,
        stored: usize,
    ) -> PyResult<(usize, usize, usize, bool)> {
        let received = input::<u8>(buf, TAKE, "buf", "uint8")?;
        if got > received.item_count() || cursor > got {
            return Err(bad(format!(
                "{}: need cursor <= got <= len(buf), got cursor={} got={} len={}",
                TAKE,
                cursor,
                got,
                received.item_count()
            )));
        }
        let flags = writable(present, "present")?;
        let rows = writable(values, "values")?;
        let room = flags.item_count().saturating_sub(taken);
        let row_room = rows
            .item_count()
            .checked_div(width)
            .map_or(usize::MAX, |r| r.saturating_sub(stored));
        if taken > flags.item_count() || limit > room || limit > row_room {
            return Err(bad(format!(
                "{}: present has room for {} flags from {} and values for {} rows of {} bytes from {}; \
                 limit {} does not fit",
                TAKE,
                flags.item_count(),
                taken,
                rows.item_count() / width.max(1),
                width,
                stored,
                limit
            )));
        }
        disjoint(
            TAKE,
            "present",
            span(&flags),
            &[span(&received), span(&rows)],
        )?;
        disjoint(TAKE, "values", span(&rows), &[span(&received)])?;
        // SAFETY: the buffers were checked C-contiguous, of bytes, the outputs writable and sharing
        // no memory with each other or the input; each PyBuffer keeps its exporter's memory alive
        // and unresized until dropped at the end of this function. The caller owns the arrays and
        // does not touch them from another thread meanwhile.
        let (received, flags, rows) =
            unsafe { (slice(&received), slice_mut(&flags), slice_mut(&rows)) };
        let received = &received[..got];
        let flags = &mut flags[taken..];
        let from = stored.saturating_mul(width).min(rows.len());
        let rows = &mut rows[from..];
        let (stop, copied) =
            py.allow_threads(|| take_into(received, cursor, limit, width, flags, rows));
        Ok((stop.cursor, stop.taken, copied, stop.foreign))
    }

    const INTS: &str = "take_ints_into";

    /// Walks the integer replies (``:<digits>\r\n``, as ``HSET`` answers) in ``buf[:got]`` from
    /// ``cursor`` on, at most ``limit``, writing each value into ``out`` (int64, room for
    /// ``limit``). Returns the new cursor, how many were taken, and whether the scan stopped at a
    /// line that is no such reply. The GIL is released while it runs.
    #[pyfunction]
    #[pyo3(signature = (buf, cursor, got, limit, out))]
    pub fn take_ints_into(
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        cursor: usize,
        got: usize,
        limit: usize,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<(usize, usize, bool)> {
        let received = input::<u8>(buf, INTS, "buf", "uint8")?;
        if got > received.item_count() || cursor > got {
            return Err(bad(format!(
                "{}: need cursor <= got <= len(buf), got cursor={} got={} len={}",
                INTS,
                cursor,
                got,
                received.item_count()
            )));
        }
        let values = input::<i64>(out, INTS, "out", "int64")?;
        if values.readonly() {
            return Err(bad(format!("{}: out must be writable", INTS)));
        }
        if limit > values.item_count() {
            return Err(bad(format!(
                "{}: out has room for {} values; limit {} does not fit",
                INTS,
                values.item_count(),
                limit
            )));
        }
        disjoint(INTS, "out", span(&values), &[span(&received)])?;
        // SAFETY: both buffers were checked C-contiguous of their element type, `out` writable
        // and sharing no memory with `buf`; each PyBuffer keeps its exporter's memory alive and
        // unresized until dropped at the end of this function. The caller owns `out` and does not
        // touch it from another thread meanwhile.
        let (received, values) = unsafe { (slice(&received), slice_mut(&values)) };
        let received = &received[..got];
        let stop = py.allow_threads(|| take_ints(received, cursor, limit, values));
        Ok((stop.cursor, stop.taken, stop.foreign))
    }

    fn writable(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBuffer<u8>> {
        let buf = input::<u8>(obj, TAKE, what, "uint8")?;
        if buf.readonly() {
            return Err(bad(format!("{}: {} must be writable", TAKE, what)));
        }
        Ok(buf)
    }

    /// One command per row as RESP bytes: ``head`` (the array header and the constant words),
    /// then per column a bulk string of that row's ``widths[i]`` bytes. ``columns``: C-contiguous
    /// uint8 buffers of ``n * widths[i]`` bytes each (``n`` rows); ``rows``: an int64 buffer of
    /// the rows to take, in that order, or None for all ``n`` in order. The GIL is released while
    /// the bytes are laid out.
    #[pyfunction]
    #[pyo3(signature = (head, columns, widths, n, rows=None))]
    pub fn pack_rows<'py>(
        py: Python<'py>,
        head: &[u8],
        columns: &Bound<'py, PyList>,
        widths: Vec<usize>,
        n: usize,
        rows: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if columns.len() != widths.len() {
            return Err(bad(format!(
                "{}: {} columns for {} widths",
                PACK,
                columns.len(),
                widths.len()
            )));
        }
        let mut held = Vec::with_capacity(widths.len());
        for (i, (col, &w)) in columns.iter().zip(&widths).enumerate() {
            let b = input::<u8>(&col, PACK, &format!("columns[{}]", i), "uint8")?;
            if b.item_count() != n.saturating_mul(w) {
                return Err(bad(format!(
                    "{}: columns[{}] has {} bytes, needs {} ({} rows of {})",
                    PACK,
                    i,
                    b.item_count(),
                    n.saturating_mul(w),
                    n,
                    w
                )));
            }
            held.push(b);
        }
        let picked = match rows {
            None => None,
            Some(r) => Some(input::<i64>(r, PACK, "rows", "int64")?),
        };
        // SAFETY: checked C-contiguous buffers of their element type, alive and unresized until
        // dropped at the end of this function; only read.
        let cols: Vec<Column<'_>> = held
            .iter()
            .zip(&widths)
            .map(|(b, &w)| Column {
                bytes: unsafe { slice(b) },
                width: w,
            })
            .collect();
        let which = match &picked {
            None => Rows::All(n),
            Some(p) => {
                let p: &[i64] = unsafe { slice(p) };
                if let Some(&r) = p.iter().find(|&&r| r < 0 || r as usize >= n) {
                    return Err(bad(format!(
                        "{}: row {} out of range for {} rows",
                        PACK, r, n
                    )));
                }
                Rows::Picked(p)
            }
        };
        let count = match which {
            Rows::All(k) => k,
            Rows::Picked(p) => p.len(),
        };
        let heads: Vec<Vec<u8>> = widths.iter().map(|&w| bulk_head(w)).collect();
        let size = record_len(head, &cols, &heads).saturating_mul(count);
        new_bytes_filled(py, size, |out| pack_into(head, &cols, &heads, which, out))
    }

    /// A Python bytes object of `len` bytes, every one written by `fill` with the GIL released.
    ///
    /// Not `PyBytes::new_bound_with`: that zeroes the whole object first with the GIL held, a
    /// write-back's megabytes of page faults and stores that would stall every other thread.
    fn new_bytes_filled<'py, F>(
        py: Python<'py>,
        len: usize,
        fill: F,
    ) -> PyResult<Bound<'py, PyBytes>>
    where
        F: FnOnce(&mut [MaybeUninit<u8>]) + Send,
    {
        let len_py = ffi::Py_ssize_t::try_from(len).map_err(|_| {
            bad(format!(
                "{}: {} bytes do not fit one bytes object",
                PACK, len
            ))
        })?;
        // SAFETY: PyBytes_FromStringAndSize with a null pointer allocates an object whose contents
        // are left for the caller to write; we own its only reference (or get the error set).
        let obj = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                ffi::PyBytes_FromStringAndSize(std::ptr::null(), len_py),
            )?
        };
        let at = unsafe { ffi::PyBytes_AsString(obj.as_ptr()) } as usize;
        // SAFETY: the object is new and no other reference to it exists until it is returned, so
        // no other thread can see its bytes while `fill` writes them without the GIL; `obj` keeps
        // the allocation alive meanwhile. The slice is of MaybeUninit: nothing reads it unwritten.
        py.allow_threads(move || {
            let out = unsafe { std::slice::from_raw_parts_mut(at as *mut MaybeUninit<u8>, len) };
            fill(out)
        });
        Ok(unsafe { obj.downcast_into_unchecked() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`pack_into`] into a new vector.
    fn pack_vec(head: &[u8], columns: &[Column<'_>], heads: &[Vec<u8>], rows: Rows<'_>) -> Vec<u8> {
        let count = match rows {
            Rows::All(n) => n,
            Rows::Picked(p) => p.len(),
        };
        let mut out = vec![MaybeUninit::new(0u8); record_len(head, columns, heads) * count];
        pack_into(head, columns, heads, rows, &mut out);
        out.into_iter()
            .map(|b| unsafe { b.assume_init() })
            .collect()
    }

    #[test]
    fn values_and_both_nils_land_in_order() {
        let buf = b"$2\r\nab\r\n$-1\r\n_\r\n$2\r\ncd\r\n$3";
        let mut present = [9u8; 5];
        let mut values = [0u8; 10];
        let (stop, stored) = take_into(buf, 0, 5, 2, &mut present, &mut values);
        assert_eq!(stop.taken, 4);
        assert_eq!(stored, 2);
        assert!(!stop.foreign);
        assert_eq!(&present[..4], &[1, 0, 0, 1]);
        assert_eq!(&values[..4], b"abcd");
    }

    #[test]
    fn a_short_dollar_head_waits_and_a_full_one_is_foreign() {
        let header = bulk_head(100);
        assert!(!walk_records(b"$10", 0, 1, &header, 100, |_| {}).foreign);
        assert!(walk_records(b"$10\r\nx", 0, 1, &header, 100, |_| {}).foreign);
    }

    #[test]
    fn integer_replies_chain_until_a_foreign_or_partial_line() {
        let mut out = [0i64; 4];
        let stop = take_ints(b":1\r\n:0\r\n:42\r\n-ERR x\r\n", 0, 4, &mut out);
        assert_eq!(
            stop,
            Stop {
                cursor: 13,
                taken: 3,
                foreign: true
            }
        );
        assert_eq!(&out[..3], &[1, 0, 42]);
        let stop = take_ints(b":7\r\n:12", 0, 4, &mut out);
        assert_eq!(
            stop,
            Stop {
                cursor: 4,
                taken: 1,
                foreign: false
            }
        );
        for bad in [
            &b":\r\n"[..],
            b":-1\r\n",
            b":1\n",
            b":1234567890123456789\r\n",
        ] {
            assert!(take_ints(bad, 0, 4, &mut out).foreign);
        }
    }

    #[test]
    fn packs_picked_rows() {
        let keys = b"k1k2";
        let vals = b"ab";
        let cols = [
            Column {
                bytes: keys,
                width: 2,
            },
            Column {
                bytes: vals,
                width: 1,
            },
        ];
        let heads = vec![bulk_head(2), bulk_head(1)];
        let head = b"*3\r\n$4\r\nHGET\r\n";
        let out = pack_vec(head, &cols, &heads, Rows::Picked(&[1]));
        assert_eq!(&out[..], b"*3\r\n$4\r\nHGET\r\n$2\r\nk2\r\n$1\r\nb\r\n");
    }
}
