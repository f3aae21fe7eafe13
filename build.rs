//! Compiles `src/comm/shim.c`, which exports the MPI handles rsmpi's shim lacks (MPI_REPLACE,
//! MPI_NO_OP), against the same MPI the `mpi` crate uses: `$MPICC` if set, else `mpicc`.

use std::process::Command;

/// Include directories and defines of the MPI compiler wrapper: Open MPI answers
/// `-showme:compile`, MPICH answers `-show` (the whole command line; only -I/-D are kept).
fn wrapper_flags(mpicc: &str) -> Option<Vec<String>> {
    for arg in ["-showme:compile", "-show"] {
        if let Ok(out) = Command::new(mpicc).arg(arg).output() {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                let flags: Vec<String> = text
                    .split_whitespace()
                    .filter(|f| f.starts_with("-I") || f.starts_with("-D") || f == &"-pthread")
                    .map(str::to_owned)
                    .collect();
                if !flags.is_empty() {
                    return Some(flags);
                }
            }
        }
    }
    None
}

fn main() {
    println!("cargo:rerun-if-changed=src/comm/shim.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_owned());
    let mut build = cc::Build::new();
    build.file("src/comm/shim.c");
    match wrapper_flags(&mpicc) {
        Some(flags) => {
            for f in flags {
                match f.strip_prefix("-I") {
                    Some(dir) => {
                        build.include(dir);
                    }
                    None => {
                        build.flag(&f);
                    }
                }
            }
        }
        // No flags to read (an unknown wrapper): let the wrapper compile the shim itself.
        None => {
            build.compiler(&mpicc);
        }
    }
    build.compile("asap_mpi_shim");
}
