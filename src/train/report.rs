//! What rank 0 shows and writes: a progress bar (terminal) or plain progress lines (log files),
//! and the JSON-lines metrics file.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::time::Instant;

use anyhow::Context;

/// Least time between two progress lines in a log (not a terminal), after the first.
pub const LOG_LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Progress display on rank 0.
pub struct Progress {
    enabled: bool,
    terminal: bool,
    total_rounds: u64,
    last_draw: Instant,
    last_percent_line: u64,
    /// When the last plain progress line was printed (a log gets one at most every
    /// [`LOG_LINE_EVERY`] after the first).
    last_line: Option<Instant>,
    start: Instant,
    pub last_metric: String,
}

impl Progress {
    /// `enabled` is true on rank 0 only.
    pub fn new(enabled: bool, total_rounds: u64) -> Self {
        Progress {
            enabled,
            terminal: std::io::stderr().is_terminal(),
            total_rounds: total_rounds.max(1),
            last_draw: Instant::now(),
            last_percent_line: 0,
            last_line: None,
            start: Instant::now(),
            last_metric: String::from("-"),
        }
    }

    /// Called after every round; redraws at most 5 times a second on a terminal. In a log it
    /// prints a line when the run passes 10 % (a sign that training is under way) and at later
    /// 10 % steps only when [`LOG_LINE_EVERY`] has passed since the last line: a short run's log
    /// then holds its evaluations and summary instead of ten progress lines (a default run prints
    /// at most 25 lines), and a long run still shows it is alive.
    pub fn tick(&mut self, round: u64, epoch: f64) {
        if !self.enabled {
            return;
        }
        let frac = (round as f64 / self.total_rounds as f64).min(1.0);
        if self.terminal {
            if self.last_draw.elapsed().as_millis() < 200 && round < self.total_rounds {
                return;
            }
            self.last_draw = Instant::now();
            let width = 30;
            let filled = (frac * width as f64) as usize;
            eprint!(
                "\r[{}{}] {:5.1}% round {}/{} epoch {:.2} | {} | {:.1}s   ",
                "=".repeat(filled),
                " ".repeat(width - filled),
                100.0 * frac,
                round,
                self.total_rounds,
                epoch,
                self.last_metric,
                self.start.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        } else {
            let tenth = (frac * 10.0) as u64;
            if tenth > self.last_percent_line {
                self.last_percent_line = tenth;
                if self.last_line.is_some_and(|t| t.elapsed() < LOG_LINE_EVERY) {
                    return;
                }
                self.last_line = Some(Instant::now());
                eprintln!(
                    "progress: {:3.0}% round {}/{} epoch {:.2} ({:.1}s)",
                    100.0 * frac,
                    round,
                    self.total_rounds,
                    epoch,
                    self.start.elapsed().as_secs_f64()
                );
            }
        }
    }

    /// Prints an evaluation line (clearing the bar first on a terminal).
    pub fn line(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        if self.terminal {
            eprint!("\r{:100}\r", "");
        }
        eprintln!("{text}");
    }

    /// Ends the bar.
    pub fn finish(&mut self) {
        if self.enabled && self.terminal {
            eprintln!();
        }
    }
}

/// JSON-lines metrics file (rank 0 only).
pub struct MetricsFile {
    out: Option<BufWriter<File>>,
}

impl MetricsFile {
    /// Opens `path` for writing (truncating, or appending when resuming) on rank 0; a no-op
    /// elsewhere or when `path` is None.
    pub fn open(path: Option<&str>, rank0: bool, append: bool) -> anyhow::Result<Self> {
        let out = match (path, rank0) {
            (Some(p), true) => {
                // Its directory exists: outputs::check made it (or found it) before training.
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(append)
                    .truncate(!append)
                    .open(p)
                    .with_context(|| format!("cannot open metrics file {p}"))?;
                Some(BufWriter::new(f))
            }
            _ => None,
        };
        Ok(MetricsFile { out })
    }

    /// Writes one JSON object as a line and flushes it (so a plot can follow a running job).
    pub fn write(&mut self, v: &serde_json::Value) -> anyhow::Result<()> {
        if let Some(o) = self.out.as_mut() {
            serde_json::to_writer(&mut *o, v)?;
            o.write_all(b"\n")?;
            o.flush()?;
        }
        Ok(())
    }
}
