//! The UCI "Bag of Words" format (the NYTimes, PubMed, KOS, Enron corpora):
//! `docword.NAME.txt` holds three header lines D (documents), W (words) and NNZ (lines below),
//! then NNZ lines `docID wordID count` (1-based ids, sorted by docID); `vocab.NAME.txt` holds W
//! words, line w naming word w.
//!
//! Every rank reads only its own documents: the body's bytes are cut into N equal chunks, and
//! rank r owns the documents whose first line starts in chunk r. It reads the line just before
//! its chunk (to know which document is still its left neighbour's) and then lines until a new
//! document starts in the next rank's chunk, so shards are balanced by bytes (about by tokens)
//! and no rank reads more than its chunk plus one document.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use super::DataError;

/// This rank's documents, each a list of word ids (a word of count c appears c times).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Corpus {
    /// Document d's tokens are `tokens[doc_ptr[d]..doc_ptr[d + 1]]` (0-based word ids).
    pub doc_ptr: Vec<usize>,
    pub tokens: Vec<u32>,
    /// The 1-based id each document has in the file.
    pub doc_ids: Vec<u64>,
    /// W from the header (every word id is below it).
    pub words: usize,
    /// D and NNZ from the header (whole file).
    pub docs_in_file: u64,
    pub nnz_in_file: u64,
    /// `docID wordID count` lines this rank read.
    pub lines: u64,
    pub source: String,
}

impl Corpus {
    /// Documents held.
    pub fn len(&self) -> usize {
        self.doc_ptr.len().saturating_sub(1)
    }
    /// True when no document is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Document `d`'s tokens.
    pub fn doc(&self, d: usize) -> &[u32] {
        &self.tokens[self.doc_ptr[d]..self.doc_ptr[d + 1]]
    }
    /// An empty corpus over the same vocabulary.
    pub fn empty_like(&self) -> Corpus {
        Corpus { doc_ptr: vec![0], words: self.words, docs_in_file: self.docs_in_file, source: self.source.clone(), ..Default::default() }
    }
    /// Appends document `d` of `other`.
    pub fn push_doc(&mut self, other: &Corpus, d: usize) {
        self.tokens.extend_from_slice(other.doc(d));
        self.doc_ptr.push(self.tokens.len());
        self.doc_ids.push(other.doc_ids[d]);
    }
    /// Splits off the documents `held(doc_id)` selects (held-out set), keeping the others.
    pub fn split(self, held: impl Fn(u64) -> bool) -> (Corpus, Corpus) {
        let (mut keep, mut out) = (self.empty_like(), self.empty_like());
        for d in 0..self.len() {
            if held(self.doc_ids[d]) {
                out.push_doc(&self, d);
            } else {
                keep.push_doc(&self, d);
            }
        }
        keep.lines = self.lines;
        (keep, out)
    }
}

/// The `vocab` file that belongs to a `docword` file: `docword.X.txt` -> `vocab.X.txt` in the same
/// directory (UCI's naming), or None when the name does not start with `docword`.
pub fn vocab_path_for(docword: &str) -> Option<String> {
    let p = std::path::Path::new(docword);
    let name = p.file_name()?.to_str()?;
    let rest = name.strip_prefix("docword")?;
    Some(p.with_file_name(format!("vocab{rest}")).to_string_lossy().into_owned())
}

/// Reads a vocabulary: one word per line, exactly `words` lines.
pub fn read_vocab(path: &str, words: usize) -> Result<Vec<String>, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, &e))?;
    let vocab: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
    if vocab.len() != words {
        return Err(DataError::at(
            path,
            &format!("has {} lines but the docword header says W = {words} words (one word per line, line w naming word w)", vocab.len()),
        ));
    }
    Ok(vocab)
}

fn err_line(path: &str, line: usize, msg: String) -> DataError {
    DataError { path: path.into(), line: Some(line), column: None, message: msg }
}

/// Parses a line of unsigned integers into `out` (at most `out.len()`), returning how many.
fn parse_ints(line: &[u8], out: &mut [u64]) -> Result<usize, String> {
    let mut n = 0;
    for tok in line.split(|b| b.is_ascii_whitespace()).filter(|t| !t.is_empty()) {
        if n == out.len() {
            return Err(format!("more than {} numbers on the line", out.len()));
        }
        let s = std::str::from_utf8(tok).unwrap_or("?");
        out[n] = s.parse().map_err(|_| format!("{s:?} is not a non-negative integer"))?;
        n += 1;
    }
    Ok(n)
}

/// The header: (D, W, NNZ, byte offset where the body starts).
pub fn read_header(path: &str) -> Result<(u64, u64, u64, u64), DataError> {
    let f = File::open(path).map_err(|e| DataError::io(path, &e))?;
    let mut r = BufReader::new(f);
    let mut vals = [0u64; 3];
    let mut offset = 0u64;
    let mut line = Vec::new();
    for (i, name) in ["D (documents)", "W (words)", "NNZ (docID wordID count lines)"].iter().enumerate() {
        line.clear();
        let k = r.read_until(b'\n', &mut line).map_err(|e| DataError::io(path, &e))?;
        offset += k as u64;
        let mut v = [0u64; 1];
        match parse_ints(&line, &mut v) {
            Ok(1) => vals[i] = v[0],
            Ok(_) if k == 0 => {
                return Err(err_line(
                    path,
                    i + 1,
                    format!(
                        "the file ends before header line {} ({name}): a UCI docword file starts with D, W and NNZ, one per line",
                        i + 1
                    ),
                ))
            }
            Ok(_) => return Err(err_line(path, i + 1, format!("header line {} must hold one number, {name}", i + 1))),
            Err(e) => return Err(err_line(path, i + 1, format!("header line {} must hold {name}: {e}", i + 1))),
        }
    }
    if vals[1] == 0 || vals[1] > u32::MAX as u64 {
        return Err(err_line(path, 2, format!("W = {} words: must be in 1..={}", vals[1], u32::MAX)));
    }
    Ok((vals[0], vals[1], vals[2], offset))
}

/// One parsed body line: (docID, wordID, count).
fn parse_entry(path: &str, line: &[u8], at: u64, d: u64, w: u64) -> Result<(u64, u64, u64), DataError> {
    let bad = |m: String| err_line(path, super::text::line_number(path, at), m);
    let mut v = [0u64; 3];
    match parse_ints(line, &mut v) {
        Ok(3) => {}
        Ok(n) => return Err(bad(format!("expected `docID wordID count`, found {n} number(s)"))),
        Err(e) => return Err(bad(format!("expected `docID wordID count`: {e}"))),
    }
    if v[0] == 0 || v[0] > d {
        return Err(bad(format!("docID {} outside 1..={d} (the header's D)", v[0])));
    }
    if v[1] == 0 || v[1] > w {
        return Err(bad(format!("wordID {} outside 1..={w} (the header's W)", v[1])));
    }
    if v[2] == 0 || v[2] > u32::MAX as u64 {
        return Err(bad(format!("count {} must be a positive 32-bit integer", v[2])));
    }
    Ok((v[0], v[1], v[2]))
}

/// First line start at or after `c` (the body starts at `body`).
fn line_start_at_or_after(f: &mut File, c: u64, body: u64, size: u64, path: &str) -> Result<u64, DataError> {
    if c <= body {
        return Ok(body);
    }
    if c >= size {
        return Ok(size);
    }
    f.seek(SeekFrom::Start(c - 1)).map_err(|e| DataError::io(path, &e))?;
    let mut r = BufReader::new(f.try_clone().map_err(|e| DataError::io(path, &e))?);
    let mut skipped = Vec::new();
    let k = r.read_until(b'\n', &mut skipped).map_err(|e| DataError::io(path, &e))?;
    Ok(c - 1 + k as u64)
}

/// The docID of the line that ends just before line start `p` (None at the body's start).
fn doc_before(f: &mut File, p: u64, body: u64, d: u64, w: u64, path: &str) -> Result<Option<u64>, DataError> {
    if p <= body {
        return Ok(None);
    }
    let from = p.saturating_sub(4096).max(body);
    f.seek(SeekFrom::Start(from)).map_err(|e| DataError::io(path, &e))?;
    let mut buf = vec![0u8; (p - from) as usize];
    f.read_exact(&mut buf).map_err(|e| DataError::io(path, &e))?;
    let body_part = &buf[..buf.len().saturating_sub(1)];
    let start = match body_part.iter().rposition(|&b| b == b'\n') {
        Some(i) => i + 1,
        None if from == body => 0,
        None => {
            return Err(err_line(
                path,
                super::text::line_number(path, from),
                "a line longer than 4 KiB: not a `docID wordID count` line".into(),
            ))
        }
    };
    parse_entry(path, &buf[start..], from + start as u64, d, w).map(|e| Some(e.0))
}

/// Reads rank `rank`'s documents of `nranks` (see the module comment).
pub fn read_docword(path: &str, rank: usize, nranks: usize) -> Result<Corpus, DataError> {
    let size = super::check_regular(path)?;
    let (d, w, nnz, body) = read_header(path)?;
    let mut f = File::open(path).map_err(|e| DataError::io(path, &e))?;
    let cut = |r: usize| body + ((size - body) as u128 * r as u128 / nranks as u128) as u64;
    let start = line_start_at_or_after(&mut f, cut(rank), body, size, path)?;
    let next = line_start_at_or_after(&mut f, cut(rank + 1), body, size, path)?;
    let mut prev = doc_before(&mut f, start, body, d, w, path)?;
    let left = prev;
    f.seek(SeekFrom::Start(start)).map_err(|e| DataError::io(path, &e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut c =
        Corpus { doc_ptr: vec![0], words: w as usize, docs_in_file: d, nnz_in_file: nnz, source: path.into(), ..Default::default() };
    let (mut at, mut line) = (start, Vec::new());
    loop {
        line.clear();
        let k = r.read_until(b'\n', &mut line).map_err(|e| DataError::io(path, &e))?;
        if k == 0 {
            break;
        }
        let here = at;
        at += k as u64;
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let (doc, word, count) = parse_entry(path, &line, here, d, w)?;
        if let Some(p) = prev {
            if doc < p {
                return Err(err_line(
                    path,
                    super::text::line_number(path, here),
                    format!("docID {doc} after docID {p}: the lines must be sorted by docID (sort -n -k1,1 the body)"),
                ));
            }
        }
        let new_doc = prev != Some(doc);
        if new_doc && here >= next {
            break; // the next rank's first document
        }
        prev = Some(doc);
        if left == Some(doc) {
            continue; // the end of the left neighbour's document
        }
        if new_doc && !c.doc_ids.is_empty() {
            c.doc_ptr.push(c.tokens.len());
        }
        if new_doc {
            c.doc_ids.push(doc);
        }
        c.tokens.extend(std::iter::repeat_n(word as u32 - 1, count as usize));
        c.lines += 1;
    }
    if !c.doc_ids.is_empty() {
        c.doc_ptr.push(c.tokens.len());
    }
    Ok(c)
}

/// Writes a corpus in the UCI format (all documents; ids as stored), e.g. for `data synth-lda`.
pub fn write_docword(out: &mut impl std::io::Write, docs: &[Vec<(u32, u32)>], words: usize) -> std::io::Result<()> {
    let nnz: usize = docs.iter().map(|d| d.len()).sum();
    writeln!(out, "{}\n{}\n{}", docs.len(), words, nnz)?;
    for (i, doc) in docs.iter().enumerate() {
        for &(w, c) in doc {
            writeln!(out, "{} {} {}", i + 1, w + 1, c)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn every_document_is_read_by_exactly_one_rank() {
        let mut docs = Vec::new();
        for d in 0..37u32 {
            docs.push((0..(d % 5 + 1)).map(|k| ((d * 7 + k * 3) % 50, k + 1)).collect::<Vec<_>>());
        }
        let mut text = Vec::new();
        write_docword(&mut text, &docs, 50).unwrap();
        let f = file(std::str::from_utf8(&text).unwrap());
        let path = f.path().to_str().unwrap();
        for n in [1, 2, 3, 7, 40] {
            let mut ids = Vec::new();
            let mut tokens = 0;
            for r in 0..n {
                let c = read_docword(path, r, n).unwrap();
                for (k, &id) in c.doc_ids.iter().enumerate() {
                    let want: Vec<u32> = docs[id as usize - 1].iter().flat_map(|&(w, c)| std::iter::repeat_n(w, c as usize)).collect();
                    assert_eq!(c.doc(k), &want[..], "n {n} rank {r} doc {id}");
                }
                ids.extend(c.doc_ids.iter().copied());
                tokens += c.tokens.len();
            }
            assert_eq!(ids, (1..=37).collect::<Vec<u64>>(), "n {n}");
            assert_eq!(tokens, docs.iter().flatten().map(|p| p.1 as usize).sum::<usize>());
        }
    }

    #[test]
    fn malformed_input_names_file_and_line() {
        let cases = [
            ("3\n5\n2\n1 2 3\n1 9 1\n", 5, "wordID 9 outside"),
            ("3\n5\n2\n1 2 3\n4 1 1\n", 5, "docID 4 outside"),
            ("3\n5\n2\n2 2 3\n1 1 1\n", 5, "sorted by docID"),
            ("3\n5\n2\n1 2 0\n", 4, "count 0"),
            ("3\n5\n2\n1 2\n", 4, "found 2 number"),
            ("3\nx\n2\n", 2, "W (words)"),
            ("3\n5\n", 3, "ends before header line 3"),
            ("3\n5\n2\n1 2 three\n", 4, "\"three\" is not"),
        ];
        for (text, line, what) in cases {
            let f = file(text);
            let e = read_docword(f.path().to_str().unwrap(), 0, 1).unwrap_err();
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            assert!(e.to_string().contains(what), "{text:?}: {e}");
            assert!(e.to_string().starts_with(f.path().to_str().unwrap()));
        }
    }

    #[test]
    fn vocab_is_found_by_uci_naming_and_checked() {
        assert_eq!(vocab_path_for("/d/docword.nytimes.txt").as_deref(), Some("/d/vocab.nytimes.txt"));
        assert_eq!(vocab_path_for("docword.txt").as_deref(), Some("vocab.txt"));
        assert_eq!(vocab_path_for("/d/corpus.txt"), None);
        let f = file("a\nb\n");
        assert_eq!(read_vocab(f.path().to_str().unwrap(), 2).unwrap(), vec!["a", "b"]);
        assert!(read_vocab(f.path().to_str().unwrap(), 3).unwrap_err().to_string().contains("W = 3"));
    }
}
