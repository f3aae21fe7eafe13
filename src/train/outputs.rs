//! Output paths are checked before any data is read, so a typo never costs a finished run and an
//! output never overwrites an input: `--metrics`, `--save-model`, `--save-config`,
//! `--checkpoint-dir` and every rank's `--send-log` file must be writable, distinct from each
//! other, and none may be `--data`, `--test-data` or `--config` (compared by device and inode
//! where the file exists, by canonical path where it does not).
//!
//! Directories: each option creates what it names (the file, or the checkpoint directory itself)
//! and nothing above it. A missing directory above an output is an error naming the option, the
//! path and the missing directory, unless `--create-dirs` asks for it to be created (mkdir -p).
//! Why not always create: a mistyped directory (`/scratch/usr/...` for `/scratch/user/...`, a
//! node-local path on a cluster) would otherwise be created silently and the run's results would
//! land where nobody looks, or on a disk that is wiped when the job ends.

use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::config::TrainConfig;

/// What identifies a file: its inode when it exists, else its canonical would-be path.
#[derive(Debug, PartialEq, Eq)]
enum FileId {
    Inode(u64, u64),
    Path(PathBuf),
}

fn file_id(path: &Path) -> FileId {
    if let Ok(m) = std::fs::metadata(path) {
        return FileId::Inode(m.dev(), m.ino());
    }
    let base = std::fs::canonicalize(parent_of(path)).unwrap_or_else(|_| parent_of(path).to_path_buf());
    FileId::Path(base.join(path.file_name().unwrap_or_default()))
}

/// The directory a path lives in ("." for a bare file name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Makes sure `dir` exists as a directory: created (with every missing ancestor) when `create`,
/// otherwise an error naming `what` (the option and its path) and the first missing directory.
fn ensure_dir(dir: &Path, what: &str, create: bool) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => bail!("{what}: {} is not a directory", dir.display()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => bail!("{what}: cannot use directory {}: {e}", dir.display()),
        Err(_) => {}
    }
    if create {
        return std::fs::create_dir_all(dir).with_context(|| format!("{what}: cannot create directory {}", dir.display()));
    }
    // Name the highest missing directory: that is the one to create (or the typo).
    let mut missing = dir;
    while let Some(up) = missing.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing = up;
    }
    bail!("{what}: directory {} does not exist; create it (mkdir -p {}) or give --create-dirs", missing.display(), dir.display())
}

/// Proves a file can be created in the directory `dir` (a probe file, removed again).
fn check_can_create_in(dir: &Path, what: &str) -> anyhow::Result<()> {
    let probe = dir.join(format!(".asap-train-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{what}: cannot create files in {}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// How a file output is written: `Replace` writes a temporary file and renames it over the path
/// (--save-model), `InPlace` opens the path itself for writing (--metrics, --send-log).
#[derive(Clone, Copy, PartialEq)]
enum Write {
    Replace,
    InPlace,
}

fn check_file_output(path: &Path, what: &str, how: Write, create: bool) -> anyhow::Result<()> {
    if path.as_os_str().is_empty() {
        bail!("{what}: the path is empty");
    }
    let dir = parent_of(path);
    ensure_dir(dir, what, create)?;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{what} is a directory; give a file name"),
        Ok(m) if how == Write::Replace && !m.is_file() => {
            bail!("{what} exists and is not a regular file (it would be replaced by the model file); give another path")
        }
        Ok(m) => {
            // Written where it is: open it for writing now, without truncating, and without
            // blocking on a FIFO that has no reader (that is an error: nothing would read it).
            let fifo = m.file_type().is_fifo();
            std::fs::OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .with_context(|| format!("{what}: cannot open for writing{}", if fifo { " (a FIFO without a reader)" } else { "" }))?;
            if how == Write::Replace {
                check_can_create_in(dir, what)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => check_can_create_in(dir, what),
        Err(e) => bail!("{what}: cannot use this path: {e}"),
    }
}

fn check_checkpoint_dir(path: &Path, what: &str, create: bool) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{what} is not a directory; give a directory"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The directory itself is what the option names: created when its parent exists.
            ensure_dir(parent_of(path), what, create)?;
            if let Err(e) = std::fs::create_dir(path) {
                if !path.is_dir() {
                    return Err(e).with_context(|| format!("{what}: cannot create the directory"));
                }
            }
        }
        Err(e) => bail!("{what}: cannot use this path: {e}"),
    }
    check_can_create_in(path, what)
}

/// The send log file of `rank` for `--send-log PREFIX`.
pub fn send_log_path(prefix: &str, rank: usize) -> String {
    format!("{prefix}.rank{rank}.csv")
}

/// The inbound link's log of `rank` for `--send-log PREFIX` (modes that model the receiver's
/// link, with per-rank links emulated).
pub fn receive_log_path(prefix: &str, rank: usize) -> String {
    format!("{prefix}.receives.rank{rank}.csv")
}

/// The link logs of `rank` for `--send-log PREFIX` with `--emulate-groups`: every message to
/// another rank with its times on the wall clock, and every reservation of the shared group
/// links (a message in slow start takes several, a window each).
pub fn link_log_paths(prefix: &str, rank: usize) -> (String, String) {
    (format!("{prefix}.links.rank{rank}.csv"), format!("{prefix}.wan.rank{rank}.csv"))
}

/// Checks every output of `cfg` that `rank` writes (see the module doc): rank 0 writes the
/// metrics, the model and the checkpoints; every rank writes its own send log. Every rank calls
/// this and the ranks agree on the result, so a bad path stops all of them before training.
pub fn check(cfg: &TrainConfig, rank: usize) -> anyhow::Result<()> {
    let inputs: Vec<(&str, &str)> =
        [("--data", Some(cfg.data.as_str())), ("--test-data", cfg.test_data.as_deref()), ("--config", cfg.config_file.as_deref())]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
    let send_log = cfg.send_log.as_deref().map(|p| send_log_path(p, rank));
    let outputs: Vec<(&str, &str)> = [
        ("--metrics", cfg.metrics.as_deref().filter(|_| rank == 0)),
        ("--save-model", cfg.save_model.as_deref().filter(|_| rank == 0)),
        ("--save-config", cfg.save_config.as_deref().filter(|_| rank == 0)),
        ("--checkpoint-dir", cfg.checkpoint_dir.as_deref().filter(|_| rank == 0)),
        ("--send-log", send_log.as_deref()),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v?)))
    .collect();
    for (i, (opt, path)) in outputs.iter().enumerate() {
        let id = file_id(Path::new(path));
        for (iopt, ipath) in &inputs {
            if file_id(Path::new(ipath)) == id {
                bail!("{opt} {path} is the same file as {iopt} {ipath}: the run would overwrite its input; choose another path");
            }
        }
        for (oopt, opath) in &outputs[..i] {
            if file_id(Path::new(opath)) == id {
                bail!("{opt} {path} is the same path as {oopt} {opath}: one output would overwrite the other");
            }
        }
        let what = format!("{opt} {path}");
        match *opt {
            "--checkpoint-dir" => check_checkpoint_dir(Path::new(path), &what, cfg.create_dirs)?,
            "--save-model" => check_file_output(Path::new(path), &what, Write::Replace, cfg.create_dirs)?,
            _ => check_file_output(Path::new(path), &what, Write::InPlace, cfg.create_dirs)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_must_not_be_inputs_or_each_other_and_must_be_writable() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("train.svm");
        std::fs::write(&data, "1 1:1\n").unwrap();
        let p = |x: &Path| x.to_string_lossy().into_owned();
        let cfg = |f: &dyn Fn(&mut TrainConfig)| {
            let mut c = TrainConfig { data: p(&data), test_data: None, ..TrainConfig::default() };
            f(&mut c);
            c
        };
        let err = |c: TrainConfig| check(&c, 0).unwrap_err().to_string();
        assert!(check(&cfg(&|c| c.metrics = Some(p(&dir.path().join("m.jsonl")))), 0).is_ok());
        // The same file under another name (a relative path through "."), as an output.
        let alias = dir.path().join(".").join("train.svm");
        let e = err(cfg(&|c| c.metrics = Some(p(&alias))));
        assert!(e.contains("--metrics") && e.contains("--data"), "{e}");
        let e = err(cfg(&|c| {
            c.metrics = Some(p(&dir.path().join("out.h5")));
            c.save_model = Some(p(&dir.path().join("out.h5")));
        }));
        assert!(e.contains("--save-model") && e.contains("--metrics"), "{e}");
        let e = err(cfg(&|c| c.save_model = Some(p(dir.path()))));
        assert!(e.contains("is a directory"), "{e}");
        let e = err(cfg(&|c| c.checkpoint_dir = Some(p(&data))));
        assert!(e.contains("--data") || e.contains("is not a directory"), "{e}");
        let e = err(cfg(&|c| c.metrics = Some("/proc/no-such-dir/m.jsonl".into())));
        assert!(e.contains("--metrics"), "{e}");
        // A configuration written over the file it was read from.
        let e = err(cfg(&|c| {
            c.config_file = Some(p(&dir.path().join("run.toml")));
            c.save_config = Some(p(&dir.path().join("run.toml")));
        }));
        assert!(e.contains("--save-config") && e.contains("same file as --config"), "{e}");
    }

    /// A missing directory above any output is an error naming the option and the highest
    /// missing directory, and nothing is created; --create-dirs creates it for every option.
    #[test]
    fn missing_directories_are_errors_unless_create_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let p = |x: &Path| x.to_string_lossy().into_owned();
        let missing = dir.path().join("typo");
        let deep = missing.join("a");
        type SetOption = fn(&mut TrainConfig, String);
        let set: [(&str, SetOption); 4] = [
            ("--metrics", |c, v| c.metrics = Some(v + "/m.jsonl")),
            ("--save-model", |c, v| c.save_model = Some(v + "/m.h5")),
            ("--checkpoint-dir", |c, v| c.checkpoint_dir = Some(v + "/ck")),
            ("--send-log", |c, v| c.send_log = Some(v + "/sends")),
        ];
        for (opt, f) in set {
            let mut c = TrainConfig { data: "unused".into(), test_data: None, ..TrainConfig::default() };
            f(&mut c, p(&deep));
            let e = check(&c, 0).unwrap_err().to_string();
            assert!(
                e.contains(opt) && e.contains(&format!("directory {} does not exist", missing.display())) && e.contains("--create-dirs"),
                "{e}"
            );
            assert!(!missing.exists(), "{opt}: created {}", missing.display());
            c.create_dirs = true;
            check(&c, 0).unwrap_or_else(|e| panic!("{opt} with --create-dirs: {e}"));
            assert!(deep.is_dir(), "{opt}: --create-dirs did not create {}", deep.display());
            std::fs::remove_dir_all(&missing).unwrap();
        }
        // The checkpoint directory itself is what the option names: made when its parent exists.
        let ck = dir.path().join("ck");
        let c = TrainConfig { data: "unused".into(), test_data: None, checkpoint_dir: Some(p(&ck)), ..TrainConfig::default() };
        check(&c, 0).unwrap();
        assert!(ck.is_dir());
        // A file where a directory should be.
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let c = TrainConfig {
            data: "unused".into(),
            test_data: None,
            metrics: Some(p(&file.join("m.jsonl"))),
            create_dirs: true,
            ..TrainConfig::default()
        };
        let e = check(&c, 0).unwrap_err().to_string();
        assert!(e.contains("--metrics") && e.contains("is not a directory"), "{e}");
    }

    /// Rank 0 checks what rank 0 writes; every rank checks its own send log.
    #[test]
    fn each_rank_checks_what_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("nope").join("x").to_string_lossy().into_owned();
        let c = TrainConfig { data: "unused".into(), test_data: None, metrics: Some(bad.clone()), ..TrainConfig::default() };
        assert!(check(&c, 0).is_err());
        assert!(check(&c, 3).is_ok(), "rank 3 writes no metrics");
        let c = TrainConfig { data: "unused".into(), test_data: None, send_log: Some(bad), ..TrainConfig::default() };
        let e = check(&c, 3).unwrap_err().to_string();
        assert!(e.contains("--send-log") && e.contains(".rank3.csv"), "{e}");
    }

    /// Existing outputs that are not regular files: a FIFO without a reader is refused at once
    /// (opening it for writing would block forever); a device is never replaced by a model file.
    #[test]
    fn special_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let c = TrainConfig {
            data: "unused".into(),
            test_data: None,
            metrics: Some(fifo.to_string_lossy().into_owned()),
            ..TrainConfig::default()
        };
        let e = check(&c, 0).unwrap_err().to_string();
        assert!(e.contains("--metrics") && e.contains("FIFO without a reader"), "{e}");
        let c = TrainConfig { data: "unused".into(), test_data: None, save_model: Some("/dev/null".into()), ..TrainConfig::default() };
        let e = check(&c, 0).unwrap_err().to_string();
        assert!(e.contains("--save-model /dev/null") && e.contains("not a regular file"), "{e}");
        let c = TrainConfig { data: "unused".into(), test_data: None, metrics: Some("/dev/null".into()), ..TrainConfig::default() };
        check(&c, 0).unwrap();
    }
}
