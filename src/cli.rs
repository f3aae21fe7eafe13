//! The command line: `asap-train [train] [OPTIONS]`, `asap-train graph ...`, `asap-train data ...`,
//! `asap-train bench ...`, `asap-train plot ...`.

use std::path::PathBuf;

use clap::{ArgMatches, Args, CommandFactory, Parser, Subcommand};

use crate::config::{Merged, TrainConfig};

/// Data-parallel SGD over MPI. Launch with `mpirun -n N asap-train ...` or `srun`; every rank
/// trains a replica on its shard of the data and exchanges models as --sync says. With no
/// subcommand it runs `train` on the built-in default (Fashion-MNIST, softmax regression,
/// ASAP stochastic reduce on a graph chosen for the rank count, `--graph auto`).
/// `asap-train train --help` lists every training option.
#[derive(Parser, Debug)]
#[command(name = "asap-train", version, about, long_about = None, args_conflicts_with_subcommands = true, allow_negative_numbers = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of `train` (used when no subcommand is given).
    #[command(flatten)]
    pub train: TrainArgs,
}

/// The command line as parsed: [`Cli`]'s, with shorter help (issue 43: `train --help` was 630
/// lines, and the top-level `--help` repeated all of them).
/// - The top level accepts `train`'s options (no command runs `train`) but does not list them.
/// - `train -h` lists the options every run has; those of one mode, one model or the emulated
///   cluster (their headings name it: "ASAP (--sync asap)", "LDA (--model lda)") only in
///   `train --help`, which lists every option.
pub fn command() -> clap::Command {
    const ALL: &str = "With no command, asap-train runs `train` and takes its options: `asap-train train -h` lists the common \
                       ones, `asap-train train --help` every one.";
    const MORE: &str = "The options of one sync mode (--sync), one model (--model) and the emulated cluster are in \
                        `asap-train train --help`.";
    let only_in_long = |a: clap::Arg| {
        let heading = a.get_help_heading().unwrap_or("");
        let specific = heading.contains("(--sync") || heading.contains("(--model") || heading == "Emulated cluster";
        a.hide_short_help(specific)
    };
    Cli::command()
        .mut_args(|a| if matches!(a.get_id().as_str(), "help" | "version") { a } else { a.hide(true) })
        .after_help(ALL)
        .mut_subcommand("train", |t| t.mut_args(only_in_long).after_help(MORE))
}

/// The subcommands.
// `Train`'s options are much larger than the others', and the enum is built once per process:
// boxing them would only add a dereference to every use.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model (the main job; run it under mpirun or srun).
    #[command(allow_negative_numbers = true)]
    Train(TrainArgs),
    /// Launch `train` on N ranks (mpirun or srun) and, when a rank is lost, relaunch it on one
    /// rank fewer from the newest checkpoint (run it without mpirun).
    Elastic(crate::train::restart::ElasticArgs),
    /// Analyse communication graphs: spectral gap, comparisons, search (no MPI needed).
    Graph(crate::graph::command::GraphArgs),
    /// Convert and inspect data files.
    Data(crate::data::command::DataArgs),
    /// Single-rank throughput benchmark of every model on Fashion-MNIST.
    #[command(allow_negative_numbers = true)]
    Bench(crate::bench::BenchArgs),
    /// Plot the curves and histograms of `--metrics` files as one SVG (no MPI needed).
    Plot(crate::plot::PlotArgs),
    /// Score a data file with a model saved by `train --save-model` (no MPI needed).
    Predict(crate::predict::PredictArgs),
}

/// Options of `asap-train train`. Every option can also be set in a `--config` file (TOML or
/// JSON, keys spelled with underscores, e.g. `batch_size = 64`); flags override the file.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// TOML (.toml) or JSON config file with any of the options below; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (defaults, config file and flags resolved, and the
    /// defaults that depend on the run filled in: the run plan, src/train/plan.rs) on standard
    /// output at the start, once the data is loaded, as a JSON object alone that `--config` reads
    /// back for the same run (only the options that apply to this run; --save-config FILE writes
    /// it to a file). It is always stored in the metrics' start line, checkpoints and saved models.
    #[arg(long)]
    pub print_config: bool,
    #[command(flatten)]
    pub options: TrainConfig,
}

/// The resolved options of `asap-train train ARGS...` (`argv` begins with `train`), as `train`
/// would parse them (defaults, --config file, flags): what `asap-train elastic` checks before it
/// launches.
pub fn train_config_of(argv: &[String]) -> anyhow::Result<TrainConfig> {
    let matches = command().try_get_matches_from(std::iter::once("asap-train".to_owned()).chain(argv.iter().cloned()))?;
    let sub = matches.subcommand_matches("train").ok_or_else(|| anyhow::anyhow!("asap-train elastic: give `-- train OPTIONS`"))?;
    let args = <TrainArgs as clap::FromArgMatches>::from_arg_matches(sub)?;
    Ok(args.effective_config(sub)?.options)
}

impl TrainArgs {
    /// Defaults, then the config file, then the flags given on the command line (`matches` are
    /// the parsed arguments these options came from; they tell flags from defaults).
    pub fn effective_config(&self, matches: &ArgMatches) -> anyhow::Result<Merged> {
        TrainConfig::merge(self.config.as_deref(), self.options.clone(), Some(matches))
    }
}
