//! Output paths are checked before any data is read, so a typo never costs a finished run and an
//! output never overwrites an input: `--metrics`, `--save-model` and `--checkpoint-dir` must be
//! writable, distinct from each other, and none may be `--data`, `--test-data` or `--config`
//! (compared by device and inode where the file exists, by canonical path where it does not).

use std::os::unix::fs::MetadataExt;
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
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
    FileId::Path(base.join(path.file_name().unwrap_or_default()))
}

/// Creates `dir` if needed and proves a file can be created in it.
fn check_writable_dir(dir: &Path, what: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{what}: cannot create directory {}", dir.display()))?;
    let probe = dir.join(format!(".asap-train-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{what}: cannot write in {}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn check_writable_file(path: &Path, what: &str) -> anyhow::Result<()> {
    if path.is_dir() {
        bail!("{what} {} is a directory; give a file name", path.display());
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    check_writable_dir(dir, what)
}

/// Checks every output of `cfg` (see the module doc). Rank 0 writes the outputs, so rank 0 runs
/// this and the ranks agree on the result.
pub fn check(cfg: &TrainConfig) -> anyhow::Result<()> {
    let inputs: Vec<(&str, &str)> = [("--data", Some(cfg.data.as_str())), ("--test-data", cfg.test_data.as_deref()), ("--config", cfg.config_file.as_deref())]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
    let outputs: Vec<(&str, &str)> = [("--metrics", cfg.metrics.as_deref()), ("--save-model", cfg.save_model.as_deref()), ("--checkpoint-dir", cfg.checkpoint_dir.as_deref())]
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
        match *opt {
            "--checkpoint-dir" => {
                if Path::new(path).is_file() {
                    bail!("--checkpoint-dir {path} is a file; give a directory");
                }
                check_writable_dir(Path::new(path), opt)?;
            }
            _ => check_writable_file(Path::new(path), opt)?,
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
        assert!(check(&cfg(&|c| c.metrics = Some(p(&dir.path().join("m.jsonl"))))).is_ok());
        // The same file under another name (a relative path through "."), as an output.
        let alias = dir.path().join(".").join("train.svm");
        let e = check(&cfg(&|c| c.metrics = Some(p(&alias)))).unwrap_err().to_string();
        assert!(e.contains("--metrics") && e.contains("--data"), "{e}");
        let e = check(&cfg(&|c| {
            c.metrics = Some(p(&dir.path().join("out.h5")));
            c.save_model = Some(p(&dir.path().join("out.h5")));
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--save-model") && e.contains("--metrics"), "{e}");
        let e = check(&cfg(&|c| c.save_model = Some(p(dir.path())))).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = check(&cfg(&|c| c.checkpoint_dir = Some(p(&data)))).unwrap_err().to_string();
        assert!(e.contains("--data") || e.contains("is a file"), "{e}");
        let e = check(&cfg(&|c| c.metrics = Some("/proc/no-such-dir/m.jsonl".into()))).unwrap_err().to_string();
        assert!(e.contains("--metrics"), "{e}");
    }
}
