//! The run's summary: one typed record, serialised as the metrics' `summary` line (and kept in a
//! saved model) and printed by rank 0 from the same fields, so the two cannot disagree.

use std::collections::BTreeMap;

use serde::Serialize;

use super::eval::fmt_metric;
use super::phases::Phases;
use super::{emulate, COUNTER_NAMES};
use crate::config::TargetOn;
use crate::model::MetricKind;

/// Mean and maximum of one counter over the ranks.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MeanMax {
    pub mean: f64,
    pub max: f64,
}

/// Every counter of [`COUNTER_NAMES`] combined over the ranks.
pub type Counters = BTreeMap<&'static str, MeanMax>;

/// Counters combined over ranks, from their means and maxima in [`COUNTER_NAMES`]' order.
pub fn counters(mean: &[f64], max: &[f64]) -> Counters {
    COUNTER_NAMES.iter().enumerate().map(|(i, n)| (*n, MeanMax { mean: mean[i], max: max[i] })).collect()
}

/// When `--target` was first reached.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TimeToTarget {
    pub train_seconds: f64,
    pub round: u64,
    pub epoch: f64,
}

/// The last evaluation before the end: its round and metric.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LastEvaluation {
    pub round: u64,
    pub metric: f64,
}

/// The emulated cluster's check (`--emulate-compute`): steps that broke (worst rank), CPU used
/// against the cores there are, and whether the run is valid (no rank broke more than 1 % of its
/// steps, and no emulated link was slower than the real transfer more than 1 % of the time).
#[derive(Clone, Debug, Serialize)]
pub struct EmulationSummary {
    pub declared_step_ms: f64,
    pub steps: f64,
    pub broken_steps: f64,
    pub worst_rank_broken_fraction: f64,
    pub overrun_seconds_max: f64,
    pub late_wakeups: f64,
    pub worst_rank_drift: f64,
    pub link_overruns: f64,
    pub cpu_seconds: f64,
    pub cores: f64,
    pub cpu_utilisation: f64,
    pub valid: bool,
    /// `--emulate-jitter`: what was declared and what was drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<JitterSummary>,
}

/// `--emulate-jitter`'s check: the quantiles declared, the mean factor they imply and the mean
/// drawn over the ranks, and the worst rank's largest distance between a declared quantile P and
/// the fraction of its draws at most that quantile's factor.
#[derive(Clone, Debug, Serialize)]
pub struct JitterSummary {
    pub quantiles: String,
    pub mean_declared: f64,
    pub mean_drawn: f64,
    pub worst_rank_quantile_error: f64,
}

impl EmulationSummary {
    /// From the counters' means and maxima over `ranks` ranks after `rounds` rounds, the wall
    /// seconds the CPU time is set against, and the mode metrics (which count the link overruns).
    pub fn new(
        declared_step_ms: f64,
        ranks: usize,
        rounds: u64,
        mean: &[f64],
        max: &[f64],
        cpu_wall_seconds: f64,
        mode: &serde_json::Value,
    ) -> Self {
        let at = |k: &str| COUNTER_NAMES.iter().position(|n| *n == k).expect("a counter name");
        let n = ranks as f64;
        let cores = emulate::online_cores() as f64;
        let cpu = mean[at("cpu_seconds")] * n;
        let worst = max[at("emulation_broken_fraction")];
        let link_overruns = mode["link_overruns"].as_f64().unwrap_or(0.0);
        let drift = max[at("emulation_drift")];
        let rounds = (rounds as f64).max(1.0);
        let valid = worst <= emulate::MAX_BROKEN_FRACTION
            && drift <= emulate::MAX_BROKEN_FRACTION
            && link_overruns / (rounds * n) <= emulate::MAX_BROKEN_FRACTION;
        EmulationSummary {
            declared_step_ms,
            steps: mean[at("emulated_steps")] * n,
            broken_steps: mean[at("emulation_broken_steps")] * n,
            worst_rank_broken_fraction: worst,
            overrun_seconds_max: max[at("emulation_overrun_seconds")],
            late_wakeups: mean[at("emulation_late_wakeups")] * n,
            worst_rank_drift: drift,
            link_overruns,
            cpu_seconds: cpu,
            cores,
            cpu_utilisation: cpu / (cores * cpu_wall_seconds.max(1e-9)),
            valid,
            jitter: None,
        }
    }

    /// With `--emulate-jitter`: its check, from the same counters' means and maxima.
    pub fn with_jitter(mut self, jitter: Option<&crate::train::jitter::Jitter>, mean: &[f64], max: &[f64]) -> Self {
        let at = |k: &str| COUNTER_NAMES.iter().position(|n| *n == k).expect("a counter name");
        self.jitter = jitter.map(|j| JitterSummary {
            quantiles: j.to_string(),
            mean_declared: j.mean(),
            mean_drawn: mean[at("emulation_jitter_mean")],
            worst_rank_quantile_error: max[at("emulation_jitter_quantile_error")],
        });
        self
    }
}

/// What a finished run reports: the metrics' `{"event": "summary", ...}` line. The fields keep
/// the order of the JSON object the summary was before it had a type.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Always "summary".
    pub event: &'static str,
    pub ranks: usize,
    pub sync: &'static str,
    pub epochs: f64,
    pub rounds: u64,
    pub stopped_early: bool,
    pub preempted: bool,
    pub load_seconds: f64,
    pub train_seconds: f64,
    pub wall_seconds: f64,
    pub examples_per_second_per_rank: f64,
    pub objective: f64,
    /// What the objective is, where "mean training loss + L2" would not say it (MF).
    pub objective_definition: Option<&'static str>,
    pub metric: MetricKind,
    pub final_metric: f64,
    pub train_metric: f64,
    pub held_out: bool,
    pub per_rank_metric: Vec<f64>,
    pub per_rank_metric_ranks: Vec<usize>,
    pub target: Option<f64>,
    pub target_on: TargetOn,
    pub time_to_target: Option<TimeToTarget>,
    pub counters: Counters,
    /// The mode's metrics, combined over ranks as each says (null when it has none).
    pub sync_metrics: serde_json::Value,
    pub phases: Phases,
    /// Null without declared step times.
    pub emulation: Option<EmulationSummary>,
    /// The last evaluation's round and metric, so the summary can say why the final model
    /// scores otherwise at the same round (null when nothing was evaluated).
    pub last_evaluation: Option<LastEvaluation>,
    /// `--patience`: whether the run stopped by it, and its best evaluation (null without it).
    pub early_stopping: Option<super::early_stop::EarlyStopping>,
    /// The restarts after lost ranks that `asap-train elastic` made (super::restart::Restart
    /// records; null when it made none or did not launch the run).
    pub restarts: serde_json::Value,
}

impl Summary {
    /// The metrics line (and the text kept in a saved model).
    pub fn to_json(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::to_value(self)?)
    }

    /// Rank 0's summary: at most 9 lines (the line budget of a default run is 25, docs/training.md).
    pub fn print(&self) {
        let kind = self.metric;
        let mm = |k: &str| self.counters.get(k).map_or((0.0, 0.0), |c| (c.mean, c.max));
        let (comp, comp_max) = mm("compute_seconds");
        let (comm_s, comm_max) = mm("comm_seconds");
        let (wait, wait_max) = mm("wait_seconds");
        let (sent, sent_max) = mm("bytes_sent");
        let (recv, recv_max) = mm("bytes_received");
        let ranks = self.ranks;
        println!("== asap-train summary ({ranks} rank{}, sync {}) ==", if ranks == 1 { "" } else { "s" }, self.sync);
        let how = if self.preempted {
            " (stopped by a signal)"
        } else if self.early_stopping.is_some_and(|e| e.stopped) {
            " (stopped early by --patience)"
        } else if self.stopped_early {
            " (stopped by --max-rounds or --stop-at-target)"
        } else {
            ""
        };
        println!(
            "epochs {:.2}, rounds {}{how}, {:.0} examples/s per rank in training",
            self.epochs, self.rounds, self.examples_per_second_per_rank
        );
        // The program's wall time is printed once, after MPI_Finalize (phases::teardown_line).
        println!("{}", self.phases.line());
        println!("per rank (mean / max): compute {comp:.2} / {comp_max:.2} s, communication {comm_s:.2} / {comm_max:.2} s, waiting {wait:.2} / {wait_max:.2} s");
        println!("bytes per rank (mean / max): sent {} / {}, received {} / {}", human(sent), human(sent_max), human(recv), human(recv_max));
        let metric = self.final_metric;
        if let Some(d) = self.objective_definition {
            println!("objective: {d}");
        }
        if self.held_out {
            println!(
                "final objective {:.6}, held-out {} (final model), training {}",
                self.objective,
                fmt_metric(kind, metric),
                fmt_metric(kind, self.train_metric)
            );
        } else {
            println!("final objective {:.6}, training {} (final model; no held-out set)", self.objective, fmt_metric(kind, metric));
        }
        // A non-finite metric was null in the JSON the summary was printed from: not compared.
        if let Some(LastEvaluation { round, metric: m }) = self.last_evaluation.filter(|l| l.metric.is_finite()) {
            if round == self.rounds && fmt_metric(kind, m) != fmt_metric(kind, metric) {
                println!(
                    "(the round-{round} evaluation scored {} on the average of the replicas then; the final model is what --sync {} builds after the last round, with the updates still in flight applied)",
                    fmt_metric(kind, m), self.sync
                );
            }
        }
        self.print_own_models();
        self.print_early_stopping();
        self.print_emulation();
        self.print_target();
    }

    /// The range of the ranks' own models' metrics (when they were scored).
    fn print_own_models(&self) {
        if self.per_rank_metric.is_empty() {
            return;
        }
        let kind = self.metric;
        let xs: Vec<f64> = self.per_rank_metric.iter().copied().filter(|x| x.is_finite()).collect();
        let lo = xs.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if xs.len() == self.ranks {
            println!("each rank's own model: {} .. {}", fmt_metric(kind, lo), fmt_metric(kind, hi));
        } else {
            println!(
                "own models of {} of {} ranks (evenly spaced, --own-models; 0 scores every rank): {} .. {}",
                xs.len(),
                self.ranks,
                fmt_metric(kind, lo),
                fmt_metric(kind, hi)
            );
        }
    }

    /// `--patience`: why the run stopped, and where its best evaluation was.
    fn print_early_stopping(&self) {
        let Some(e) = self.early_stopping else { return };
        let best = match e.best {
            Some(b) => format!("best held-out {} at epoch {:.2} (round {})", fmt_metric(self.metric, b.metric), b.epoch, b.round),
            None => "nothing evaluated".to_owned(),
        };
        if e.stopped {
            println!(
                "early stop at epoch {:.2}: no better held-out metric in {} evaluations (--patience {}); {best}; the saved model is the last",
                self.epochs, e.evaluations_since_best, e.patience
            );
        } else {
            println!("--patience {}: not reached ({} evaluations since the best); {best}", e.patience, e.evaluations_since_best);
        }
    }

    /// Whether the emulated cluster kept up (with `--emulate-compute`).
    fn print_emulation(&self) {
        let Some(e) = &self.emulation else { return };
        // `{:?}` writes the counts as the JSON did (2.0, not 2).
        println!(
            "emulated cluster ({} ms steps): {}: worst rank broke {:.2} % of its steps and drifted {:+.2} %, {:?} link overruns, CPU {:.0} % of {:?} cores",
            e.declared_step_ms,
            if e.valid {
                "valid"
            } else {
                // docs/emulation.md measured each remedy (issue 43: the advice left out the two
                // that made the README's runs valid).
                "INVALID (over 1 %: this machine could not keep up; give a --cluster profile a larger --dilation, run the \
                 ranks at a higher priority (`nice -n -20 mpirun ...`, or benches/priority.sh), use fewer ranks or longer \
                 steps; docs/emulation.md)"
            },
            100.0 * e.worst_rank_broken_fraction,
            100.0 * e.worst_rank_drift,
            e.link_overruns,
            100.0 * e.cpu_utilisation,
            e.cores
        );
        if let Some(j) = &e.jitter {
            println!(
                "step-time jitter {}: mean factor {:.3} declared, {:.3} drawn; the worst rank's draws {:.1} % from the declared quantiles",
                j.quantiles,
                j.mean_declared,
                j.mean_drawn,
                100.0 * j.worst_rank_quantile_error
            );
        }
    }

    /// Whether and when `--target` was reached.
    fn print_target(&self) {
        let Some(t) = self.target else { return };
        let on = serde_json::to_value(self.target_on).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "averaged".into());
        match self.time_to_target {
            Some(r) => {
                println!("target {t} ({on}) reached after {:.2} s of training (round {}, epoch {:.2})", r.train_seconds, r.round, r.epoch)
            }
            None => println!("target {t} ({on}) not reached"),
        }
    }
}

fn human(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.2} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}
