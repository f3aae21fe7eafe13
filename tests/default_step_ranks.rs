//! The default step follows the ranks' combined batch (issue 43, item 3; `train/step_search.rs`),
//! under real mpirun on the default data (the Fashion-MNIST training set):
//! - above 4 ranks the step the start line states is the searched step it also states times
//!   N/4 (or a halving of it the start line names, under the default cosine schedule), the run
//!   records that step (the metrics' start event), and under `--lr-schedule decay` the per-epoch
//!   decay then stays 0.8, where before it was scaled to 0.8^(8/N) with the step unchanged;
//! - up to 4 ranks, or with another inner optimizer than SGD, the searched step is used as it
//!   is, and says nothing of a factor;
//! - a given `--lr` is used as given, with the decay scaled as before (explicit options unchanged).
//!
//! The oracle is the rule's arithmetic on the two numbers the start line states, and the
//! documented default decay 0.8 and its rank-scaled form.

mod common;

use common::*;

/// The start event's `config` of a run's metrics.
fn start_config(path: &std::path::Path) -> serde_json::Value {
    metrics(path).into_iter().find(|l| l["event"] == "start").expect("a start event")["config"].clone()
}

/// `x` of "... {key}x ..." in `text`, up to the next space or the given `end`.
fn number_after(text: &str, key: &str, end: char) -> f64 {
    let at = text.find(key).unwrap_or_else(|| panic!("no {key:?} in:\n{text}")) + key.len();
    let num: String = text[at..].chars().take_while(|&c| c != ' ' && c != end).collect();
    num.parse().unwrap_or_else(|_| panic!("{num:?} after {key:?} is not a number in:\n{text}"))
}

#[test]
fn the_default_step_grows_with_the_ranks_combined_batch_and_says_so() {
    let dir = scratch("default-step-ranks");
    let run = |n: usize, name: &str, extra: &[&str]| {
        let m = dir.join(format!("{name}.jsonl"));
        let mut args = vec!["train", "--epochs", "1", "--max-rounds", "3", "--metrics", s(&m)];
        args.extend(extra);
        (mpirun(n, &args, 300).expect_ok().stderr, start_config(&m))
    };

    // 12 ranks under the default schedule (cosine): the searched step x 12/4, or x 1.5 where the
    // short run refused x 3, said as such; nothing is said of a per-epoch decay.
    let (said, cfg) = run(12, "n12", &[]);
    let step = number_after(&said, "step size ", ' ');
    let searched = number_after(&said, "(a search on a sample, ", ' ');
    let factor = if said.contains(&format!("{searched} x 12/4: the step grows with the 12 ranks' combined batch")) {
        3.0
    } else {
        assert!(said.contains(&format!("{searched} x 1.5 (12/4 halved until a short run allowed it)")), "{said}");
        1.5
    };
    assert_eq!(step, searched * factor, "{said}");
    assert_eq!(cfg["lr"].as_f64().unwrap(), step);
    assert!(!said.contains("--lr-decay not given"), "{said}");

    // 12 ranks under --lr-schedule decay: the searched step x 12/4, and the decay left at its
    // default.
    let (said, cfg) = run(12, "n12-decay", &["--lr-schedule", "decay"]);
    let step = number_after(&said, "step size ", ' ');
    let searched = number_after(&said, "(a search on a sample, ", ' ');
    assert!(said.contains(&format!("{searched} x 12/4: the step grows with the 12 ranks' combined batch")), "{said}");
    assert_eq!(step, searched * 3.0, "{said}");
    assert_eq!(cfg["lr"].as_f64().unwrap(), step);
    assert_eq!(cfg["lr_decay"].as_f64().unwrap() as f32, 0.8);
    assert!(said.contains("--lr-decay not given: 0.8 per epoch on 12 ranks, not scaled to the rank count"), "{said}");

    // The same step given: used as given, and the decay scaled to the rank count as before.
    let given = format!("{step}");
    let (said, cfg) = run(12, "n12-given", &["--lr", &given, "--lr-schedule", "decay"]);
    assert!(!said.contains("step size"), "a given --lr is not searched:\n{said}");
    assert_eq!(cfg["lr"].as_f64().unwrap(), step);
    assert_eq!(cfg["lr_decay"].as_f64().unwrap() as f32, 0.8f32.powf(8.0 / 12.0));

    // AdamW at 12 ranks: the search's own step, with no factor (the growth is measured for SGD).
    let (said, _) = run(12, "n12-adamw", &["--inner-optimizer", "adamw"]);
    assert!(said.contains("step size ") && !said.contains(" x 12/4"), "{said}");

    // 4 ranks: the searched step itself.
    let (said, cfg) = run(4, "n4", &["--lr-schedule", "decay"]);
    assert!(said.contains("chosen for this model and data (a search on a sample; --lr sets it)"), "{said}");
    assert!(!said.contains(" x 4/4"), "{said}");
    assert_eq!(cfg["lr"].as_f64().unwrap(), number_after(&said, "step size ", ' '));
    assert_eq!(cfg["lr_decay"].as_f64().unwrap() as f32, 0.8);
}

/// A refused factor is halved and checked again (`step_search::combined_batch_factor`): under
/// ssp at 32 ranks the stale modes' check refuses the searched step x 8 on the default data (at
/// 3 of 3 seeds, benches/defaults-sweep.md Part 8), and the run takes the largest halving the
/// short run allows, named on the start line, instead of the unscaled step.
#[test]
fn a_refused_factor_is_halved_until_a_short_run_allows_it() {
    let dir = scratch("default-step-halved");
    let m = dir.join("ssp32.jsonl");
    let args = ["train", "--sync", "ssp", "--epochs", "1", "--max-rounds", "3", "--metrics", s(&m)];
    let said = mpirun(32, &args, 600).expect_ok().stderr;
    let step = number_after(&said, "step size ", ' ');
    let searched = number_after(&said, "(a search on a sample, ", ' ');
    let factor = number_after(&said, &format!("{searched} x "), ' ');
    assert!(said.contains(&format!("{searched} x {factor} (32/4 halved until a short run allowed it)")), "{said}");
    assert!(factor == 4.0 || factor == 2.0, "a halving of 8 above 1: {factor}\n{said}");
    assert_eq!(step, searched * factor, "{said}");
    assert_eq!(start_config(&m)["lr"].as_f64().unwrap(), step);
}
