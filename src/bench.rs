//! `asap-train bench`: single-rank SGD throughput of every model on Fashion-MNIST, so changes to
//! the kernels can be compared on the same machine (ratios, not absolute promises).
//! SVM and logistic regression learn "label >= 5" vs the rest; MF factorises the images as a
//! (image, pixel, intensity) ratings matrix over the non-zero pixels.

use std::time::Instant;

use clap::Args;

use crate::config::FASHION_MNIST_DIR;
use crate::data::{self, Dataset, Features, LoadOptions};
use crate::model::{self, ModelKind, ModelSpec};
use crate::rng::Rng;

/// Options of `asap-train bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// IDX images file to benchmark on.
    #[arg(long, default_value_t = format!("{FASHION_MNIST_DIR}/train-images-idx3-ubyte.gz"))]
    pub data: String,
    /// Models to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ModelKind::Svm, ModelKind::Logreg, ModelKind::Mlr, ModelKind::Mf, ModelKind::Mlp])]
    pub models: Vec<ModelKind>,
    /// Mini-batch sizes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [32])]
    pub batch_size: Vec<usize>,
    /// Hidden layer width of the MLP.
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Also write the measured step times as the [compute] table of a cluster profile
    /// (`--cluster`, see clusters/), each multiplied by --dilation.
    #[arg(long, value_name = "FILE.toml")]
    pub write_profile: Option<String>,
    /// Factor the written step times are multiplied by: an emulated cluster runs D times slower
    /// than the machine measured (and its links D times slower), so that many ranks on a few
    /// cores keep up with their declared times while every ratio stays that of the real cluster.
    #[arg(long, value_name = "D", default_value_t = 1.0)]
    pub dilation: f64,
    /// Seconds of SGD per model.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn binary(d: &Dataset) -> Dataset {
    let mut b = d.clone();
    b.labels.iter_mut().for_each(|y| *y = if *y >= 5.0 { 1.0 } else { -1.0 });
    b
}

/// The images as (image, pixel, intensity/255) ratings over non-zero pixels.
fn ratings(d: &Dataset, max_rows: usize) -> Dataset {
    let Features::Dense { x, d: dim } = &d.features else { panic!("bench data must be dense") };
    let (mut users, mut items, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..d.len().min(max_rows) {
        for (j, &v) in x[i * dim..(i + 1) * dim].iter().enumerate() {
            if v != 0.0 {
                users.push(i as u32);
                items.push(j as u32);
                labels.push(v);
            }
        }
    }
    let n_users = d.len().min(max_rows);
    Dataset {
        features: Features::Ratings { users, items, n_users, n_items: *dim },
        labels,
        source: format!("{} as ratings", d.source),
        first_row: 0,
    }
}

/// Examples per second of SGD on `ds` with mini-batches of `batch` for about `seconds`, and the
/// model's parameter count.
fn measure(model: &dyn model::Model, ds: &Dataset, batch: usize, seconds: f64) -> (f64, usize) {
    let mut params = vec![0f32; model.num_params()];
    let mut rng = Rng::new(1);
    model.init(&mut params, &mut rng);
    let mut order: Vec<usize> = (0..ds.len()).collect();
    rng.shuffle(&mut order);
    let (mut done, mut scratch, mut pos) = (0usize, Vec::new(), 0usize);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..10 {
            if pos + batch > order.len() {
                pos = 0;
            }
            let b = &order[pos..pos + batch.min(order.len())];
            model.sgd_step(&mut params, ds, b, 0.01, &mut scratch);
            pos += batch;
            done += b.len();
        }
    }
    (done as f64 / start.elapsed().as_secs_f64(), params.len())
}

/// Runs the benchmark and prints one line per model.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // A rank is single-threaded; measure the same.
    crate::comm::single_threaded_blas();
    let t0 = Instant::now();
    let mut train = data::load_shard(&args.data, &LoadOptions::default(), 0, 1)?;
    let dim = train.dim();
    let mut m = data::column_max_abs(&train);
    m.iter_mut().for_each(|x| *x = if *x > 0.0 { 1.0 / *x } else { 1.0 });
    data::scale_columns(&mut train, &m, &vec![0.0; dim]);
    eprintln!("loaded {} ({} x {dim}) in {:.2}s", args.data, train.len(), t0.elapsed().as_secs_f64());
    if !args.json {
        println!("{:<8} {:>10} {:>14} {:>12}", "model", "params", "examples/s", "batch");
    }
    anyhow::ensure!(args.batch_size.iter().all(|&b| b >= 1), "--batch-size must be at least 1");
    anyhow::ensure!(args.seconds.is_finite() && args.seconds > 0.0, "--seconds must be a positive number");
    anyhow::ensure!(args.dilation.is_finite() && args.dilation > 0.0, "--dilation must be a positive number");
    let mut profile: Vec<(String, f64)> = Vec::new();
    for &kind in &args.models {
        let ds = match kind {
            ModelKind::Svm | ModelKind::Logreg | ModelKind::Lsq => binary(&train),
            ModelKind::Mf => ratings(&train, 10_000),
            ModelKind::Mlr | ModelKind::Mlp => train.clone(),
        };
        let (users, items) = match &ds.features {
            Features::Ratings { n_users, n_items, .. } => (*n_users, *n_items),
            _ => (0, 0),
        };
        let spec = ModelSpec { kind, lambda: 1e-5, features: dim, classes: 10, hidden: vec![args.hidden], factors: 10, users, items };
        let model = model::build(&spec)?;
        for &batch_size in &args.batch_size {
            let (rate, params) = measure(model.as_ref(), &ds, batch_size, args.seconds);
            let key = match kind {
                ModelKind::Mlp => format!("mlp-{}:{batch_size}", args.hidden),
                _ => format!("{}:{batch_size}", format!("{kind:?}").to_lowercase()),
            };
            profile.push((key, 1e3 * batch_size as f64 / rate * args.dilation));
            if args.json {
                println!("{}", serde_json::json!({"model": kind, "params": params, "examples_per_second": rate, "batch_size": batch_size}));
            } else {
                println!("{:<8} {:>10} {:>14.0} {:>12}", format!("{kind:?}").to_lowercase(), params, rate, batch_size);
            }
        }
    }
    if let Some(path) = &args.write_profile {
        let mut text = format!(
            "# Step times measured by `asap-train bench` on {} ({} s per model, one thread), x{} dilation.\n[compute]\n",
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim(),
            args.seconds,
            args.dilation
        );
        profile.iter().for_each(|(k, ms)| text.push_str(&format!("\"{k}\" = {ms:.3}\n")));
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write --write-profile {path}: {e}"))?;
        eprintln!("step times written to {path} (paste its [compute] table into a cluster profile)");
    }
    Ok(())
}
