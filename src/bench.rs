//! `asap-train bench`: single-rank SGD throughput of every model on Fashion-MNIST, so changes to
//! the kernels can be compared on the same machine (ratios, not absolute promises).
//! SVM and logistic regression learn the labels above the middle of their range against the rest
//! ("label >= 5" on Fashion-MNIST); MF factorises the images as a (image, pixel, intensity)
//! ratings matrix over the non-zero pixels. Any data file train reads will do: sparse rows give
//! MF their non-zero entries, ratings data only MF.
//!
//! Each model's rate is also given as GFLOP/s and as a fraction of one core's f32 peak (issue 44
//! item 2), so that a kernel's headroom is visible, not only its change. The flops are the
//! textbook count of one example's SGD step ([`flops_per_example`]: a multiply-add is 2, the
//! forward pass and the gradient, bias included; sparse rows count their non-zeros), not what the
//! implementation happens to do. The peak is the clock (/proc/cpuinfo's "cpu MHz") times the f32
//! flops a core can issue a cycle ([`core_peak`]): 32 with FMA and 256-bit or wider vectors (two
//! 256-bit FMAs a cycle, as Haswell to Zen 4 issue, or one 512-bit FMA, as the Xeons with one
//! AVX-512 unit: the 2.1 GHz Xeon, 67 GFLOP/s), 16 with AVX and no FMA, 8 with SSE only.
//! A core with two 512-bit FMA units peaks at twice that, so a fraction above 1 is possible there.
//! Each rate is also given per second the thread ran on a CPU (/proc/thread-self/schedstat): on a
//! shared machine the wall-clock rate falls with the load, the on-CPU one much less (svm at load
//! 5.8: 0.58M examples/s of wall time, 1.20M per CPU second).

use std::time::Instant;

use clap::Args;

use crate::config::FASHION_MNIST_DIR;
use crate::data::{self, Dataset, Features, LoadOptions, Row};
use crate::model::{self, ModelKind, ModelSpec};
use crate::rng::Rng;
use crate::train::jitter::Jitter;

/// Options of `asap-train bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Data file to benchmark on (any format train reads).
    #[arg(long, default_value_t = format!("{FASHION_MNIST_DIR}/train-images-idx3-ubyte.gz"))]
    pub data: String,
    /// Models to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ModelKind::Svm, ModelKind::Logreg, ModelKind::Mlr, ModelKind::Mf, ModelKind::Mlp])]
    pub models: Vec<ModelKind>,
    /// Mini-batch sizes (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [32], value_parser = crate::values::at_least_one)]
    pub batch_size: Vec<usize>,
    /// Hidden layer width of the MLP.
    #[arg(long, default_value_t = 128, value_parser = crate::values::at_least_one)]
    pub hidden: usize,
    /// Also write the measured step times as the [compute] table of a cluster profile
    /// (`--cluster`, see clusters/), each multiplied by --dilation.
    #[arg(long, value_name = "FILE.toml")]
    pub write_profile: Option<String>,
    /// Factor the written step times are multiplied by: an emulated cluster runs D times slower
    /// than the machine measured (and its links D times slower), so that many ranks on a few
    /// cores keep up with their declared times while every ratio stays that of the real cluster.
    #[arg(long, value_name = "D", default_value_t = 1.0, value_parser = crate::values::positive_f64)]
    pub dilation: f64,
    /// Seconds of SGD per model.
    #[arg(long, default_value_t = 3.0, value_parser = crate::values::positive_f64)]
    pub seconds: f64,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Labels above the middle of their range as +1, the rest as -1 (Fashion-MNIST: label >= 5).
fn binary(d: &Dataset) -> Dataset {
    let (lo, hi) = d.labels.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &y| (lo.min(y), hi.max(y)));
    let mid = (lo + hi) / 2.0;
    let mut b = d.clone();
    b.labels.iter_mut().for_each(|y| *y = if *y > mid { 1.0 } else { -1.0 });
    b
}

/// The rows as (row, column, value) ratings over their non-zero entries (dense or sparse).
fn ratings(d: &Dataset, max_rows: usize) -> Dataset {
    let (mut users, mut items, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    let mut add = |i: usize, j: usize, v: f32| {
        if v != 0.0 {
            users.push(i as u32);
            items.push(j as u32);
            labels.push(v);
        }
    };
    for i in 0..d.len().min(max_rows) {
        match d.row(i) {
            Row::Dense(x) => x.iter().enumerate().for_each(|(j, &v)| add(i, j, v)),
            Row::Sparse { indices, values } => indices.iter().zip(values).for_each(|(&j, &v)| add(i, j as usize, v)),
            Row::Rating { .. } => unreachable!("ratings data is measured as it is (data_for)"),
        }
    }
    Dataset {
        features: Features::Ratings { users, items, n_users: d.len().min(max_rows), n_items: d.dim() },
        labels,
        source: format!("{} as ratings", d.source),
        first_row: 0,
    }
}

/// The number of classes `kind` is measured with on `train`, or why `train` cannot serve it.
fn classes_for(kind: ModelKind, train: &Dataset) -> anyhow::Result<usize> {
    let src = &train.source;
    let is_ratings = matches!(train.features, Features::Ratings { .. });
    anyhow::ensure!(
        !is_ratings || kind == ModelKind::Mf,
        "--data {src} holds ratings (user item rating): of the --models only mf trains on them (give --models mf, or feature data)"
    );
    match kind {
        ModelKind::Mlr | ModelKind::Mlp => {
            if let Some(y) = train.labels.iter().find(|&&y| y < 0.0 || y.fract() != 0.0 || y > 1e6) {
                anyhow::bail!(
                    "--models {} needs class labels 0, 1, ..., J-1, but --data {src} has the label {y}: leave mlr and mlp out (e.g. --models svm,logreg,mf)",
                    format!("{kind:?}").to_lowercase()
                );
            }
            Ok((train.labels.iter().fold(0f32, |m, &y| m.max(y)) as usize + 1).max(2))
        }
        ModelKind::Lda => anyhow::bail!("bench measures SGD models; --model lda is measured by benches/lda-peers.sh"),
        _ => Ok(2),
    }
}

/// The data `kind` is measured on (checked by [`classes_for`]).
fn data_for(kind: ModelKind, train: &Dataset) -> Dataset {
    match kind {
        ModelKind::Mf if matches!(train.features, Features::Ratings { .. }) => train.clone(),
        ModelKind::Mf => ratings(train, 10_000),
        ModelKind::Svm | ModelKind::Logreg | ModelKind::Lsq => binary(train),
        _ => train.clone(),
    }
}

/// Nanoseconds this thread has run on a CPU (the first field of /proc/thread-self/schedstat), or
/// None where the kernel does not say.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// What [`measure`] found.
struct Rate {
    /// Examples per second of wall time.
    wall: f64,
    /// Examples per second this thread ran on a CPU: the same kernel less the time it waited for
    /// one, so a shared machine's load moves it less (None where schedstat is missing).
    on_cpu: Option<f64>,
    params: usize,
    /// Wall seconds of every step: their spread is the step-time jitter (`--emulate-jitter`).
    steps: Vec<f64>,
}

/// The quantiles `bench` gives of the step times (each against the mean step): the tail in
/// three decades, the median and both ends.
const STEP_QUANTILES: [f64; 8] = [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0];

/// Examples per second of SGD on `ds` with mini-batches of `batch` for about `seconds`, and the
/// model's parameter count.
fn measure(model: &dyn model::Model, ds: &Dataset, batch: usize, seconds: f64) -> Rate {
    let mut params = vec![0f32; model.num_params()];
    let mut rng = Rng::new(1);
    model.init(&mut params, &mut rng);
    let mut order: Vec<usize> = (0..ds.len()).collect();
    rng.shuffle(&mut order);
    let (mut done, mut scratch, mut pos, mut steps) = (0usize, Vec::new(), 0usize, Vec::new());
    let (start, cpu0) = (Instant::now(), thread_cpu_ns());
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..10 {
            if pos + batch > order.len() {
                pos = 0;
            }
            let b = &order[pos..pos + batch.min(order.len())];
            let t = Instant::now();
            model.sgd_step(&mut params, ds, b, 0.01, &mut scratch);
            steps.push(t.elapsed().as_secs_f64());
            pos += batch;
            done += b.len();
        }
    }
    let wall = done as f64 / start.elapsed().as_secs_f64();
    let on_cpu = cpu0.zip(thread_cpu_ns()).filter(|(a, b)| b > a).map(|(a, b)| done as f64 / ((b - a) as f64 * 1e-9));
    Rate { wall, on_cpu, params: params.len(), steps }
}

/// The textbook f32 flops of one example's SGD step of `spec` on rows of `nonzeros` features
/// (module doc): a linear model's margin and gradient, 4 per feature; MLR 4 per feature and class;
/// an MLP's forward pass and weight gradients (4 per weight) and the deltas it passes back below
/// its first layer (2 per weight); MF's prediction and its two row updates, 6 per factor.
pub fn flops_per_example(spec: &ModelSpec, nonzeros: f64) -> f64 {
    let inputs = nonzeros + 1.0;
    match spec.kind {
        ModelKind::Svm | ModelKind::Logreg | ModelKind::Lsq => 4.0 * inputs,
        ModelKind::Mlr => 4.0 * inputs * spec.classes as f64,
        ModelKind::Mlp => {
            let widths: Vec<f64> =
                std::iter::once(nonzeros).chain(spec.hidden.iter().map(|&h| h as f64)).chain([spec.classes as f64]).collect();
            widths
                .windows(2)
                .enumerate()
                .map(|(l, w)| {
                    let weights = (w[0] + 1.0) * w[1];
                    if l == 0 {
                        4.0 * weights
                    } else {
                        6.0 * weights
                    }
                })
                .sum()
        }
        ModelKind::Mf => 6.0 * spec.factors as f64,
        ModelKind::Lda => 0.0,
    }
}

/// One core's f32 peak in GFLOP/s, and how it was computed (module doc); None where the clock or
/// the vector width cannot be read (not x86-64, or no "cpu MHz" in /proc/cpuinfo).
pub fn core_peak() -> Option<(f64, String)> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let field = |name: &str| info.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|v| v.trim().to_string());
    let mhz: f64 = field("cpu MHz")?.parse().ok()?;
    let model = field("model name").unwrap_or_else(|| "this CPU".into());
    let (per_cycle, what) = vector_flops_per_cycle()?;
    Some((mhz / 1e3 * per_cycle, format!("{model}, {:.2} GHz x {per_cycle} f32 flop/cycle ({what})", mhz / 1e3)))
}

#[cfg(target_arch = "x86_64")]
fn vector_flops_per_cycle() -> Option<(f64, &'static str)> {
    let wide = is_x86_feature_detected!("avx2") || is_x86_feature_detected!("avx512f");
    Some(if is_x86_feature_detected!("fma") && wide {
        (32.0, "FMA on 256-bit or wider vectors: two 256-bit or one 512-bit FMA a cycle")
    } else if is_x86_feature_detected!("avx") {
        (16.0, "AVX without FMA: a 256-bit add and multiply a cycle")
    } else {
        (8.0, "SSE: a 128-bit add and multiply a cycle")
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn vector_flops_per_cycle() -> Option<(f64, &'static str)> {
    None
}

/// Mean non-zero features of a row of `ds` (dense rows: every feature, as the kernels touch them).
fn mean_nonzeros(ds: &Dataset) -> f64 {
    match &ds.features {
        Features::Dense { d, .. } => *d as f64,
        Features::Sparse(c) => c.indices.len() as f64 / ds.len().max(1) as f64,
        Features::Ratings { .. } => 0.0,
    }
}

/// Runs the benchmark and prints one line per model.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // A rank is single-threaded; measure the same.
    crate::comm::single_threaded_blas();
    let t0 = Instant::now();
    let mut train = data::load_shard(&args.data, &LoadOptions::default(), 0, 1)?;
    let dim = train.dim();
    let uses_columns = match &train.features {
        Features::Dense { d, .. } => *d > 0,
        Features::Sparse(c) => !c.indices.is_empty(),
        Features::Ratings { .. } => true,
    };
    anyhow::ensure!(uses_columns, "--data {}: no example has a feature (every example is a label alone): check the file", args.data);
    let mut m = data::column_max_abs(&train);
    m.iter_mut().for_each(|x| *x = if *x > 0.0 { 1.0 / *x } else { 1.0 });
    data::scale_columns(&mut train, &m, &vec![0.0; dim]);
    eprintln!("loaded {} ({} x {dim}) in {:.2}s", args.data, train.len(), t0.elapsed().as_secs_f64());
    // Every model checked first, so one that cannot be measured stops the run before any is.
    let classes = args.models.iter().map(|&k| classes_for(k, &train)).collect::<anyhow::Result<Vec<_>>>()?;
    let peak = core_peak();
    match &peak {
        Some((gflops, how)) => eprintln!("one core's f32 peak: {gflops:.1} GFLOP/s ({how})"),
        None => eprintln!("one core's f32 peak: unknown here (no x86-64 vector flags or no cpu MHz in /proc/cpuinfo)"),
    }
    if !args.json {
        println!(
            "{:<8} {:>10} {:>14} {:>12} {:>9} {:>7} {:>13}",
            "model", "params", "examples/s", "batch", "GFLOP/s", "% peak", "on-CPU % peak"
        );
    }
    let mut profile: Vec<(String, f64, Option<Jitter>)> = Vec::new();
    for (&kind, classes) in args.models.iter().zip(classes) {
        let ds = data_for(kind, &train);
        let (users, items) = match &ds.features {
            Features::Ratings { n_users, n_items, .. } => (*n_users, *n_items),
            _ => (0, 0),
        };
        let spec = ModelSpec { kind, lambda: 1e-5, features: dim, classes, hidden: vec![args.hidden], factors: 10, users, items };
        let model = model::build(&spec)?;
        for &batch_size in &args.batch_size {
            let Rate { wall: rate, on_cpu, params, steps } = measure(model.as_ref(), &ds, batch_size, args.seconds);
            let jitter = Jitter::measured(&steps, &STEP_QUANTILES);
            let key = match kind {
                ModelKind::Mlp => format!("mlp-{}:{batch_size}", args.hidden),
                _ => format!("{}:{batch_size}", format!("{kind:?}").to_lowercase()),
            };
            if let (Some(j), false) = (&jitter, args.json) {
                eprintln!("{key}: step times against the mean step, at quantiles 0 to 1 (--emulate-jitter): {j}");
            }
            profile.push((key, 1e3 * batch_size as f64 / rate * args.dilation, jitter.clone()));
            let flops = flops_per_example(&spec, mean_nonzeros(&ds));
            let gflops = rate * flops / 1e9;
            let fraction = peak.as_ref().map(|(p, _)| gflops / p);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"model": kind, "params": params, "examples_per_second": rate, "batch_size": batch_size,
                        "examples_per_cpu_second": on_cpu, "step_jitter": jitter.as_ref().map(|j| j.to_string()), "flops_per_example": flops, "gflops": gflops, "peak_gflops": peak.as_ref().map(|p| p.0), "peak_fraction": fraction})
                );
            } else {
                let pct = fraction.map_or("?".to_string(), |f| format!("{:.1}", 100.0 * f));
                let cpu_pct =
                    on_cpu.zip(peak.as_ref()).map_or("?".to_string(), |(r, (p, _))| format!("{:.1}", 100.0 * r * flops / 1e9 / p));
                println!(
                    "{:<8} {:>10} {:>14.0} {:>12} {gflops:>9.2} {pct:>7} {cpu_pct:>13}",
                    format!("{kind:?}").to_lowercase(),
                    params,
                    rate,
                    batch_size
                );
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
        profile.iter().for_each(|(k, ms, _)| text.push_str(&format!("\"{k}\" = {ms:.3}\n")));
        text.push_str("# Each step against the mean step, at quantiles 0 to 1 (--emulate-jitter's form).\n[jitter]\n");
        profile.iter().filter_map(|(k, _, j)| j.as_ref().map(|j| (k, j))).for_each(|(k, j)| text.push_str(&format!("\"{k}\" = \"{j}\"\n")));
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write --write-profile {path}: {e}"))?;
        eprintln!("step times written to {path} (paste its [compute] and [jitter] tables into a cluster profile)");
    }
    Ok(())
}
