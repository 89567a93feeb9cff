//! Kelp's native batch work. Python keeps the orchestration (sockets, retries, fallbacks);
//! what lives here is a scan over one batch's bytes, done with the GIL released so the
//! trainer's other threads (prefetch, push, the model step) keep running meanwhile.

use pyo3::prelude::*;

mod dedup;
mod hashing;
mod index;
mod rows_io;
mod sketch;

#[pymodule]
fn kelp_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sketch::bindings::sketch_add, m)?)?;
    m.add_function(wrap_pyfunction!(sketch::bindings::sketch_estimate, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::bindings::splitmix64, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::bindings::rendezvous, m)?)?;
    m.add_function(wrap_pyfunction!(dedup::bindings::dedup_columns, m)?)?;
    m.add_function(wrap_pyfunction!(rows_io::bindings::take_rows_into, m)?)?;
    m.add_function(wrap_pyfunction!(rows_io::bindings::pack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(rows_io::bindings::take_ints_into, m)?)?;
    m.add_class::<index::bindings::IdMap>()?;
    m.add("ID_MAP_MAX_TAG", index::MAX_TAG)?;
    Ok(())
}
