//! A table of malformed inputs (issue 17, item 7). For each, a real 2-rank `mpirun` job must:
//! exit non-zero within its time limit (never hang), print a message naming the file and the
//! place (file:line:column for text, dataset[element] or row for HDF5, the header for IDX),
//! leave every input file unchanged, and leave no process behind. The same defect in LIBSVM and
//! HDF5 is refused by both (item 6).

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::Array1;

/// One malformed input: the file to train on (made by `make`), extra options, and the
/// substrings the output must contain.
struct Case {
    name: &'static str,
    make: fn(&Path) -> String,
    args: &'static [&'static str],
    needles: &'static [&'static str],
}

fn svm(dir: &Path, name: &str, text: &str) -> String {
    write(dir, name, text)
}

/// A CSR HDF5 file: `indptr`, `indices` and `data` of the given element types, labels `y`.
fn csr<I: hdf5::H5Type + Clone, D: hdf5::H5Type + Clone>(
    dir: &Path,
    name: &str,
    indptr: &[i64],
    indices: &[I],
    data: &[D],
    y: &[f64],
) -> String {
    let p = dir.join(name);
    let f = hdf5::File::create(&p).unwrap();
    f.new_dataset_builder().with_data(&Array1::from(indptr.to_vec())).create("indptr").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(indices.to_vec())).create("indices").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(data.to_vec())).create("data").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(y.to_vec())).create("y").unwrap();
    f.close().unwrap();
    p.to_string_lossy().into_owned()
}

fn dense(dir: &Path, name: &str, x: &[f64], d: usize, y: &[f64]) -> String {
    let p = dir.join(name);
    let f = hdf5::File::create(&p).unwrap();
    let a = ndarray::Array2::from_shape_vec((x.len() / d, d), x.to_vec()).unwrap();
    f.new_dataset_builder().with_data(&a).create("X").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(y.to_vec())).create("y").unwrap();
    f.close().unwrap();
    p.to_string_lossy().into_owned()
}

fn ratings_h5(dir: &Path, name: &str, users: &[f64], items: &[i64], r: &[f64]) -> String {
    let p = dir.join(name);
    let f = hdf5::File::create(&p).unwrap();
    f.new_dataset_builder().with_data(&Array1::from(users.to_vec())).create("user").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(items.to_vec())).create("item").unwrap();
    f.new_dataset_builder().with_data(&Array1::from(r.to_vec())).create("rating").unwrap();
    f.close().unwrap();
    p.to_string_lossy().into_owned()
}

/// An IDX images/labels pair whose header promises `n` images of `r` x `c` bytes but holds 64.
fn idx(dir: &Path, stem: &str, n: u32, r: u32, c: u32, gz: bool) -> String {
    let ext = if gz { ".gz" } else { "" };
    let mut img = vec![0, 0, 8, 3];
    [n, r, c].iter().for_each(|d| img.extend(d.to_be_bytes()));
    img.extend([7u8; 64]);
    let mut lab = vec![0, 0, 8, 1];
    lab.extend(n.to_be_bytes());
    lab.extend([1u8; 64]);
    let put = |name: String, bytes: &[u8]| {
        let p = dir.join(name);
        if gz {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&p).unwrap(), flate2::Compression::fast());
            e.write_all(bytes).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(&p, bytes).unwrap();
        }
        p.to_string_lossy().into_owned()
    };
    put(format!("{stem}-labels-idx1-ubyte{ext}"), &lab);
    put(format!("{stem}-images-idx3-ubyte{ext}"), &img)
}

const GOOD: &str = "+1 1:0.5 2:1\n-1 1:1\n+1 2:0.25\n-1 1:0.75 3:1\n";

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "fifo",
            make: |d| {
                let p = d.join("pipe.svm");
                assert!(std::process::Command::new("mkfifo").arg(&p).status().unwrap().success());
                p.to_string_lossy().into_owned()
            },
            args: &["--model", "svm"],
            needles: &["pipe.svm", "named pipe (FIFO)"],
        },
        Case {
            name: "directory",
            make: |d| {
                let p = d.join("adir.svm");
                std::fs::create_dir(&p).unwrap();
                p.to_string_lossy().into_owned()
            },
            args: &["--model", "svm"],
            needles: &["adir.svm", "directory"],
        },
        Case {
            name: "svm-nan-value",
            make: |d| svm(d, "nan.svm", &format!("{GOOD}+1 1:1 2:nan\n")),
            args: &["--model", "svm"],
            needles: &["nan.svm:5:", "NaN"],
        },
        Case {
            name: "svm-inf-label",
            make: |d| svm(d, "inf.svm", &format!("inf 1:1\n{GOOD}")),
            args: &["--model", "svm"],
            needles: &["inf.svm:1:1", "infinite"],
        },
        Case {
            name: "svm-overflow-value",
            make: |d| svm(d, "big.svm", &format!("{GOOD}-1 2:1e39\n")),
            args: &["--model", "svm"],
            needles: &["big.svm:5:", "too large"],
        },
        Case {
            name: "svm-index-above-2^32",
            make: |d| svm(d, "alias.svm", &format!("{GOOD}+1 1:1 4294967297:1\n")),
            args: &["--model", "svm"],
            needles: &["alias.svm:5:8", "4294967297"],
        },
        Case {
            name: "svm-negative-index",
            make: |d| svm(d, "neg.svm", &format!("{GOOD}+1 -2:1\n")),
            args: &["--model", "svm"],
            needles: &["neg.svm:5:", "1-based"],
        },
        Case {
            name: "svm-fractional-index",
            make: |d| svm(d, "frac.svm", &format!("{GOOD}+1 1.5:1\n")),
            args: &["--model", "svm"],
            needles: &["frac.svm:5:", "integer index"],
        },
        Case {
            name: "svm-unsorted-index",
            make: |d| svm(d, "order.svm", &format!("{GOOD}+1 3:1 2:1\n")),
            args: &["--model", "svm"],
            needles: &["order.svm:5:", "increase"],
        },
        Case {
            name: "svm-index-needs-terabytes",
            make: |d| svm(d, "wide.svm", &format!("{}9 4294967295:1\n1 2:1\n", "0 1:1\n".repeat(44))),
            args: &["--model", "mlr"],
            needles: &["wide.svm:45", "feature index 4294967295", "memory available"],
        },
        Case {
            name: "svm-label-needs-terabytes",
            make: |d| svm(d, "label.svm", "0 1:1\n1 2:1\n1000000000000 1:1\n0 2:1\n"),
            args: &["--model", "mlr"],
            needles: &["label.svm:3", "label 1000000000000", "memory available"],
        },
        Case {
            name: "svm-comments-only",
            make: |d| svm(d, "empty.svm", "# nothing here\n\n# at all\n"),
            args: &["--model", "svm"],
            needles: &["empty.svm", "0 training examples cannot feed 2 ranks"],
        },
        Case {
            name: "ratings-fractional-id",
            make: |d| write(d, "r.ratings", "0 1 4\n1 2.5 3\n2 0 5\n"),
            args: &["--model", "mf"],
            needles: &["r.ratings:2:3", "item id"],
        },
        Case {
            name: "ratings-id-needs-terabytes",
            make: |d| write(d, "ids.ratings", "0 1 4\n1 2 3\n4294967295 0 5\n3 3 1\n"),
            args: &["--model", "mf", "--rank", "1000"],
            needles: &["ids.ratings:3", "user id 4294967295", "memory available"],
        },
        Case {
            name: "h5-nan-in-X",
            make: |d| dense(d, "nan.h5", &[1.0, 2.0, 3.0, 4.0, f64::NAN, 6.0, 7.0, 8.0], 2, &[0.0, 1.0, 0.0, 1.0]),
            args: &[],
            needles: &["nan.h5", "`X`[2, 0]", "NaN"],
        },
        Case {
            name: "h5-inf-label",
            make: |d| dense(d, "inf.h5", &[1.0; 8], 2, &[0.0, f64::INFINITY, 0.0, 1.0]),
            args: &[],
            needles: &["inf.h5", "`y`[1]", "inf"],
        },
        Case {
            name: "h5-overflow-value",
            make: |d| dense(d, "big.h5", &[1.0, 2.0, 3.0, 1e300, 5.0, 6.0, 7.0, 8.0], 2, &[0.0, 1.0, 0.0, 1.0]),
            args: &[],
            needles: &["big.h5", "`X`[1, 1]", "too large"],
        },
        Case {
            name: "h5-negative-index",
            make: |d| csr(d, "neg.h5", &[0, 1, 2, 3, 4], &[0i64, 1, -1, 0], &[1f32; 4], &[1.0, -1.0, 1.0, -1.0]),
            args: &["--model", "svm"],
            needles: &["neg.h5", "`indices`[2]", "negative"],
        },
        Case {
            name: "h5-fractional-index",
            make: |d| csr(d, "frac.h5", &[0, 1, 2, 3, 4], &[0f64, 1.5, 1.0, 0.0], &[1f32; 4], &[1.0, -1.0, 1.0, -1.0]),
            args: &["--model", "svm"],
            needles: &["frac.h5", "`indices`[1]", "not an integer"],
        },
        Case {
            name: "h5-index-above-2^32",
            make: |d| csr(d, "alias.h5", &[0, 1, 2, 3, 4], &[0i64, 1, 4294967296, 0], &[1f32; 4], &[1.0, -1.0, 1.0, -1.0]),
            args: &["--model", "svm"],
            needles: &["alias.h5", "`indices`[2]", "above"],
        },
        Case {
            name: "h5-unsorted-row",
            make: |d| csr(d, "order.h5", &[0, 1, 3, 4, 5], &[0i64, 2, 1, 0, 1], &[1f32; 5], &[1.0, -1.0, 1.0, -1.0]),
            args: &["--model", "svm"],
            needles: &["order.h5", "row 1", "increase"],
        },
        Case {
            name: "h5-decreasing-indptr",
            make: |d| csr(d, "ptr.h5", &[0, 2, 1, 3, 4], &[0i64, 1, 0, 1], &[1f32; 4], &[1.0, -1.0, 1.0, -1.0]),
            args: &["--model", "svm"],
            needles: &["ptr.h5", "`indptr`[2]", "decrease"],
        },
        Case {
            name: "h5-negative-user",
            make: |d| ratings_h5(d, "neg-user.h5", &[0.0, -1.0, 2.0, 3.0], &[0, 1, 2, 3], &[1.0, 2.0, 3.0, 4.0]),
            args: &["--model", "mf"],
            needles: &["neg-user.h5", "`user`[1]", "negative"],
        },
        Case {
            name: "h5-fractional-user",
            make: |d| ratings_h5(d, "frac-user.h5", &[0.0, 1.0, 2.5, 3.0], &[0, 1, 2, 3], &[1.0, 2.0, 3.0, 4.0]),
            args: &["--model", "mf"],
            needles: &["frac-user.h5", "`user`[2]", "not an integer"],
        },
        Case {
            name: "idx-header-promises-terabytes",
            make: |d| idx(d, "huge", 4_000_000_000, 4000, 4000, false),
            args: &[],
            needles: &["huge-images-idx3-ubyte", "[4000000000, 4000, 4000]"],
        },
        Case {
            name: "idx-gz-header-promises-terabytes",
            make: |d| idx(d, "hugez", 4_000_000_000, 4000, 4000, true),
            args: &[],
            needles: &["hugez-images-idx3-ubyte.gz", "[4000000000, 4000, 4000]"],
        },
        Case {
            name: "idx-truncated",
            make: |d| idx(d, "short", 10, 28, 28, false),
            args: &[],
            needles: &["short-images-idx3-ubyte", "truncated"],
        },
    ]
}

/// Size, modification time and contents (regular files) of everything under `dir`.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let bytes = if m.is_file() { std::fs::read(&p).unwrap() } else { Vec::new() };
        out.insert(p, (m.len(), m.modified().unwrap(), bytes));
    }
    out
}

/// Processes whose command line mentions `needle` (a job's unique scratch path).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn every_malformed_input_fails_fast_clearly_and_cleanly() {
    let limit = 60;
    let mut failures = Vec::new();
    for case in cases() {
        let dir = scratch(&format!("malformed-{}", case.name));
        let data = (case.make)(&dir);
        let before = snapshot(&dir);
        let mut args = vec!["train", "--data", &data, "--epochs", "1"];
        args.extend_from_slice(case.args);
        let t = std::time::Instant::now();
        let job = mpirun(2, &args, limit);
        let took = t.elapsed().as_secs_f64();
        let out = format!("{}{}", job.stdout, job.stderr);
        let mut problems = Vec::new();
        if job.timed_out {
            problems.push(format!("hung: killed after {} s", limit * common::HANG_GUARD_STRETCH));
        } else if job.ok() || job.status.is_none() {
            problems.push(format!("exit status {:?}, expected a non-zero exit", job.status));
        }
        for n in case.needles {
            if !out.contains(n) {
                problems.push(format!("output lacks {n:?}"));
            }
        }
        if snapshot(&dir) != before {
            problems.push("an input file changed".into());
        }
        let needle = dir.to_str().unwrap();
        settled_count(|| processes_mentioning(needle).len());
        let left = processes_mentioning(needle);
        if !left.is_empty() {
            problems.push(format!("processes left behind: {left:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!("{} ({took:.1} s): {}\n--- output:\n{out}", case.name, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{} case(s) failed:\n{}", failures.len(), failures.join("\n\n"));
}

/// The well-formed version of the same small data trains in both formats: the table above
/// fails on the defects, not on the layout.
#[test]
fn the_well_formed_base_files_train() {
    let dir = scratch("malformed-base");
    let p = svm(&dir, "good.svm", GOOD);
    mpirun(2, &["train", "--data", &p, "--model", "svm", "--epochs", "1"], 60).expect_ok();
    let h = csr(&dir, "good.h5", &[0, 1, 2, 3, 4], &[0i64, 1, 0, 1], &[1f32; 4], &[1.0, -1.0, 1.0, -1.0]);
    mpirun(2, &["train", "--data", &h, "--model", "svm", "--epochs", "1"], 60).expect_ok();
    let r = ratings_h5(&dir, "good-r.h5", &[0.0, 1.0, 2.0, 3.0], &[0, 1, 2, 3], &[1.0, 2.0, 3.0, 4.0]);
    mpirun(2, &["train", "--data", &r, "--model", "mf", "--epochs", "1"], 60).expect_ok();
}
