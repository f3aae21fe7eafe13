//! Compiles `src/comm/shim.c`, which exports the MPI handles rsmpi's shim lacks (MPI_REPLACE,
//! MPI_NO_OP), against the same MPI the `mpi` crate uses: `$MPICC` if set, else `mpicc`.
//!
//! Where that MPI carries ULFM (Open MPI 5's `mpi-ext.h` declares `MPIX_ERR_PROC_FAILED`), the
//! shim also gets its fault-tolerance part (`ASAP_ULFM`) and the crate the cfg `ulfm`
//! (src/comm/ulfm.rs: a lost rank need not end the run). Debian's Open MPI 4.1.4 has no
//! `mpi-ext.h` with it, and MPICH's `MPIX_` fault tolerance is not used.

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

/// Whether one of the wrapper's include directories holds an `mpi-ext.h` whose fault-tolerance
/// extension (ULFM) declares `MPIX_ERR_PROC_FAILED`: Open MPI lays it out as
/// `mpi-ext.h` including `openmpi/mpiext/mpiext_ftmpi_c.h`.
fn has_ulfm(flags: &[String]) -> bool {
    flags.iter().filter_map(|f| f.strip_prefix("-I")).any(|dir| {
        let dir = std::path::Path::new(dir);
        let declares = |p: &std::path::Path| std::fs::read_to_string(p).is_ok_and(|t| t.contains("MPIX_ERR_PROC_FAILED"));
        dir.join("mpi-ext.h").exists() && (declares(&dir.join("mpi-ext.h")) || declares(&dir.join("openmpi/mpiext/mpiext_ftmpi_c.h")))
    })
}

fn main() {
    println!("cargo:rerun-if-changed=src/comm/shim.c");
    println!("cargo:rustc-check-cfg=cfg(ulfm)");
    println!("cargo:rerun-if-env-changed=MPICC");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_owned());
    let mut build = cc::Build::new();
    build.file("src/comm/shim.c");
    let flags = wrapper_flags(&mpicc);
    if flags.as_deref().is_some_and(has_ulfm) {
        println!("cargo:rustc-cfg=ulfm");
        build.define("ASAP_ULFM", "1");
    }
    match flags {
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
