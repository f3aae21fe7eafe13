//! `asap-train`: see `asap-train --help` and README.md.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use asap_train::cli::{Cli, Command, TrainArgs};
use asap_train::comm::collectives::{OtherRankFailed, REPORTED};

/// The MPI rank from the launcher's environment, readable before MPI_Init (for log set-up).
fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

fn init_logging() {
    // Rank 0 logs at info, the others only warnings, so N ranks do not print N copies.
    let rank = launcher_rank();
    let default = if rank.unwrap_or(0) == 0 { "info" } else { "warn" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, rec| match rank {
            Some(r) => writeln!(buf, "[{} rank {r}] {}", rec.level(), rec.args()),
            None => writeln!(buf, "[{}] {}", rec.level(), rec.args()),
        })
        .init();
}

fn train(args: &TrainArgs) -> anyhow::Result<()> {
    let cfg = args.effective_config()?;
    let universe = asap_train::comm::init()?;
    let world = universe.world();
    asap_train::train::run(&cfg, &world)?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match &cli.command {
        None => train(&cli.train),
        Some(Command::Train(a)) => train(a),
        Some(Command::Graph(g)) => asap_train::graph::command::run(g),
        Some(Command::Data(d)) => asap_train::data::command::run(d),
        Some(Command::Bench(b)) => asap_train::bench::run(b),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors agreed on by all ranks were printed by the rank that had them; an error all
            // ranks found alike (bad option, bad graph) is printed once, by rank 0.
            let reported = e.chain().any(|c| c.to_string() == REPORTED) || e.downcast_ref::<OtherRankFailed>().is_some();
            if !reported && launcher_rank().unwrap_or(0) == 0 {
                eprintln!("asap-train: error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}
