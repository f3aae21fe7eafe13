//! `asap-train bench` gives each model's rate as GFLOP/s and as a fraction of one core's f32
//! peak (issue 44 item 2). The oracles: the textbook flop counts of one SGD step on Fashion-MNIST
//! (784 pixels and a bias, 10 classes, a hidden layer of 16), written out here by hand, and the
//! arithmetic that ties the printed columns together. No rate is asserted (load makes it slower).

mod common;

use common::*;

#[test]
fn bench_reports_flops_and_the_fraction_of_the_cores_peak() {
    let out = run(&["bench", "--models", "svm,mlr,mlp", "--hidden", "16", "--seconds", "0.2", "--json"], 120).expect_ok();
    let lines: Vec<serde_json::Value> = out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // Per example: svm 4 x (784 + 1); mlr 4 x 785 x 10; mlp 4 x 785 x 16 (first layer: forward
    // and weight gradient) + 6 x 17 x 10 (the output layer: its delta passed back too).
    let expected = [("svm", 3140.0), ("mlr", 31400.0), ("mlp", 50240.0 + 1020.0)];
    assert_eq!(lines.len(), expected.len(), "{}", out.stdout);
    let peak_said = out.stderr.contains("one core's f32 peak: ");
    assert!(peak_said, "{}", out.stderr);
    for (l, (model, flops)) in lines.iter().zip(expected) {
        assert_eq!(l["model"], model, "{l}");
        assert_eq!(l["flops_per_example"].as_f64().unwrap(), flops, "{l}");
        let rate = l["examples_per_second"].as_f64().unwrap();
        let gflops = l["gflops"].as_f64().unwrap();
        assert!(rate > 0.0 && (gflops - rate * flops / 1e9).abs() <= 1e-9 * gflops.max(1.0), "{l}");
        match l["peak_gflops"].as_f64() {
            Some(peak) => {
                assert!(peak > 0.0 && out.stderr.contains(&format!("{peak:.1} GFLOP/s")), "{l}\n{}", out.stderr);
                assert!((l["peak_fraction"].as_f64().unwrap() - gflops / peak).abs() <= 1e-12, "{l}");
            }
            None => assert!(l["peak_fraction"].is_null() && out.stderr.contains("unknown here"), "{l}"),
        }
    }
}

/// `bench --write-profile` writes each step time's spread beside it: a `[jitter]` table of
/// quantiles against the mean step (issue 41 item 5), in the form `train --emulate-jitter` takes.
/// The oracle: the form's own rules (P from 0 to 1, factors not falling), and a training run that
/// takes the written value and draws from it.
#[test]
fn bench_writes_the_step_time_quantiles_a_run_takes() {
    let dir = scratch("bench-jitter");
    let profile = dir.join("p.toml");
    run(&["bench", "--models", "mlr", "--batch-size", "32", "--seconds", "0.3", "--write-profile", s(&profile)], 120).expect_ok();
    let text = std::fs::read_to_string(&profile).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let form = table["jitter"]["mlr:32"].as_str().unwrap_or_else(|| panic!("no [jitter] \"mlr:32\" in\n{text}"));
    let points: Vec<(f64, f64)> = form
        .split(',')
        .map(|p| {
            let (q, f) = p.split_once(':').unwrap();
            (q.parse().unwrap(), f.parse().unwrap())
        })
        .collect();
    assert_eq!(points.first().map(|p| p.0), Some(0.0), "{form}");
    assert_eq!(points.last().map(|p| p.0), Some(1.0), "{form}");
    assert!(points.windows(2).all(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1), "{form}");
    // Against the mean step: the slowest step is at least the mean, the fastest at most.
    assert!(points[0].1 <= 1.0 && points.last().unwrap().1 >= 1.0, "{form}");
    let data = format!("{FASHION}/t10k-images-idx3-ubyte.gz");
    let args = ["train", "--data", &data, "--epochs", "1", "--max-rounds", "5", "--emulate-compute", "1", "--emulate-jitter", form];
    mpirun(2, &args, 120).expect_ok();
}
