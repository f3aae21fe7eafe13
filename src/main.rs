//! `asap-train`: see `asap-train --help` and README.md.

use std::io::Write;
use std::process::ExitCode;

use clap::FromArgMatches;
use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;

use asap_train::cli::{Cli, Command, TrainArgs};
use asap_train::comm::collectives::{OtherRankFailed, REPORTED};
use asap_train::train::phases;

/// The MPI rank from the launcher's environment, readable before MPI_Init (for log set-up).
fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok())
}

fn init_logging() {
    // Rank 0 logs at info, the others only warnings, so N ranks do not print N copies.
    let rank = launcher_rank();
    // Graph messages (the choice of --graph auto, the graph's analysis, its warnings) come from
    // a pure function of the options and the rank count that every rank evaluates alike, so only
    // rank 0 prints them: N copies of one warning told nothing more.
    let default = if rank.unwrap_or(0) == 0 { "info" } else { "warn,asap_train::graph=error" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, rec| match rank {
            Some(r) => writeln!(buf, "[{} rank {r}] {}", rec.level(), rec.args()),
            None => writeln!(buf, "[{}] {}", rec.level(), rec.args()),
        })
        .init();
}

/// Prints an error once: errors agreed on by all ranks were printed by the rank that had them;
/// an error all ranks found alike (bad option, bad graph) is printed by rank 0.
fn report(e: &anyhow::Error, rank: usize) {
    let reported = e.chain().any(|c| c.to_string() == REPORTED) || e.downcast_ref::<OtherRankFailed>().is_some();
    if !reported && rank == 0 {
        eprintln!("asap-train: error: {e:#}");
    }
}

/// Training returns an error only when every rank has one (errors of a single rank abort the
/// job instead), so all ranks can meet in a barrier after rank 0 printed it: otherwise mpirun may
/// kill rank 0 for another rank's early exit before the message is out.
fn train(args: &TrainArgs, matches: &clap::ArgMatches) -> ExitCode {
    let universe = match asap_train::comm::init() {
        Ok(u) => u,
        Err(e) => {
            report(&e, launcher_rank().unwrap_or(0));
            return ExitCode::FAILURE;
        }
    };
    phases::mark_mpi_initialised();
    // From here on SIGTERM/SIGUSR1 only ask for a stop at the first vote round of training. If
    // the handlers came only with the training loop, a signal during set-up (loading a large data
    // set takes minutes) would end the ranks that had not reached the loop yet and leave the
    // others waiting for them.
    asap_train::comm::preempt::install_handlers();
    let world = universe.world();
    let rank = world.rank();
    let merged = args.effective_config(matches);
    let metrics = merged.as_ref().ok().and_then(|m| m.options.metrics.clone());
    let result = merged.and_then(|merged| asap_train::train::run(merged, &world, args.print_config));
    phases::mark_run_returned();
    let code = match result {
        Ok(s) if s.preempted => ExitCode::from(asap_train::train::PREEMPTED_EXIT),
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, rank as usize);
            world.barrier();
            ExitCode::FAILURE
        }
    };
    // MPI_Finalize, then rank 0 says how long the shutdown took.
    drop(world);
    drop(universe);
    if rank == 0 {
        if let Some(line) = phases::teardown_line(metrics.as_deref()) {
            eprintln!("{line}");
        }
    }
    if let Some(d) = asap_train::comm::linger_after_finalize() {
        std::thread::sleep(d);
    }
    code
}

fn main() -> ExitCode {
    phases::mark_process_start();
    let matches = asap_train::cli::command().try_get_matches().unwrap_or_else(|e| match asap_train::config::retired_option_hint(&e) {
        Some(hint) => {
            eprintln!("error: {hint}");
            std::process::exit(2)
        }
        None => e.exit(),
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging();
    let result = match &cli.command {
        None => return train(&cli.train, &matches),
        Some(Command::Train(a)) => return train(a, matches.subcommand_matches("train").expect("clap matched train")),
        Some(Command::Elastic(e)) => match asap_train::train::restart::run(e, &asap_train::cli::train_config_of) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Some(Command::Graph(g)) => asap_train::graph::command::run(g),
        Some(Command::Data(d)) => asap_train::data::command::run(d),
        Some(Command::Bench(b)) => asap_train::bench::run(b),
        Some(Command::Plot(p)) => asap_train::plot::run(p),
        Some(Command::Predict(p)) => asap_train::predict::run(p),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, 0);
            ExitCode::FAILURE
        }
    }
}
