//! Text formats (LIBSVM/SVMlight and ratings), sharded by examples, not by bytes.
//!
//! Splitting a file into N equal byte ranges gives very unequal example counts when line lengths
//! vary (a LIBSVM file sorted by label with longer lines in one class: 278/722 examples at 2
//! ranks), and since an epoch is the minimum over ranks, part of the data is never seen. So a
//! shard is found in three cheap passes, none of which holds more than its own part in memory:
//! 1. [`count_chunk`]: rank r counts the example lines of byte range r of N (moved to line starts);
//! 2. with everyone's counts (a collective in `train::setup`, or [`plan_serial`] without MPI),
//!    [`shard_start`] says where example `total*r/N` is: the start of chunk k plus `skip`
//!    example lines, found by [`locate`];
//! 3. the rank parses bytes [its start, the next rank's start) with [`read_libsvm_range`] /
//!    [`read_ratings_range`], streaming, so only the parsed shard stays in memory.
//!
//! Every rank then holds floor or ceil(total/N) examples, in file order, and knows the global
//! number of its first example. An example line is a line with a token before any `#`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use super::{Csr, DataError, Dataset, Features, ZeroBased};

/// Read buffer for the streaming passes.
const BUF: usize = 1 << 20;

/// The largest LIBSVM feature index (columns are stored as 32-bit 0-based numbers).
pub const MAX_FEATURE_INDEX: u64 = u32::MAX as u64;

/// One rank's byte chunk (r*size/N .. (r+1)*size/N, moved to line starts) and its example lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkCount {
    pub start: u64,
    pub end: u64,
    pub examples: u64,
}

/// The bytes and examples of one rank's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextRange {
    /// First byte (a line start).
    pub start: u64,
    /// One past the last byte (a line start or the end of the file).
    pub end: u64,
    /// Global 0-based number of the first example in the range.
    pub first_row: u64,
    /// Example lines in the range.
    pub rows: u64,
}

fn open(path: &str) -> Result<(File, u64), DataError> {
    let size = super::check_regular(path)?;
    let f = File::open(path).map_err(|e| DataError::io(path, &e))?;
    Ok((f, size))
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

/// Classifies bytes into lines, across buffer boundaries: a line is an example when it has a
/// byte other than a separator before any '#'. Newlines are found with `memchr` and a line's
/// content is decided by its first non-separator byte, so a pass costs little more than reading.
#[derive(Default)]
struct LineScanner {
    content: bool,
    comment: bool,
}

impl LineScanner {
    fn look(&mut self, seg: &[u8]) {
        if self.content || self.comment {
            return;
        }
        if let Some(&b) = seg.iter().find(|&&b| !matches!(b, b' ' | b'\t' | b'\r' | b',')) {
            if b == b'#' {
                self.comment = true;
            } else {
                self.content = true;
            }
        }
    }

    /// Feeds `buf`; calls `on_example_end(i)` at the newline (index in `buf`) of every example
    /// line, and stops early when it returns false (then returns Some(i)).
    fn feed(&mut self, buf: &[u8], mut on_example_end: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut s = 0;
        for nl in memchr::memchr_iter(b'\n', buf) {
            self.look(&buf[s..nl]);
            let ex = self.content;
            self.content = false;
            self.comment = false;
            if ex && !on_example_end(nl) {
                return Some(nl);
            }
            s = nl + 1;
        }
        self.look(&buf[s..]);
        None
    }
}

/// Examples between two marks of [`ChunkScan::marks`].
pub const MARK_EVERY: u64 = 4096;

/// What pass 1 learns about one byte chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkScan {
    pub count: ChunkCount,
    /// `marks[j]` is where example `j * MARK_EVERY` of the chunk starts (as [`locate`] gives it),
    /// so that finding any example of the chunk later scans at most `MARK_EVERY` lines.
    pub marks: Vec<u64>,
}

impl ChunkScan {
    /// Where example `skip` of this chunk starts (see [`locate`]).
    pub fn locate(&self, path: &str, skip: u64) -> Result<u64, DataError> {
        let j = ((skip / MARK_EVERY) as usize).min(self.marks.len() - 1);
        locate(path, self.marks[j], skip - j as u64 * MARK_EVERY)
    }
}

/// Pass 1: the example lines in rank `rank`'s byte chunk of `nranks`.
pub fn count_chunk(path: &str, rank: usize, nranks: usize) -> Result<ChunkScan, DataError> {
    let (mut f, size) = open(path)?;
    let lo = (size as u128 * rank as u128 / nranks as u128) as u64;
    let hi = (size as u128 * (rank as u128 + 1) / nranks as u128) as u64;
    let start = line_start_at_or_after(&mut f, lo).map_err(|e| DataError::io(path, &e))?;
    let end = line_start_at_or_after(&mut f, hi).map_err(|e| DataError::io(path, &e))?.max(start);
    f.seek(SeekFrom::Start(start)).map_err(|e| DataError::io(path, &e))?;
    let mut r = f.take(end - start);
    let mut buf = vec![0u8; BUF];
    let mut sc = LineScanner::default();
    let mut examples = 0u64;
    let mut marks = vec![start];
    let mut pos = start;
    loop {
        let k = r.read(&mut buf).map_err(|e| DataError::io(path, &e))?;
        if k == 0 {
            break;
        }
        sc.feed(&buf[..k], |i| {
            examples += 1;
            if examples.is_multiple_of(MARK_EVERY) {
                marks.push(pos + i as u64 + 1);
            }
            true
        });
        pos += k as u64;
    }
    // The last line of the file may lack its newline.
    if sc.content {
        examples += 1;
    }
    Ok(ChunkScan { count: ChunkCount { start, end, examples }, marks })
}

/// The byte offset just after the `skip`-th example line at or after `from` (a line start), i.e.
/// where example number `skip` (0-based, counted from `from`) begins; the end of the file when
/// there are not that many.
pub fn locate(path: &str, from: u64, skip: u64) -> Result<u64, DataError> {
    let (mut f, size) = open(path)?;
    if skip == 0 {
        return Ok(from);
    }
    f.seek(SeekFrom::Start(from)).map_err(|e| DataError::io(path, &e))?;
    let mut buf = vec![0u8; BUF.min(1 << 16)];
    let mut sc = LineScanner::default();
    let (mut seen, mut pos) = (0u64, from);
    loop {
        let k = f.read(&mut buf).map_err(|e| DataError::io(path, &e))?;
        if k == 0 {
            return Ok(size);
        }
        if let Some(i) = sc.feed(&buf[..k], |_| {
            seen += 1;
            seen < skip
        }) {
            return Ok(pos + i as u64 + 1);
        }
        pos += k as u64;
    }
}

/// Pass 2 (pure): where rank `rank` of `nranks` starts, given every rank's [`ChunkCount`] in rank
/// order: (chunk index, example lines to skip from that chunk's start, global first example).
pub fn shard_start(chunks: &[ChunkCount], rank: usize, nranks: usize) -> (usize, u64, u64) {
    let total: u64 = chunks.iter().map(|c| c.examples).sum();
    let first = (total as u128 * rank as u128 / nranks as u128) as u64;
    let mut before = 0u64;
    for (k, c) in chunks.iter().enumerate() {
        if before + c.examples > first {
            return (k, first - before, first);
        }
        before += c.examples;
    }
    // No example left for this rank: start at the end of the last chunk.
    let last = chunks.len() - 1;
    (last, chunks[last].examples, first)
}

/// The balanced ranges of all ranks, computed in one process (for tools and tests; training does
/// the same collectively, each rank scanning only its part).
pub fn plan_serial(path: &str, nranks: usize) -> Result<Vec<TextRange>, DataError> {
    let scans = (0..nranks).map(|r| count_chunk(path, r, nranks)).collect::<Result<Vec<_>, _>>()?;
    let chunks: Vec<ChunkCount> = scans.iter().map(|s| s.count).collect();
    let total: u64 = chunks.iter().map(|c| c.examples).sum();
    let mut starts = Vec::with_capacity(nranks);
    for r in 0..nranks {
        let (k, skip, first) = shard_start(&chunks, r, nranks);
        starts.push((scans[k].locate(path, skip)?, first));
    }
    let size = chunks[nranks - 1].end;
    Ok((0..nranks)
        .map(|r| {
            let (start, first) = starts[r];
            let (end, next) = starts.get(r + 1).copied().unwrap_or((size, total));
            TextRange { start, end: end.max(start), first_row: first, rows: next - first }
        })
        .collect())
}

/// The whole file as one range (one rank): no counting pass needed.
fn whole(path: &str) -> Result<TextRange, DataError> {
    let size = super::check_regular(path)?;
    Ok(TextRange { start: 0, end: size, first_row: 0, rows: u64::MAX })
}

/// Absolute 1-based line number of byte `offset` (counted only on the error path).
pub fn line_number(path: &str, offset: u64) -> usize {
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

/// Splits a line into (column, token) pairs, columns 1-based, stopping at '#'. Commas separate
/// tokens too (ratings files may be CSV).
fn tokens(line: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    split_tokens(line, true)
}

/// Tokens separated by blanks only (SVMlight: a comma belongs to a multilabel label, and
/// scikit-learn refuses `1, 2:2.5`, so it is never a separator there).
fn split_tokens(line: &[u8], commas: bool) -> impl Iterator<Item = (usize, &[u8])> {
    let end = line.iter().position(|&b| b == b'#').unwrap_or(line.len());
    let line = &line[..end];
    let sep = move |b: u8| b == b' ' || b == b'\t' || b == b'\r' || (commas && b == b',');
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < line.len() && sep(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return None;
        }
        let s = i;
        while i < line.len() && !sep(line[i]) {
            i += 1;
        }
        Some((s + 1, &line[s..i]))
    })
}

fn parse_num<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A finite f32, or why not ("nan", "inf", or too large for 32 bits).
fn parse_finite(t: &[u8]) -> Result<f32, &'static str> {
    let v: f64 = parse_num(t).ok_or("not a number")?;
    if v.is_nan() {
        Err("NaN (not a number)")
    } else if v.is_infinite() {
        Err("infinite")
    } else if v.abs() > f32::MAX as f64 {
        Err("too large for a 32-bit float")
    } else {
        Ok(v as f32)
    }
}

/// Calls `f(line)` for every line of `range`, streaming; an error carries the column and is
/// turned into file:line:col (the line number is counted only then).
fn for_each_line(path: &str, range: TextRange, mut f: impl FnMut(&[u8]) -> Result<(), (usize, String)>) -> Result<(), DataError> {
    let (mut file, _) = open(path)?;
    file.seek(SeekFrom::Start(range.start)).map_err(|e| DataError::io(path, &e))?;
    let mut r = BufReader::with_capacity(BUF, file.take(range.end - range.start));
    let mut line = Vec::new();
    let mut lines_done = 0usize;
    loop {
        line.clear();
        let k = r.read_until(b'\n', &mut line).map_err(|e| DataError::io(path, &e))?;
        if k == 0 {
            return Ok(());
        }
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        if let Err((col, msg)) = f(body) {
            return Err(DataError {
                path: path.to_string(),
                line: Some(line_number(path, range.start) + lines_done),
                column: Some(col),
                message: msg,
            });
        }
        lines_done += 1;
    }
}

/// Bytes of a token quoted in an error message at most; longer tokens are cut (a 50 MB line of
/// NUL bytes once made 105 MB of stderr).
const SHOW_BYTES: usize = 40;

/// A token as quoted in an error message: cut to [`SHOW_BYTES`], saying how long it was.
fn show(t: &[u8]) -> String {
    if t.len() <= SHOW_BYTES {
        return String::from_utf8_lossy(t).into_owned();
    }
    format!("{}... ({} bytes)", String::from_utf8_lossy(&t[..SHOW_BYTES]), t.len())
}

/// Why a LIBSVM label token is not a number, with the fix where one is known.
fn label_error(lab: &[u8], why: &str) -> String {
    if lab.contains(&b',') {
        let parts: Vec<&[u8]> = lab.split(|&b| b == b',').collect();
        if parts.len() > 1 && parts.iter().all(|p| parse_finite(p).is_ok()) {
            return format!(
                "the label {:?} is a multilabel list (scikit-learn's multilabel SVMlight form), which training cannot use: give one label per line",
                show(lab)
            );
        }
        return format!("cannot use the label {:?}: a comma is not part of a label (write `1 2:2.5`, not `1, 2:2.5`)", show(lab));
    }
    format!("cannot use the label {:?}: {why} (expected a finite number such as +1, -1 or 3)", show(lab))
}

/// A gzip-compressed text file decompressed into a private temporary file (removed on drop).
/// The text readers shard by byte offsets, which a gzip stream cannot seek to; IDX files are read
/// compressed, so compressed LIBSVM and ratings files are read too. Each rank decompresses the
/// whole file once (it needs the file's size in temporary space: `TMPDIR` chooses where).
pub struct Gunzipped {
    path: std::path::PathBuf,
}

impl Gunzipped {
    /// The decompressed file.
    pub fn path(&self) -> &str {
        self.path.to_str().unwrap_or_default()
    }
}

impl Drop for Gunzipped {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `Some` decompressed copy when `path` starts with the gzip magic bytes, None for plain text.
pub fn gunzip_if_compressed(path: &str) -> Result<Option<Gunzipped>, DataError> {
    let (mut f, _) = open(path)?;
    let mut magic = [0u8; 2];
    let gz = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    if !gz {
        return Ok(None);
    }
    f.seek(SeekFrom::Start(0)).map_err(|e| DataError::io(path, &e))?;
    static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = Gunzipped { path: std::env::temp_dir().join(format!("asap-train-{}-{k}.gunzipped", std::process::id())) };
    let mut w = std::io::BufWriter::new(File::create(&out.path).map_err(|e| DataError::io(out.path(), &e))?);
    let mut r = flate2::read::MultiGzDecoder::new(BufReader::new(f));
    std::io::copy(&mut r, &mut w).and_then(|_| std::io::Write::flush(&mut w)).map_err(|e| {
        DataError::at(path, &format!("starts like a gzip file but cannot be decompressed: {e} (a truncated or corrupt .gz?)"))
    })?;
    Ok(Some(out))
}

/// Reads this rank's shard of a LIBSVM/SVMlight file (balanced by examples, see the module
/// documentation) into sparse rows (0-based columns).
pub fn read_libsvm(path: &str, rank: usize, nranks: usize, width: Option<usize>) -> Result<Dataset, DataError> {
    read_libsvm_based(path, rank, nranks, width, ZeroBased::False)
}

/// [`read_libsvm`] with the index base chosen (see [`ZeroBased`]).
pub fn read_libsvm_based(path: &str, rank: usize, nranks: usize, width: Option<usize>, zero: ZeroBased) -> Result<Dataset, DataError> {
    let range = if nranks == 1 { whole(path)? } else { plan_serial(path, nranks)?[rank] };
    read_libsvm_range(path, range, width, zero)
}

/// Pass 3: parses the LIBSVM examples in `range`. With `zero` true or auto, index i is column i
/// (0 allowed); the caller of auto shifts every column down by one when no rank saw a 0
/// ([`super::one_based_after_all`]). With false, index i is column i - 1 and 0 is refused.
pub fn read_libsvm_range(path: &str, range: TextRange, width: Option<usize>, zero: ZeroBased) -> Result<Dataset, DataError> {
    if let Some(w) = width {
        if w as u64 > MAX_FEATURE_INDEX {
            return Err(DataError::at(path, &format!("--features {w} is above the largest supported feature index {MAX_FEATURE_INDEX}")));
        }
    }
    let mut csr = Csr { indptr: vec![0], ..Default::default() };
    let mut labels = Vec::new();
    for_each_line(path, range, |line| {
        let mut toks = split_tokens(line, false);
        let Some((c, lab)) = toks.next() else { return Ok(()) };
        let y = parse_finite(lab).map_err(|why| (c, label_error(lab, why)))?;
        let first = if zero == ZeroBased::False { 1 } else { 0 };
        let mut last: Option<u64> = None;
        for (c, t) in toks {
            if t.starts_with(b"qid:") {
                continue;
            }
            let colon = t.iter().position(|&b| b == b':').ok_or_else(|| (c, format!("expected index:value, found {:?}", show(t))))?;
            let (it, vt) = (&t[..colon], &t[colon + 1..]);
            let idx: u64 = match parse_num(it) {
                Some(i) => i,
                None if !it.is_empty() && it.iter().all(u8::is_ascii_digit) => u64::MAX,
                None if parse_num::<i64>(it).is_some() => {
                    return Err((
                        c,
                        format!(
                            "feature index {} in {:?} is negative: indices are 1-based (0-based with --zero-based true)",
                            show(it),
                            show(t)
                        ),
                    ));
                }
                None => return Err((c, format!("expected index:value with an integer index, found {:?}", show(t)))),
            };
            if idx < first {
                let fix =
                    if zero == ZeroBased::False { " (the first feature is 1; --zero-based auto or true reads 0-based files)" } else { "" };
                return Err((c, format!("feature index {} in {:?}: indices are {}-based{fix}", show(it), show(t), first)));
            }
            if idx > MAX_FEATURE_INDEX {
                return Err((c, format!("feature index {} is above the largest supported index {MAX_FEATURE_INDEX}", show(it))));
            }
            if let Some(last) = last.filter(|&l| idx <= l) {
                return Err((
                    c,
                    format!("feature index {idx} is not larger than the previous {last}: indices must increase within a line"),
                ));
            }
            let col = idx - first;
            if let Some(w) = width {
                // Auto may still shift the columns down by one: the check is on the column then.
                if col >= w as u64 + (zero == ZeroBased::Auto) as u64 {
                    return Err((c, format!("feature index {idx} exceeds --features {w}")));
                }
            }
            last = Some(idx);
            let v = parse_finite(vt)
                .map_err(|why| (c + colon + 1, format!("cannot use the value in {:?}: {why} (expected a finite number)", show(t))))?;
            csr.indices.push(col as u32);
            csr.data.push(v);
            csr.ncols = csr.ncols.max(col as usize + 1);
        }
        labels.push(y);
        csr.indptr.push(csr.indices.len());
        Ok(())
    })?;
    if let Some(w) = width {
        csr.ncols = csr.ncols.max(w);
    }
    check_rows(path, range, labels.len())?;
    Ok(Dataset { features: Features::Sparse(csr), labels, source: path.to_string(), first_row: range.first_row as usize })
}

/// The counting pass and the parse must agree (they differ only if the file changed in between).
fn check_rows(path: &str, range: TextRange, got: usize) -> Result<(), DataError> {
    if range.rows != u64::MAX && range.rows != got as u64 {
        return Err(DataError::at(
            path,
            &format!(
                "changed while being read: bytes {}..{} held {} example lines when counted and {got} when parsed",
                range.start, range.end, range.rows
            ),
        ));
    }
    Ok(())
}

/// Reads this rank's shard of a ratings file: `user item rating` per line (0-based ids).
pub fn read_ratings(path: &str, rank: usize, nranks: usize) -> Result<Dataset, DataError> {
    let range = if nranks == 1 { whole(path)? } else { plan_serial(path, nranks)?[rank] };
    read_ratings_range(path, range)
}

/// Pass 3: parses the ratings in `range`.
pub fn read_ratings_range(path: &str, range: TextRange) -> Result<Dataset, DataError> {
    let (mut users, mut items, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    let (mut nu, mut ni) = (0usize, 0usize);
    for_each_line(path, range, |line| {
        let toks: Vec<(usize, &[u8])> = tokens(line).collect();
        if toks.is_empty() {
            return Ok(());
        }
        if toks.len() < 3 {
            return Err((toks[0].0, format!("expected `user item rating`, found {} field(s)", toks.len())));
        }
        let id = |(c, t): (usize, &[u8]), what: &str| -> Result<u32, (usize, String)> {
            parse_num::<u32>(t)
                .ok_or_else(|| (c, format!("cannot parse the {what} id {:?} (expected an integer from 0 to {})", show(t), u32::MAX)))
        };
        let u = id(toks[0], "user")?;
        let i = id(toks[1], "item")?;
        let (c, t) = toks[2];
        let r = parse_finite(t).map_err(|why| (c, format!("cannot use the rating {:?}: {why}", show(t))))?;
        nu = nu.max(u as usize + 1);
        ni = ni.max(i as usize + 1);
        users.push(u);
        items.push(i);
        labels.push(r);
        Ok(())
    })?;
    check_rows(path, range, labels.len())?;
    Ok(Dataset {
        features: Features::Ratings { users, items, n_users: nu, n_items: ni },
        labels,
        source: path.to_string(),
        first_row: range.first_row as usize,
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
                let s = read_libsvm(&p, r, n, None).unwrap();
                assert_eq!(s.first_row, all.len(), "n = {n}");
                all.extend(s.labels);
            }
            assert_eq!(all, (0..37).map(|i| i as f32).collect::<Vec<_>>(), "n = {n}");
        }
    }

    /// The case that motivated example-balanced shards: sorted labels, one class with lines ten
    /// times longer, comments, blank lines and no final newline.
    #[test]
    fn skewed_line_lengths_give_floor_or_ceil_examples_per_rank() {
        let mut text = String::from("# only a comment in the first bytes\n# and another\n\n");
        for i in 0..1000 {
            if i < 500 {
                text.push_str(&format!("-1 {}:1\n", i % 7 + 1));
            } else {
                let feats: String = (1..=40).map(|j| format!(" {j}:0.{i}")).collect();
                text.push_str(&format!("+1{feats}\n"));
            }
            if i % 97 == 0 {
                text.push_str("   # a comment line\n\n");
            }
        }
        text.pop();
        let (_d, p) = tmp(&text);
        for n in [1, 2, 3, 4, 7, 16] {
            let mut seen = 0;
            for r in 0..n {
                let s = read_libsvm(&p, r, n, None).unwrap();
                assert!(s.len() == 1000 / n || s.len() == 1000 / n + 1, "n = {n} rank {r}: {}", s.len());
                assert_eq!(s.first_row, seen);
                seen += s.len();
            }
            assert_eq!(seen, 1000);
        }
        // Byte-range chunks of the same file are badly unbalanced: what the old split gave.
        let c: Vec<u64> = (0..2).map(|r| count_chunk(&p, r, 2).unwrap().count.examples).collect();
        assert!(c[0] > 600 && c[1] < 400, "{c:?}");
    }

    #[test]
    fn comment_only_chunks_and_more_ranks_than_examples() {
        let mut text = "#".repeat(5000);
        text.push_str("\n+1 1:1\n-1 2:1\n");
        let (_d, p) = tmp(&text);
        let sizes: Vec<usize> = (0..4).map(|r| read_libsvm(&p, r, 4, None).unwrap().len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 2);
        assert!(sizes.iter().all(|&s| s <= 1), "{sizes:?}");
        let (_d, p) = tmp("+1 1:1\n-1 2:1\n");
        let sizes: Vec<usize> = (0..2).map(|r| read_libsvm(&p, r, 2, None).unwrap().len()).collect();
        assert_eq!(sizes, vec![1, 1]);
        let (_d, p) = tmp("# nothing\n");
        assert!((0..3).all(|r| read_libsvm(&p, r, 3, None).unwrap().is_empty()));
        let (_d, p) = tmp("");
        assert!((0..3).all(|r| read_libsvm(&p, r, 3, None).unwrap().is_empty()));
    }

    #[test]
    fn marks_find_any_example_like_a_full_scan() {
        let text: String = (0..10_000).map(|i| if i % 3 == 0 { format!("# c {i}\n\n{i} 1:1\n") } else { format!("{i} 2:{i}\n") }).collect();
        let (_d, p) = tmp(&text);
        let scan = count_chunk(&p, 1, 2).unwrap();
        assert!(scan.marks.len() >= 2, "{:?}", scan.marks);
        for skip in [0, 1, MARK_EVERY - 1, MARK_EVERY, MARK_EVERY + 7, scan.count.examples - 1, scan.count.examples] {
            assert_eq!(scan.locate(&p, skip).unwrap(), locate(&p, scan.count.start, skip).unwrap(), "skip {skip}");
        }
    }

    #[test]
    fn shard_start_skips_empty_chunks() {
        let c = |examples| ChunkCount { start: 0, end: 0, examples };
        let chunks = [c(0), c(6), c(0), c(2)];
        assert_eq!(shard_start(&chunks, 0, 4), (1, 0, 0));
        assert_eq!(shard_start(&chunks, 1, 4), (1, 2, 2));
        assert_eq!(shard_start(&chunks, 3, 4), (3, 0, 6));
        assert_eq!(shard_start(&[c(0), c(0)], 1, 2), (1, 0, 0));
    }

    #[test]
    fn errors_name_line_and_column_from_any_shard() {
        let mut text: String = (0..20).map(|_| "+1 1:1 2:2\n".to_string()).collect();
        text.push_str("-1 1:1 3:x\n");
        let (_d, p) = tmp(&text);
        for n in [1, 3] {
            let e = (0..n).find_map(|r| read_libsvm(&p, r, n, None).err()).unwrap();
            assert_eq!((e.line, e.column), (Some(21), Some(10)), "{e}");
        }
        let (_d, p) = tmp("+1 1:1\n-1 0:2\n");
        assert!(read_libsvm(&p, 0, 1, None).unwrap_err().to_string().contains("1-based"));
        let (_d, p) = tmp("+1 2:1 1:1\n");
        assert!(read_libsvm(&p, 0, 1, None).unwrap_err().to_string().contains("increase"));
        let (_d, p) = tmp("abc 1:1\n");
        assert_eq!(read_libsvm(&p, 0, 1, None).unwrap_err().column, Some(1));
        for bad in ["1 1:nan\n", "1 1:inf\n", "1 1:1e39\n", "nan 1:1\n", "1e300 1:1\n"] {
            let (_d, p) = tmp(bad);
            let e = read_libsvm(&p, 0, 1, None).unwrap_err();
            assert_eq!(e.line, Some(1), "{bad}: {e}");
        }
        // 2^32 + 1 would alias index 1 after a 32-bit cast.
        let (_d, p) = tmp("1 1:1 4294967297:1\n");
        let e = read_libsvm(&p, 0, 1, None).unwrap_err();
        assert!(e.message.contains("4294967297") && e.column == Some(7), "{e}");
        let (_d, p) = tmp("1 99999999999999999999999999999999999999999:1\n");
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
        for bad in ["0 1.5 3\n", "4294967296 0 1\n", "0 0 nan\n", "0 0 inf\n"] {
            let (_d, p) = tmp(bad);
            assert!(read_ratings(&p, 0, 1).is_err(), "{bad}");
        }
        let text: String = (0..10).map(|i| format!("{i} {i} 1\n")).collect();
        let (_d, p) = tmp(&text);
        let s: Vec<Dataset> = (0..3).map(|r| read_ratings(&p, r, 3).unwrap()).collect();
        assert_eq!(s.iter().map(|d| d.len()).collect::<Vec<_>>(), vec![3, 3, 4]);
        assert_eq!(s[2].first_row, 6);
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pipe.svm");
        assert!(std::process::Command::new("mkfifo").arg(&p).status().unwrap().success());
        let e = read_libsvm(p.to_str().unwrap(), 0, 2, None).unwrap_err();
        assert!(e.message.contains("FIFO"), "{e}");
        let e = read_libsvm(d.path().to_str().unwrap(), 0, 1, None).unwrap_err();
        assert!(e.message.contains("directory"), "{e}");
    }
}
