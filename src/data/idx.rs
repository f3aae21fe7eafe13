//! IDX files (MNIST family), gzip-compressed or not. Images become dense rows of raw pixel values
//! (0..255 as f32); the labels file is found next to the images file.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use flate2::read::GzDecoder;

use super::{DataError, Dataset, Features};

/// The file, whether it is gzip-compressed, and its size on disk.
fn open(path: &str) -> Result<(Box<dyn Read>, bool, u64), DataError> {
    let size = super::check_regular(path)?;
    let mut f = File::open(path).map_err(|e| DataError::io(path, &e))?;
    let mut magic = [0u8; 2];
    let gz = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    f.seek(SeekFrom::Start(0)).map_err(|e| DataError::io(path, &e))?;
    Ok(if gz { (Box::new(BufReader::new(GzDecoder::new(f))), true, size) } else { (Box::new(f), false, size) })
}

/// Header of an unsigned-byte IDX file (`gz`: read through gzip): dimensions. A gzip stream that
/// fails here is blamed as gzip, not as a short IDX file (issue 43: a corrupt download read
/// "file too short for an IDX header").
fn header(path: &str, r: &mut dyn Read, gz: bool) -> Result<Vec<usize>, DataError> {
    let short = |e: std::io::Error, what: &str| if gz { err_gz(path, e) } else { DataError::at(path, what) };
    let mut m = [0u8; 4];
    r.read_exact(&mut m).map_err(|e| short(e, "file too short for an IDX header"))?;
    if m[0] != 0 || m[1] != 0 || m[2] != 0x08 || m[3] == 0 {
        return Err(DataError::at(
            path,
            &format!(
            "not an unsigned-byte IDX file (magic {:02x}{:02x}{:02x}{:02x}, expected 000008nn); pass --format if this is another format",
            m[0], m[1], m[2], m[3]
        ),
        ));
    }
    let mut dims = Vec::new();
    for _ in 0..m[3] {
        let mut d = [0u8; 4];
        r.read_exact(&mut d).map_err(|e| short(e, "truncated IDX header"))?;
        dims.push(u32::from_be_bytes(d) as usize);
    }
    Ok(dims)
}

/// Reads rows [lo, hi) of an IDX file: a seek for a plain file, a streaming skip for gzip.
/// The header's sizes are checked against the file (plain) or the memory available (gzip, whose
/// uncompressed size is unknown until read) before anything is allocated.
fn rows(path: &str, rank: usize, nranks: usize) -> Result<(Vec<u8>, Vec<usize>, usize), DataError> {
    let (mut r, gz, size) = open(path)?;
    let dims = header(path, &mut *r, gz)?;
    let n = dims[0];
    // Up to 255 dimensions of 2^32 overflow even u128: saturate (such a header is refused below).
    let row = dims[1..].iter().try_fold(1u128, |a, &d| a.checked_mul(d as u128)).unwrap_or(u128::MAX);
    let promised = (n as u128).saturating_mul(row);
    let header_len = 4 + 4 * dims.len() as u64;
    let (lo, hi) = shard_rows(n, rank, nranks);
    let what = |got: String| {
        DataError::at(
            path,
            &format!(
                "truncated or corrupt: the header's dimensions {dims:?} promise {n} rows of {row} bytes ({}), but {got}",
                super::human_bytes(promised)
            ),
        )
    };
    if !gz && (header_len as u128).saturating_add(promised) > size as u128 {
        return Err(what(format!("the file holds {} after the header", super::human_bytes((size - header_len.min(size)) as u128))));
    }
    let want = ((hi - lo) as u128).saturating_mul(row);
    super::check_memory(path, &format!("rows {lo}..{hi} ({} x {row} bytes, from the header {dims:?})", hi - lo), want.saturating_mul(5))?;
    let (skip, want) = ((lo as u128).saturating_mul(row).min(u64::MAX as u128) as u64, want as u64);
    if gz {
        std::io::copy(&mut (&mut r).take(skip), &mut std::io::sink()).map_err(|e| err_gz(path, e))?;
    } else {
        let mut f = File::open(path).map_err(|e| DataError::io(path, &e))?;
        f.seek(SeekFrom::Start(header_len + skip)).map_err(|e| DataError::io(path, &e))?;
        r = Box::new(f);
    }
    // Grows as bytes arrive: a stream shorter than its header promises fails without first
    // allocating what the header claimed.
    let mut buf = Vec::with_capacity(want.min(1 << 26) as usize);
    (&mut r).take(want).read_to_end(&mut buf).map_err(|e| err_gz(path, e))?;
    if (buf.len() as u64) < want {
        return Err(what(format!("rows {lo}..{hi} end early (after {} bytes of the {want} expected)", buf.len())));
    }
    Ok((buf, dims, lo))
}

/// A gzip stream that cannot be read: said as the LIBSVM reader says it (src/data/text.rs).
fn err_gz(path: &str, e: std::io::Error) -> DataError {
    DataError::at(
        path,
        &format!("starts like a gzip file but cannot be decompressed: {e} (a truncated or corrupt .gz? `gzip -t` checks it)"),
    )
}

/// The labels file that goes with an images file (`images-idx3` -> `labels-idx1`).
pub fn labels_path_for(images: &str) -> Option<String> {
    images.contains("images-idx3").then(|| images.replace("images-idx3", "labels-idx1"))
}

/// The labels file for `path`: `labels` when given, else the name next to the images file.
fn labels_for(path: &str, labels: Option<&str>) -> Result<String, DataError> {
    labels.map(str::to_string).or_else(|| labels_path_for(path)).ok_or_else(|| {
        DataError::at(path, "cannot find the labels file: name the images file *images-idx3* so that *labels-idx1* is next to it")
    })
}

/// A dataset from raw IDX rows (`x`: rows of prod(dims[1..]) bytes, `y`: one label byte per row).
fn dataset(
    path: &str,
    labels_path: &str,
    x: Vec<u8>,
    dims: &[usize],
    y: Vec<u8>,
    ldims: &[usize],
    first_row: usize,
) -> Result<Dataset, DataError> {
    if ldims.len() != 1 || ldims[0] != dims[0] {
        return Err(DataError::at(labels_path, &format!("has {:?} labels but {path} has {} images", ldims, dims[0])));
    }
    // A shard without rows passes the size checks whatever the header says: the row size must
    // still be a number.
    let d = dims[1..]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| DataError::at(path, &format!("the header's dimensions {dims:?} give rows too large to address")))?;
    Ok(Dataset {
        features: Features::Dense { x: x.into_iter().map(f32::from).collect(), d },
        labels: y.into_iter().map(f32::from).collect(),
        source: path.to_string(),
        first_row,
    })
}

/// Reads this rank's rows of an IDX images file and the matching labels.
pub fn read_idx(path: &str, labels: Option<&str>, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    let labels_path = labels_for(path, labels)?;
    let (x, dims, lo) = rows(path, rank, nranks)?;
    let (y, ldims, _) = rows(&labels_path, rank, nranks)?;
    dataset(path, &labels_path, x, &dims, y, &ldims, lo)
}

/// True when the file is gzip-compressed (reading rank r's rows then decompresses everything
/// before them).
pub fn is_gzip(path: &str) -> Result<bool, DataError> {
    Ok(open(path)?.1)
}

/// The dimensions in the headers of an images file and its labels file (a few bytes of each).
pub fn pair_dims(path: &str, labels: Option<&str>) -> Result<(Vec<usize>, Vec<usize>), DataError> {
    let labels_path = labels_for(path, labels)?;
    let dims_of = |p: &str| {
        let (mut r, gz, _) = open(p)?;
        header(p, &mut *r, gz)
    };
    let (dims, ldims) = (dims_of(path)?, dims_of(&labels_path)?);
    if ldims.len() != 1 || ldims[0] != dims[0] {
        return Err(DataError::at(&labels_path, &format!("has {:?} labels but {path} has {} images", ldims, dims[0])));
    }
    Ok((dims, ldims))
}

/// An images file read whole: (image bytes, dims, label bytes).
pub type RawImages = (Vec<u8>, Vec<usize>, Vec<u8>);

/// Every row of an images file and its labels, raw (one rank reading for all; see
/// `train::setup`).
pub fn read_all_raw(path: &str, labels: Option<&str>) -> Result<RawImages, DataError> {
    let labels_path = labels_for(path, labels)?;
    let (x, dims, _) = rows(path, 0, 1)?;
    let (y, ldims, _) = rows(&labels_path, 0, 1)?;
    if ldims.len() != 1 || ldims[0] != dims[0] {
        return Err(DataError::at(&labels_path, &format!("has {:?} labels but {path} has {} images", ldims, dims[0])));
    }
    Ok((x, dims, y))
}

/// This rank's rows [lo, hi) of `n` rows, the split every reader uses.
pub fn shard_rows(n: usize, rank: usize, nranks: usize) -> (usize, usize) {
    (n * rank / nranks, n * (rank + 1) / nranks)
}

/// A dataset from this rank's raw rows (received from the rank that read the file).
pub fn dataset_from_raw(
    path: &str,
    labels: Option<&str>,
    x: Vec<u8>,
    dims: &[usize],
    y: Vec<u8>,
    ldims: &[usize],
    first_row: usize,
) -> Result<Dataset, DataError> {
    dataset(path, &labels_for(path, labels)?, x, dims, y, ldims, first_row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_idx(dir: &std::path::Path, name: &str, dims: &[u32], data: &[u8], gz: bool) -> String {
        let mut bytes = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            bytes.extend(d.to_be_bytes());
        }
        bytes.extend(data);
        let p = dir.join(name);
        if gz {
            let mut e = flate2::write::GzEncoder::new(File::create(&p).unwrap(), flate2::Compression::fast());
            e.write_all(&bytes).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(&p, bytes).unwrap();
        }
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn shards_of_plain_and_gzip_idx() {
        let d = tempfile::tempdir().unwrap();
        for gz in [false, true] {
            let ext = if gz { ".gz" } else { "" };
            let img: Vec<u8> = (0..7 * 6).map(|i| i as u8).collect();
            let p = write_idx(d.path(), &format!("t-images-idx3-ubyte{ext}"), &[7, 2, 3], &img, gz);
            write_idx(d.path(), &format!("t-labels-idx1-ubyte{ext}"), &[7], &[0, 1, 2, 3, 4, 5, 6], gz);
            for n in 1..=4 {
                let mut labels = Vec::new();
                let mut xs = Vec::new();
                for r in 0..n {
                    let s = read_idx(&p, None, r, n).unwrap();
                    assert_eq!(s.dim(), 6);
                    labels.extend(s.labels.clone());
                    if let Features::Dense { x, .. } = s.features {
                        xs.extend(x)
                    }
                }
                assert_eq!(labels, (0..7).map(|i| i as f32).collect::<Vec<_>>());
                assert_eq!(xs, img.iter().map(|&b| b as f32).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn whole_file_raw_rows_split_like_the_shards() {
        let d = tempfile::tempdir().unwrap();
        let img: Vec<u8> = (0..9 * 4).map(|i| (i * 7) as u8).collect();
        let p = write_idx(d.path(), "w-images-idx3-ubyte.gz", &[9, 2, 2], &img, true);
        write_idx(d.path(), "w-labels-idx1-ubyte.gz", &[9], &[9, 8, 7, 6, 5, 4, 3, 2, 1], true);
        assert!(is_gzip(&p).unwrap());
        let (dims, ldims) = pair_dims(&p, None).unwrap();
        assert_eq!((dims.clone(), ldims.clone()), (vec![9, 2, 2], vec![9]));
        let (x, dims2, y) = read_all_raw(&p, None).unwrap();
        assert_eq!((x.clone(), dims2), (img.clone(), dims.clone()));
        for n in 1..=5 {
            for r in 0..n {
                let (lo, hi) = shard_rows(9, r, n);
                let from_raw = dataset_from_raw(&p, None, x[lo * 4..hi * 4].to_vec(), &dims, y[lo..hi].to_vec(), &ldims, lo).unwrap();
                let read = read_idx(&p, None, r, n).unwrap();
                assert_eq!((from_raw.labels, from_raw.first_row), (read.labels, read.first_row));
                match (from_raw.features, read.features) {
                    (Features::Dense { x: a, d: da }, Features::Dense { x: b, d: db }) => assert_eq!((a, da), (b, db)),
                    _ => panic!("dense expected"),
                }
            }
        }
    }

    #[test]
    fn bad_magic_and_truncation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x-images-idx3-ubyte");
        std::fs::write(&p, b"hello world").unwrap();
        assert!(read_idx(p.to_str().unwrap(), None, 0, 1).unwrap_err().message.contains("magic"));
        let p = write_idx(d.path(), "y-images-idx3-ubyte", &[5, 2, 2], &[1, 2, 3], false);
        write_idx(d.path(), "y-labels-idx1-ubyte", &[5], &[1; 5], false);
        assert!(read_idx(&p, None, 0, 1).unwrap_err().message.contains("truncated"));
        // A header promising terabytes is refused by size, before any allocation, plain or gzip.
        for gz in [false, true] {
            let ext = if gz { ".gz" } else { "" };
            let p = write_idx(d.path(), &format!("z-images-idx3-ubyte{ext}"), &[4_000_000_000, 4000, 4000], &[1; 64], gz);
            write_idx(d.path(), &format!("z-labels-idx1-ubyte{ext}"), &[4_000_000_000], &[1; 64], gz);
            let e = read_idx(&p, None, 0, 2).unwrap_err();
            assert!(e.message.contains("4000000000") && e.path == p, "{e}");
        }
    }

    /// A gzip IDX file whose stream is corrupt or cut inside the header is blamed as gzip, not
    /// as too short (issue 43, item 10), whether read for its rows or for its dimensions.
    #[test]
    fn a_corrupt_or_cut_gzip_header_is_blamed_as_gzip() {
        let d = tempfile::tempdir().unwrap();
        let good = write_idx(d.path(), "g-images-idx3-ubyte.gz", &[3, 2, 2], &[5; 12], true);
        let bytes = std::fs::read(&good).unwrap();
        let corrupt = [&bytes[..10], &[0xff; 8][..]].concat();
        for (name, gz) in [("c", corrupt), ("t", bytes[..14].to_vec())] {
            let p = d.path().join(format!("{name}-images-idx3-ubyte.gz"));
            std::fs::write(&p, gz).unwrap();
            write_idx(d.path(), &format!("{name}-labels-idx1-ubyte.gz"), &[3], &[1; 3], true);
            let p = p.to_str().unwrap();
            for e in [read_idx(p, None, 0, 1).unwrap_err(), pair_dims(p, None).unwrap_err()] {
                assert!(e.message.contains("cannot be decompressed") && !e.message.contains("too short"), "{name}: {e}");
            }
        }
    }

    #[test]
    fn real_fashion_mnist_test_set() {
        let p = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
        // The data set is a test dependency (`make deps` installs it): a missing file fails the
        // test instead of letting it pass without checking anything.
        assert!(std::path::Path::new(p).exists(), "{p} missing: apt-get install dataset-fashion-mnist (make deps)");
        let d = read_idx(p, None, 1, 4).unwrap();
        assert_eq!((d.len(), d.dim(), d.first_row), (2500, 784, 2500));
        assert!(d.labels.iter().all(|&y| (0.0..10.0).contains(&y)));
    }
}
