//! The final model file (`--save-model F.h5`): everything `asap-train predict` needs to score new
//! data from this file alone, each array and attribute saying what it is (`description`), so
//! h5py users need no other documentation:
//!
//! - `params` (f32, P): the flat parameter vector; its `description` attribute gives the layout
//!   (e.g. MLR: one row per class in label order, the feature weights then the bias);
//! - `row_offsets` (u64, rows + 1): row r is `params[row_offsets[r]..row_offsets[r+1]]`;
//! - `scale`, `shift` (f32, features; only when `--scale` applied one): the training set's
//!   statistics, applied as `x_j <- (x_j - shift_j) * scale_j` before the model (dense data; on
//!   sparse data only the scale);
//! - `class_labels` (f32; classifiers only): the original label of each model output (class index
//!   for mlr/mlp, `[label of -1, label of +1]` for svm/logreg);
//! - attributes: `format` ("asap-train model"), `format_version`, `model_kind`, `metric`
//!   ("accuracy" or "rmse"), `scaling` ("none", "standard" or "max-abs"), `label_threshold`
//!   (only with `--label-threshold`), and as JSON `model_spec`, `config` and `metrics` (the run's
//!   summary line).

use std::path::Path;

use anyhow::{bail, Context};
use hdf5::types::VarLenUnicode;
use ndarray::Array1;

use crate::data::ColumnScaling;
use crate::model::{MetricKind, Model, ModelSpec};

/// What the file's `format` attribute says.
pub const FORMAT: &str = "asap-train model";
/// Version of the layout above (1: the first with scaling and labels).
pub const FORMAT_VERSION: u64 = 1;

/// What a saved model holds besides the parameters.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    pub scaling: Option<ColumnScaling>,
    pub class_labels: Option<Vec<f32>>,
    pub label_threshold: Option<f32>,
    /// How the LIBSVM training data was numbered (true: 0-based), `--zero-based auto` resolved;
    /// None for other formats and for files of older versions. `predict` reads alike.
    pub zero_based: Option<bool>,
}

/// A model file read back.
pub struct SavedModel {
    pub spec: ModelSpec,
    pub params: Vec<f32>,
    pub extras: Extras,
    /// The run's summary (JSON), for the metric it reported.
    pub metrics: serde_json::Value,
}

fn str_attr(loc: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    loc.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
}

fn read_str(loc: &hdf5::Location, name: &str) -> hdf5::Result<String> {
    Ok(loc.attr(name)?.read_scalar::<VarLenUnicode>()?.as_str().to_owned())
}

fn dataset_f32(f: &hdf5::File, name: &str, values: &[f32], description: &str) -> hdf5::Result<()> {
    let d = f.new_dataset_builder().with_data(&Array1::from_vec(values.to_vec())).create(name)?;
    str_attr(&d, "description", description)
}

/// Writes the final model (rank 0 only) atomically; see the module doc for the contents.
pub fn save(path: &str, model: &dyn Model, params: &[f32], extras: &Extras, config_json: &str, metrics_json: &str) -> anyhow::Result<()> {
    let layout = model.layout();
    let spec_json = serde_json::to_string(model.spec())?;
    let metric = match model.metric_kind() {
        MetricKind::Accuracy => "accuracy",
        MetricKind::Rmse => "rmse",
    };
    super::checkpoint::write_atomic(Path::new(path), |f| {
        dataset_f32(f, "params", params, &format!("the model's parameters, flat; {}", model.describe_layout()))?;
        let offs: Vec<u64> = layout.offsets.iter().map(|&o| o as u64).collect();
        let d = f.new_dataset_builder().with_data(&Array1::from_vec(offs)).create("row_offsets")?;
        str_attr(
            &d,
            "description",
            "row r of the parameters is params[row_offsets[r]..row_offsets[r+1]] (the unit the sync modes exchange)",
        )?;
        if let Some(s) = &extras.scaling {
            let how = "applied to every example before the model: x_j <- (x_j - shift_j) * scale_j on dense data, x_j <- x_j * scale_j on sparse data";
            dataset_f32(f, "scale", &s.scale, &format!("per-feature scale fitted on the training set ({}); {how}", s.method))?;
            dataset_f32(f, "shift", &s.shift, &format!("per-feature shift fitted on the training set ({}); {how}", s.method))?;
        }
        if let Some(l) = &extras.class_labels {
            let what = if l.len() == 2 && matches!(model.spec().kind, crate::model::ModelKind::Svm | crate::model::ModelKind::Logreg) {
                "the original label of output -1 (first) and of output +1 (second)"
            } else {
                "the original label of each class index (output k is class_labels[k])"
            };
            dataset_f32(f, "class_labels", l, what)?;
        }
        str_attr(f, "format", FORMAT)?;
        f.new_attr::<u64>().create("format_version")?.write_scalar(&FORMAT_VERSION)?;
        str_attr(f, "model_kind", &format!("{:?}", model.spec().kind).to_lowercase())?;
        str_attr(f, "metric", metric)?;
        str_attr(f, "scaling", extras.scaling.as_ref().map_or("none", |s| s.method.as_str()))?;
        if let Some(t) = extras.label_threshold {
            f.new_attr::<f32>().create("label_threshold")?.write_scalar(&t)?;
        }
        if let Some(z) = extras.zero_based {
            str_attr(f, "libsvm_zero_based", if z { "true" } else { "false" })?;
        }
        str_attr(f, "model_spec", &spec_json)?;
        str_attr(f, "config", config_json)?;
        str_attr(f, "metrics", metrics_json)
    })
}

fn read_f32(f: &hdf5::File, name: &str) -> anyhow::Result<Option<Vec<f32>>> {
    if !f.link_exists(name) {
        return Ok(None);
    }
    Ok(Some(f.dataset(name)?.read_raw::<f32>().with_context(|| format!("dataset `{name}`"))?))
}

/// Reads a model file written by [`save`], checking that it is one and that its arrays agree
/// with its spec. Errors name the file and what is wrong.
pub fn load(path: &str) -> anyhow::Result<SavedModel> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("--model {path}: no such file; give a file written by `asap-train train --save-model`")
        }
        Err(e) => bail!("--model {path}: cannot read: {e}"),
        Ok(m) if !m.is_file() => bail!("--model {path}: not a regular file; give a file written by `asap-train train --save-model`"),
        Ok(_) => {}
    }
    let f = hdf5::File::open(path)
        .map_err(|e| anyhow::anyhow!("--model {path}: not an HDF5 file ({e}); give a file written by `asap-train train --save-model`"))?;
    let format = read_str(&f, "format").unwrap_or_default();
    if format != FORMAT {
        let old = f.link_exists("params") && f.attr("model_spec").is_ok();
        bail!(
            "--model {path}: not an asap-train model file (no `format` attribute \"{FORMAT}\"){}",
            if old {
                "; it looks like one saved by an older asap-train without the scaling and labels: train again with --save-model"
            } else {
                "; give a file written by `asap-train train --save-model`"
            }
        );
    }
    let version = f.attr("format_version").and_then(|a| a.read_scalar::<u64>()).unwrap_or(0);
    if version != FORMAT_VERSION {
        bail!("--model {path}: model file format version {version}, this asap-train reads version {FORMAT_VERSION}");
    }
    (|| -> anyhow::Result<SavedModel> {
        let spec: ModelSpec = serde_json::from_str(&read_str(&f, "model_spec")?).context("attribute `model_spec`")?;
        let params = read_f32(&f, "params")?.context("no `params` dataset")?;
        let model = crate::model::build(&spec)?;
        if params.len() != model.num_params() {
            bail!("`params` holds {} values, but the spec ({:?}) needs {}", params.len(), spec.kind, model.num_params());
        }
        let scaling = match read_str(&f, "scaling")?.as_str() {
            "none" => None,
            method => {
                let scale = read_f32(&f, "scale")?.context("no `scale` dataset")?;
                let shift = read_f32(&f, "shift")?.context("no `shift` dataset")?;
                if scale.len() != spec.features || shift.len() != spec.features {
                    bail!("`scale`/`shift` hold {}/{} values for a model of {} features", scale.len(), shift.len(), spec.features);
                }
                Some(ColumnScaling { method: method.to_owned(), scale, shift })
            }
        };
        let class_labels = read_f32(&f, "class_labels")?;
        let label_threshold = f.attr("label_threshold").ok().map(|a| a.read_scalar::<f32>()).transpose()?;
        let metrics = serde_json::from_str(&read_str(&f, "metrics")?).context("attribute `metrics`")?;
        let zero_based = read_str(&f, "libsvm_zero_based").ok().map(|z| z == "true");
        Ok(SavedModel { spec, params, extras: Extras { scaling, class_labels, label_threshold, zero_based }, metrics })
    })()
    .with_context(|| format!("--model {path}: damaged model file"))
}
