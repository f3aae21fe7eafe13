//! Reading what the binary writes: a model saved by `train --save-model` (with what `predict`
//! needs to score data: the spec, the parameters, the column scaling, the original labels).

use asap_train::train::model_file;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{json_to_py, text, Error};

/// A saved model as a dict: `spec` (kind, features, classes, hidden ...), `params` (float32
/// array), `row_offsets` (the model's rows, as the sync layer sees them), `scaling` (None, or
/// method, scale and shift arrays: x' = (x - shift) * scale, as training applied it),
/// `class_labels` (original label of each class index, or None), `label_threshold`, and
/// `metrics` (the training run's summary). Errors name the file and the fix, as `predict` does.
#[pyfunction]
pub fn read_model<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
    let saved = model_file::load(path).map_err(|e| Error::new_err(text(&e)))?;
    let layout = asap_train::model::build(&saved.spec).map_err(|e| Error::new_err(text(&e)))?.layout();
    let d = PyDict::new(py);
    let spec = serde_json::to_value(&saved.spec).map_err(|e| Error::new_err(e.to_string()))?;
    d.set_item("spec", json_to_py(py, &spec)?)?;
    d.set_item("params", PyArray1::from_vec(py, saved.params))?;
    d.set_item("row_offsets", layout.offsets)?;
    match &saved.extras.scaling {
        None => d.set_item("scaling", py.None())?,
        Some(s) => {
            let sc = PyDict::new(py);
            sc.set_item("method", &s.method)?;
            sc.set_item("scale", PyArray1::from_slice(py, &s.scale))?;
            sc.set_item("shift", PyArray1::from_slice(py, &s.shift))?;
            d.set_item("scaling", sc)?;
        }
    }
    d.set_item("class_labels", saved.extras.class_labels.map(|l| PyArray1::from_vec(py, l)))?;
    d.set_item("label_threshold", saved.extras.label_threshold)?;
    d.set_item("metrics", json_to_py(py, &saved.metrics)?)?;
    Ok(d)
}
