//! Text formats (LIBSVM/SVMlight and ratings), read by byte range so each rank parses only its
//! shard: rank r of N owns the lines whose first byte lies in [r*size/N, (r+1)*size/N).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use super::{Csr, DataError, Dataset, Features};

/// Byte range of the shard, moved to line starts.
fn shard_bytes(path: &str, rank: usize, nranks: usize) -> Result<(Vec<u8>, u64), DataError> {
    let mut f = File::open(path).map_err(|e| DataError::io(path, &e))?;
    let size = f.metadata().map_err(|e| DataError::io(path, &e))?.len();
    let lo = size * rank as u64 / nranks as u64;
    let hi = size * (rank as u64 + 1) / nranks as u64;
    // A line belongs to the shard where its first byte is: skip a line that began before `lo`
    // (unless `lo` is at a line start), and finish the line that begins before `hi`.
    let start = line_start_at_or_after(&mut f, lo).map_err(|e| DataError::io(path, &e))?;
    let end = line_start_at_or_after(&mut f, hi).map_err(|e| DataError::io(path, &e))?;
    let mut buf = vec![0u8; end.saturating_sub(start) as usize];
    f.seek(SeekFrom::Start(start)).and_then(|_| f.read_exact(&mut buf)).map_err(|e| DataError::io(path, &e))?;
    Ok((buf, start))
}

/// The first position >= `pos` that starts a line (0, or just after a newline).
fn line_start_at_or_after(f: &mut File, pos: u64) -> std::io::Result<u64> {
    if pos == 0 {
        return Ok(0);
    }
    f.seek(SeekFrom::Start(pos - 1))?;
    let mut r = BufReader::new(&mut *f);
    let mut skipped = Vec::new();
    let n = r.read_until(b'\n', &mut skipped)?;
    Ok(pos - 1 + n as u64)
}

/// Absolute 1-based line number of byte `offset` (counted only on the error path).
fn line_number(path: &str, offset: u64) -> usize {
    let Ok(f) = File::open(path) else { return 0 };
    let mut n = 1;
    let mut r = BufReader::new(f.take(offset));
    let mut buf = [0u8; 1 << 16];
    while let Ok(k) = r.read(&mut buf) {
        if k == 0 {
            break;
        }
        n += buf[..k].iter().filter(|&&b| b == b'\n').count();
    }
    n
}

/// Splits a line into (column, token) pairs, columns 1-based, stopping at '#'.
fn tokens(line: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let end = line.iter().position(|&b| b == b'#').unwrap_or(line.len());
    let line = &line[..end];
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < line.len() && (line[i] == b' ' || line[i] == b'\t' || line[i] == b'\r' || line[i] == b',') {
            i += 1;
        }
        if i >= line.len() {
            return None;
        }
        let s = i;
        while i < line.len() && !matches!(line[i], b' ' | b'\t' | b'\r' | b',') {
            i += 1;
        }
        Some((s + 1, &line[s..i]))
    })
}

fn parse_num<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

struct Lines<'a> {
    path: &'a str,
    buf: &'a [u8],
    start: u64,
}

impl Lines<'_> {
    /// Calls `f(offset_in_buf, line)` for every line; errors carry the offset for the line number.
    fn for_each(&self, mut f: impl FnMut(&[u8]) -> Result<(), (usize, String)>) -> Result<(), DataError> {
        let mut off = 0;
        for line in self.buf.split(|&b| b == b'\n') {
            if let Err((col, msg)) = f(line) {
                return Err(DataError {
                    path: self.path.to_string(),
                    line: Some(line_number(self.path, self.start + off as u64)),
                    column: Some(col),
                    message: msg,
                });
            }
            off += line.len() + 1;
        }
        Ok(())
    }
}

fn show(t: &[u8]) -> String {
    String::from_utf8_lossy(t).into_owned()
}

/// Reads this rank's shard of a LIBSVM/SVMlight file into sparse rows (0-based columns).
pub fn read_libsvm(path: &str, rank: usize, nranks: usize, width: Option<usize>) -> Result<Dataset, DataError> {
    let (buf, start) = shard_bytes(path, rank, nranks)?;
    let mut csr = Csr { indptr: vec![0], ..Default::default() };
    let mut labels = Vec::new();
    Lines { path, buf: &buf, start }.for_each(|line| {
        let mut toks = tokens(line);
        let Some((c, lab)) = toks.next() else { return Ok(()) };
        let y: f32 = parse_num(lab).filter(|v: &f32| v.is_finite()).ok_or_else(|| {
            (c, format!("cannot parse the label {:?} (expected a number such as +1, -1 or 3)", show(lab)))
        })?;
        let mut last: i64 = 0;
        for (c, t) in toks {
            if t.starts_with(b"qid:") {
                continue;
            }
            let colon = t.iter().position(|&b| b == b':').ok_or_else(|| (c, format!("expected index:value, found {:?}", show(t))))?;
            let (it, vt) = (&t[..colon], &t[colon + 1..]);
            let idx: i64 = parse_num(it).ok_or_else(|| (c, format!("expected index:value with an integer index, found {:?}", show(t))))?;
            if idx < 1 {
                return Err((c, format!("feature index {idx} in {:?}: indices are 1-based (the first feature is 1)", show(t))));
            }
            if idx <= last {
                return Err((c, format!("feature index {idx} is not larger than the previous {last}: indices must increase within a line")));
            }
            if let Some(w) = width {
                if idx as usize > w {
                    return Err((c, format!("feature index {idx} exceeds --features {w}")));
                }
            }
            last = idx;
            let v: f32 = parse_num(vt).filter(|v: &f32| v.is_finite()).ok_or_else(|| (c, format!("cannot parse the value in {:?} (expected a finite number)", show(t))))?;
            csr.indices.push((idx - 1) as u32);
            csr.data.push(v);
            csr.ncols = csr.ncols.max(idx as usize);
        }
        labels.push(y);
        csr.indptr.push(csr.indices.len());
        Ok(())
    })?;
    if let Some(w) = width {
        csr.ncols = csr.ncols.max(w);
    }
    Ok(Dataset { features: Features::Sparse(csr), labels, source: path.to_string(), first_row: usize::MAX })
}

/// Reads this rank's shard of a ratings file: `user item rating` per line (0-based ids).
pub fn read_ratings(path: &str, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    let (buf, start) = shard_bytes(path, rank, nranks)?;
    let (mut users, mut items, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    let (mut nu, mut ni) = (0usize, 0usize);
    Lines { path, buf: &buf, start }.for_each(|line| {
        let toks: Vec<(usize, &[u8])> = tokens(line).collect();
        if toks.is_empty() {
            return Ok(());
        }
        if toks.len() < 3 {
            return Err((toks[0].0, format!("expected `user item rating`, found {} field(s)", toks.len())));
        }
        let id = |(c, t): (usize, &[u8]), what: &str| -> Result<u32, (usize, String)> {
            parse_num::<u32>(t).ok_or_else(|| (c, format!("cannot parse the {what} id {:?} (expected a non-negative integer)", show(t))))
        };
        let u = id(toks[0], "user")?;
        let i = id(toks[1], "item")?;
        let (c, t) = toks[2];
        let r: f32 = parse_num(t).filter(|v: &f32| v.is_finite()).ok_or_else(|| (c, format!("cannot parse the rating {:?}", show(t))))?;
        nu = nu.max(u as usize + 1);
        ni = ni.max(i as usize + 1);
        users.push(u);
        items.push(i);
        labels.push(r);
        Ok(())
    })?;
    Ok(Dataset {
        features: Features::Ratings { users, items, n_users: nu, n_items: ni },
        labels,
        source: path.to_string(),
        first_row: usize::MAX,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(text: &str) -> (tempfile::TempDir, String) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.svm");
        std::fs::write(&p, text).unwrap();
        (d, p.to_string_lossy().into_owned())
    }

    #[test]
    fn libsvm_parses_sparse_rows_and_comments() {
        let (_d, p) = tmp("# header\n+1 1:0.5 3:2 # c\n\n-1 qid:3 2:1\n");
        let d = read_libsvm(&p, 0, 1, None).unwrap();
        assert_eq!(d.labels, vec![1.0, -1.0]);
        let Features::Sparse(c) = &d.features else { panic!() };
        assert_eq!((c.indptr.clone(), c.indices.clone(), c.data.clone(), c.ncols), (vec![0, 2, 3], vec![0, 2, 1], vec![0.5, 2.0, 1.0], 3));
    }

    #[test]
    fn shards_cover_every_line_once_in_order() {
        let text: String = (0..37).map(|i| format!("{i} {}:1\n", i % 5 + 1)).collect();
        let (_d, p) = tmp(&text);
        for n in 1..=6 {
            let mut all = Vec::new();
            for r in 0..n {
                all.extend(read_libsvm(&p, r, n, None).unwrap().labels);
            }
            assert_eq!(all, (0..37).map(|i| i as f32).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn errors_name_line_and_column_from_any_shard() {
        let mut text: String = (0..20).map(|_| "+1 1:1 2:2\n".to_string()).collect();
        text.push_str("-1 1:1 3:x\n");
        let (_d, p) = tmp(&text);
        for n in [1, 3] {
            let e = (0..n).find_map(|r| read_libsvm(&p, r, n, None).err()).unwrap();
            assert_eq!((e.line, e.column), (Some(21), Some(8)), "{e}");
        }
        let (_d, p) = tmp("+1 1:1\n-1 0:2\n");
        assert!(read_libsvm(&p, 0, 1, None).unwrap_err().to_string().contains("1-based"));
        let (_d, p) = tmp("+1 2:1 1:1\n");
        assert!(read_libsvm(&p, 0, 1, None).unwrap_err().to_string().contains("increase"));
        let (_d, p) = tmp("abc 1:1\n");
        assert_eq!(read_libsvm(&p, 0, 1, None).unwrap_err().column, Some(1));
        let (_d, p) = tmp("1 1:nan\n");
        assert!(read_libsvm(&p, 0, 1, None).is_err());
    }

    #[test]
    fn ratings_parse_and_fail_clearly() {
        let (_d, p) = tmp("0 1 4.5\n2,0,3\n# c\n");
        let d = read_ratings(&p, 0, 1).unwrap();
        assert_eq!(d.labels, vec![4.5, 3.0]);
        assert!(matches!(d.features, Features::Ratings { n_users: 3, n_items: 2, .. }));
        let (_d, p) = tmp("0 1 4\n1 -2 3\n");
        let e = read_ratings(&p, 0, 1).unwrap_err();
        assert_eq!((e.line, e.column), (Some(2), Some(3)));
    }
}
