//! Kelp's native batch work. Python keeps the orchestration (sockets, retries, fallbacks);
//! what lives here is a scan over one batch's bytes, done with the GIL released so the
//! trainer's other threads (prefetch, push, the model step) keep running meanwhile.

use pyo3::prelude::*;

mod dedup;
mod hashing;
mod index;
mod rows_io;
mod sketch;

/// The records found by one scan: where each value starts and whether each record is nil.
struct Walked {
    /// One byte per record taken: 1 for nil (RESP2 or RESP3), 0 for a value.
    nil: Vec<u8>,
    /// Little-endian i64 per value taken: where its bytes start in the buffer.
    value_at: Vec<u8>,
    /// Where the first record not taken starts.
    cursor: usize,
    /// Whether the scan stopped at bytes that are no record of this kind.
    foreign: bool,
}

/// Takes whole records chaining from `cursor` in `received`, at most `limit`
/// ([`rows_io::walk_records`]), as nil flags and value offsets.
fn walk(received: &[u8], cursor: usize, limit: usize, header: &[u8], width: usize) -> Walked {
    let mut nil = Vec::new();
    let mut value_at = Vec::new();
    let stop = rows_io::walk_records(
        received,
        cursor,
        limit,
        header,
        width,
        |value| match value {
            None => nil.push(1),
            Some(start) => {
                nil.push(0);
                value_at.extend_from_slice(&(start as i64).to_le_bytes());
            }
        },
    );
    Walked {
        nil,
        value_at,
        cursor: stop.cursor,
        foreign: stop.foreign,
    }
}

// pyo3 0.22's #[pyfunction] expands to an `.into()` on the error type that newer clippy flags;
// the crate stays on 0.22 for rustc 1.63 (Debian 12), so the lint is silenced for the bindings only.
#[allow(clippy::useless_conversion)]
mod bindings {
    use super::walk;
    use pyo3::buffer::PyBuffer;
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    /// What `take_rows` returns to Python: nil flags, value offsets, new cursor, count, foreign.
    type Taken<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, usize, usize, bool);

    /// Walks the Redis replies received in ``buf[:got]`` from ``cursor`` on, taking at most
    /// ``limit`` records, each a nil (``$-1\r\n`` or ``_\r\n``) or ``$<width>\r\n<width bytes>\r\n``.
    /// Returns ``nil`` (bytes: one 0/1 per record taken), ``value_at`` (bytes: a little-endian
    /// i64 per value, where its bytes start in ``buf``), the new cursor, how many records were
    /// taken, and whether the scan stopped at a foreign reply (an error, another type or width).
    /// A record not all received yet stops the scan without being foreign.
    #[pyfunction]
    #[pyo3(signature = (buf, cursor, got, limit, width))]
    pub fn take_rows<'py>(
        py: Python<'py>,
        buf: PyBuffer<u8>,
        cursor: usize,
        got: usize,
        limit: usize,
        width: usize,
    ) -> PyResult<Taken<'py>> {
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("take_rows needs a contiguous buffer"));
        }
        if got > buf.len_bytes() || cursor > got {
            return Err(PyValueError::new_err(format!(
                "take_rows: need cursor <= got <= len(buf), got cursor={} got={} len={}",
                cursor,
                got,
                buf.len_bytes()
            )));
        }
        // SAFETY: `buf` holds the exporter's buffer until it is dropped at the end of this
        // function, so the memory stays valid and cannot be resized (a bytearray refuses to
        // while exported); only `got` bytes are read, and `got <= len_bytes` was checked.
        let received: &[u8] =
            unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, got) };
        let header = format!("${}\r\n", width).into_bytes();
        let walked = py.allow_threads(|| walk(received, cursor, limit, &header, width));
        let count = walked.nil.len();
        Ok((
            PyBytes::new_bound(py, &walked.nil),
            PyBytes::new_bound(py, &walked.value_at),
            walked.cursor,
            count,
            walked.foreign,
        ))
    }
}

#[pymodule]
fn kelp_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(bindings::take_rows, m)?)?;
    m.add_function(wrap_pyfunction!(sketch::bindings::sketch_add, m)?)?;
    m.add_function(wrap_pyfunction!(sketch::bindings::sketch_estimate, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::bindings::splitmix64, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::bindings::rendezvous, m)?)?;
    m.add_function(wrap_pyfunction!(dedup::bindings::dedup_columns, m)?)?;
    m.add_function(wrap_pyfunction!(rows_io::bindings::take_rows_into, m)?)?;
    m.add_function(wrap_pyfunction!(rows_io::bindings::pack_rows, m)?)?;
    m.add_class::<index::bindings::IdMap>()?;
    m.add("ID_MAP_MAX_TAG", index::MAX_TAG)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_both_nils_chain() {
        let buf = b"$2\r\nab\r\n$-1\r\n_\r\n$2\r\n$_\r\n";
        let w = walk(buf, 0, 10, b"$2\r\n", 2);
        assert_eq!(w.nil, vec![0, 1, 1, 0]);
        assert_eq!(w.cursor, buf.len());
        assert!(!w.foreign);
    }

    #[test]
    fn a_short_dollar_head_waits_and_a_full_one_is_foreign() {
        assert!(!walk(b"$10", 0, 1, b"$100\r\n", 100).foreign);
        assert!(walk(b"$10\r\nx", 0, 1, b"$100\r\n", 100).foreign);
    }
}
