//! `asap-train predict`: scores a data file with a model saved by `train --save-model`, from the
//! model file alone (no MPI): the file's scaling is applied with the training run's arithmetic,
//! the model's metric is printed (the training summary's held-out metric, computed the same way),
//! and `--out` writes one prediction per example, as an original label. An LDA model
//! (`train --model lda --save-model`) prints its topics' top words and scores a held-out docword
//! file's perplexity by document completion, as the training run's evaluation does.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::data::{self, Dataset, Features, Format, LoadOptions};
use crate::model::{MetricKind, ModelKind, ModelSpec};
use crate::train::eval::fmt_metric;
use crate::train::model_file::{self, SavedModel};

/// Options of `asap-train predict`.
#[derive(Args, Debug, Clone)]
pub struct PredictArgs {
    /// A model file written by `asap-train train --save-model`.
    #[arg(long, value_name = "MODEL.h5")]
    pub model: PathBuf,
    /// The examples to score, with their labels (any format `train --data` reads).
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// Format of --data (default: from the file name, as for training).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write one prediction per example, in the data's order, as an original label (classifiers)
    /// or a value (lsq, mf).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also print the result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub indexing: data::ZeroBasedArg,
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("{}: the path is not UTF-8", p.display()))
}

/// Refuses data the model cannot score: another kind (ratings against a classifier), another
/// dense width, a feature index or user/item id beyond the model, labels that are no class.
fn check_fits(spec: &ModelSpec, d: &Dataset, model: &str) -> Result<()> {
    let src = &d.source;
    let is_ratings = matches!(d.features, Features::Ratings { .. });
    if (spec.kind == ModelKind::Mf) != is_ratings {
        bail!(
            "{src}: {} data, but --model {model} is a {} model trained on {}: give data of the kind it was trained on",
            if is_ratings { "ratings" } else { "feature" },
            format!("{:?}", spec.kind).to_lowercase(),
            if spec.kind == ModelKind::Mf { "ratings (user item rating)" } else { "feature vectors" }
        );
    }
    match &d.features {
        Features::Dense { d: dim, .. } if *dim != spec.features => {
            bail!("{src}: {dim} features per example, but --model {model} was trained on {}: give data of the same shape", spec.features)
        }
        // Every prediction would be the bias alone, the same for every example.
        Features::Sparse(c) if c.indices.is_empty() => {
            bail!("{src}: no example has a feature (every example is a label alone): check the file (a LIBSVM line is LABEL INDEX:VALUE ...) and --format")
        }
        Features::Sparse(c) if c.ncols > spec.features => {
            bail!("{src}: feature index {} is beyond the {} features --model {model} was trained on", c.ncols, spec.features)
        }
        Features::Ratings { n_users, n_items, .. } if *n_users > spec.users || *n_items > spec.items => bail!(
            "{src}: user ids up to {} and item ids up to {}, but --model {model} knows {} users and {} items",
            n_users - 1,
            n_items - 1,
            spec.users,
            spec.items
        ),
        _ => {}
    }
    if matches!(spec.kind, ModelKind::Mlr | ModelKind::Mlp) {
        if let Some((i, y)) = d.labels.iter().enumerate().find(|(_, &y)| y < 0.0 || y.fract() != 0.0 || y as usize >= spec.classes) {
            bail!(
                "{}: label {y} is not one of the classes 0..{} --model {model} was trained on",
                data::place_of_row(src, None, i as u64),
                spec.classes - 1
            );
        }
    }
    Ok(())
}

/// The scaling of the model, applied to `d` as training applied it.
fn apply_scaling(saved: &SavedModel, d: &mut Dataset, model: &str) -> Result<()> {
    let Some(s) = &saved.extras.scaling else { return Ok(()) };
    // A standardised model was trained on dense rows: sparse ones (LIBSVM) are made dense as
    // training made them (train/setup.rs, hold_dense).
    if s.method == "standard" && matches!(d.features, Features::Sparse(_)) {
        data::make_dense(d, saved.spec.features);
    }
    if s.method == "standard" && !matches!(d.features, Features::Dense { .. }) {
        bail!("{}: sparse data, but --model {model} standardises dense features (mean and deviation): give dense data", d.source);
    }
    data::scale_columns(d, &s.scale, &s.shift);
    Ok(())
}

/// A prediction as the original label: class index k -> class_labels[k]; -1/+1 -> the labels
/// stored for them; values as they are.
fn original_label(p: f32, labels: Option<&[f32]>) -> f32 {
    match labels {
        Some([neg, pos]) if p == -1.0 || p == 1.0 => {
            if p > 0.0 {
                *pos
            } else {
                *neg
            }
        }
        Some(l) if p >= 0.0 && (p as usize) < l.len() => l[p as usize],
        _ => p,
    }
}

/// A saved LDA model: its word-topic counts (W x K), vocabulary and training options (also
/// read by the Python package's `read_model`).
pub struct LdaModel {
    pub path: String,
    /// Word-major: word w's count in topic k is `counts[w * K + k]`.
    pub counts: Vec<f64>,
    pub words: usize,
    pub vocab: Option<Vec<String>>,
    pub cfg: crate::config::TrainConfig,
    pub metrics: serde_json::Value,
}

impl LdaModel {
    /// The LDA model in `path`, or None when the file is not one (an HDF5 file with
    /// `word_topic` and no `format` attribute: what `train --model lda --save-model` writes).
    pub fn open(path: &str) -> Result<Option<Self>> {
        let Ok(f) = hdf5::File::open(path) else { return Ok(None) };
        if !f.link_exists("word_topic") || f.attr("format").is_ok() {
            return Ok(None);
        }
        let read = || -> Result<Self> {
            let d = f.dataset("word_topic")?;
            let words = d.shape()[0];
            let counts: Vec<f64> = d.read_raw::<u32>()?.into_iter().map(f64::from).collect();
            let vocab = f.link_exists("vocab").then(|| f.dataset("vocab")?.read_raw::<hdf5::types::VarLenUnicode>()).transpose()?;
            let text =
                |name: &str| -> Result<String> { Ok(f.attr(name)?.read_scalar::<hdf5::types::VarLenUnicode>()?.as_str().to_owned()) };
            let cfg: crate::config::TrainConfig = serde_json::from_str(&text("config")?).context("attribute `config`")?;
            let metrics = serde_json::from_str(&text("metrics")?).context("attribute `metrics`")?;
            let vocab = vocab.map(|v| v.iter().map(|w| w.as_str().to_owned()).collect());
            Ok(Self { path: path.to_owned(), counts, words, vocab, cfg, metrics })
        };
        read().map(Some).with_context(|| format!("--model {path}: damaged LDA model file"))
    }

    /// Prints the topics' top words, and the held-out perplexity of `data` (a docword file over
    /// the same vocabulary); `--json` prints both as one object.
    fn predict(&self, args: &PredictArgs, data: &str) -> Result<()> {
        if let Some(out) = &args.out {
            bail!("--out {}: an LDA model predicts no labels; leave --out out (predict prints its topics and perplexity)", out.display());
        }
        let k = self.cfg.lda.topics;
        let name = |w: usize| self.vocab.as_ref().map_or_else(|| format!("#{}", w + 1), |v| v[w].clone());
        let top: Vec<Vec<String>> = crate::model::lda::top_words(&self.counts, k, self.cfg.lda.top_words)
            .iter()
            .map(|ws| ws.iter().map(|&w| name(w)).collect())
            .collect();
        let test = crate::data::bow::read_docword(data, 0, 1)?;
        if test.words != self.words {
            bail!("{data}: W = {} words, but the model {} has W = {}: both must share one vocabulary", test.words, self.path, self.words);
        }
        let (ll, scored) = crate::train::lda::completion_part(&self.cfg, &test, &self.counts, 0);
        anyhow::ensure!(scored > 0, "{data}: no document of two tokens or more to score");
        let perplexity = (-ll / scored as f64).exp();
        let reported = self.metrics["perplexity"].as_f64().map_or(String::new(), |p| format!("; the training run reported {p:.2}"));
        eprintln!(
            "asap-train predict: LDA model of {k} topics over {} words; {} documents of {data}: held-out perplexity {perplexity:.2} \
             ({scored} tokens scored by document completion){reported}",
            self.words,
            test.len()
        );
        for (t, words) in top.iter().enumerate() {
            eprintln!("topic {t:>3}: {}", words.join(" "));
        }
        if args.json {
            println!(
                "{}",
                serde_json::json!({"documents": test.len(), "perplexity": perplexity, "scored_tokens": scored, "top_words": top})
            );
        }
        Ok(())
    }
}

/// Runs `asap-train predict`.
pub fn run(args: &PredictArgs) -> Result<()> {
    let model_path = path_str(&args.model)?;
    let data_path = path_str(&args.data)?;
    if let Some(out) = &args.out {
        // A typo in the output's directory is found before the work, not after.
        let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            bail!("--out {}: directory {} does not exist; create it first", out.display(), dir.display());
        }
        for (opt, input) in [("--model", &args.model), ("--data", &args.data)] {
            if out.exists() && std::fs::canonicalize(out).ok() == std::fs::canonicalize(input).ok() {
                bail!("--out {} is the same file as {opt} {}: choose another path", out.display(), input.display());
            }
        }
    }
    if let Some(lda) = LdaModel::open(model_path)? {
        return lda.predict(args, data_path);
    }
    let saved = model_file::load(model_path)?;
    let model = crate::model::build(&saved.spec)?;
    // A LIBSVM file is numbered as the model's training data was (a model trained with
    // --zero-based auto scores its own test file; issue 43), unless --zero-based says otherwise.
    let zero_based = args.indexing.zero_based.unwrap_or(match saved.extras.zero_based {
        Some(true) => data::ZeroBased::True,
        _ => data::ZeroBased::False,
    });
    let opts = LoadOptions { format: args.format, zero_based, ..Default::default() };
    let mut d = data::load_file(data_path, &opts)?.0;
    if d.is_empty() {
        bail!("{data_path}: no examples to score");
    }
    if let Some(t) = saved.extras.label_threshold {
        d = data::threshold_labels(d, t);
    }
    check_fits(&saved.spec, &d, model_path)?;
    apply_scaling(&saved, &mut d, model_path)?;
    let sums = model.evaluate(&saved.params, &d);
    let kind = model.metric_kind();
    let value = sums.metric(kind);
    let predictions = model.predict(&saved.params, &d);
    if let Some(out) = &args.out {
        let mut text = String::with_capacity(predictions.len() * 4);
        for &p in &predictions {
            text.push_str(&format!("{}\n", original_label(p, saved.extras.class_labels.as_deref())));
        }
        std::fs::write(out, text).with_context(|| format!("--out {}: cannot write the predictions", out.display()))?;
    }
    let detail = match kind {
        MetricKind::Accuracy => format!("{} of {} correct", sums.metric_sum, sums.count),
        MetricKind::Rmse => format!("{:.6} over {} examples", value, sums.count),
    };
    let reported = saved.metrics["final_metric"].as_f64().map(|v| {
        let on = if saved.metrics["held_out"] == serde_json::json!(true) { "held-out set" } else { "training set" };
        format!("; the training run reported {} on its {on}", fmt_metric(kind, v))
    });
    eprintln!(
        "asap-train predict: {} examples of {data_path}: {} ({detail}){}{}",
        d.len(),
        fmt_metric(kind, value),
        reported.unwrap_or_default(),
        args.out.as_ref().map_or(String::new(), |o| format!("; predictions written to {}", o.display()))
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({"examples": d.len(), "metric": kind, "value": value, "metric_sum": sums.metric_sum, "count": sums.count})
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::original_label;

    #[test]
    fn predictions_map_to_original_labels() {
        assert_eq!(original_label(3.0, Some(&[0.0, 1.0, 2.0, 3.0])), 3.0);
        assert_eq!(original_label(-1.0, Some(&[0.0, 7.0])), 0.0);
        assert_eq!(original_label(1.0, Some(&[0.0, 7.0])), 7.0);
        assert_eq!(original_label(0.0, Some(&[5.0, 7.0])), 5.0);
        assert_eq!(original_label(2.5, None), 2.5);
    }
}
