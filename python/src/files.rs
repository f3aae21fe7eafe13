//! Reading what the binary writes: a model saved by `train --save-model` (with what `predict`
//! needs to score data: the spec, the parameters, the column scaling, the original labels), and
//! an LDA model (`train --model lda --save-model`: its word-topic counts, vocabulary, top words
//! and training options, read by `predict`'s own reader; issue 43 item 6).

use asap_train::train::model_file;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{json_to_py, text, Error};

/// A saved model as a dict: `spec` (kind, features, classes, hidden ...), `params` (float32
/// array), `row_offsets` (the model's rows, as the sync layer sees them), `scaling` (None, or
/// method, scale and shift arrays: x' = (x - shift) * scale, as training applied it),
/// `class_labels` (original label of each class index, or None), `label_threshold`, and
/// `metrics` (the training run's summary). An LDA model gives [`lda_dict`]'s keys instead.
/// Errors name the file and the fix, as `predict` does.
#[pyfunction]
pub fn read_model<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
    if let Some(lda) = asap_train::predict::LdaModel::open(path).map_err(|e| Error::new_err(text(&e)))? {
        return lda_dict(py, &lda);
    }
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

/// An LDA model as a dict: `spec` (kind "lda", topics, words, alpha, beta), `word_topic` (W x K
/// uint32 counts: how many tokens of word w the final sample gave topic k; they sum to the
/// training corpus's tokens), `vocab` (the words, or None when the data had no vocabulary file),
/// `top_words` (each topic's most frequent words, as `predict` prints them), `config` (the
/// training options) and `metrics` (the run's summary: perplexity ...).
fn lda_dict<'py>(py: Python<'py>, lda: &asap_train::predict::LdaModel) -> PyResult<Bound<'py, PyDict>> {
    let o = &lda.cfg.lda;
    let k = o.topics;
    let d = PyDict::new(py);
    let spec = serde_json::json!({"kind": "lda", "topics": k, "words": lda.words, "alpha": o.alpha, "beta": o.beta});
    d.set_item("spec", json_to_py(py, &spec)?)?;
    let counts: Vec<u32> = lda.counts.iter().map(|&c| c as u32).collect();
    d.set_item("word_topic", PyArray1::from_vec(py, counts).reshape([lda.words, k])?)?;
    d.set_item("vocab", lda.vocab.clone())?;
    let name = |w: usize| lda.vocab.as_ref().map_or_else(|| format!("#{}", w + 1), |v| v[w].clone());
    let top: Vec<Vec<String>> =
        asap_train::model::lda::top_words(&lda.counts, k, o.top_words).iter().map(|ws| ws.iter().map(|&w| name(w)).collect()).collect();
    d.set_item("top_words", top)?;
    let config = serde_json::to_value(&lda.cfg).map_err(|e| Error::new_err(e.to_string()))?;
    d.set_item("config", json_to_py(py, &config)?)?;
    d.set_item("metrics", json_to_py(py, &lda.metrics)?)?;
    Ok(d)
}
