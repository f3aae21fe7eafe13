//! `asap-train data convert|info`.

use std::path::Path;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{load_file, Features, Format, LoadOptions, ZeroBasedArg};

/// Convert and inspect data files.
#[derive(Args, Debug)]
pub struct DataArgs {
    #[command(subcommand)]
    pub command: DataCommand,
}

/// The `data` subcommands.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Convert LIBSVM / IDX / ratings text into HDF5 (dense X,y; CSR indptr,indices,data,y with a
    /// `shape` attribute; or user,item,rating). LIBSVM rows at least a quarter non-zero are
    /// written dense, as `train` holds them. Written to a temporary file and renamed.
    Convert {
        /// Input file.
        input: String,
        /// Output HDF5 file.
        output: String,
        /// Input format when the extension does not tell.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        indexing: ZeroBasedArg,
    },
    /// Generate a seeded synthetic sparse two-class set (default: RCV1's shape, ~700,000 x
    /// 47,000 at 0.16 % density). Output format from the extension: .svm/.libsvm/.txt or .h5.
    /// Written to a temporary file and renamed.
    Synth {
        /// Output file (.svm, .libsvm, .txt: LIBSVM text; .h5: HDF5 CSR).
        output: String,
        /// Examples.
        #[arg(long, default_value_t = 697_641)]
        rows: usize,
        /// Features.
        #[arg(long, default_value_t = 47_236)]
        features: usize,
        /// Mean fraction of non-zero features per row.
        #[arg(long, default_value_t = 0.0016)]
        density: f64,
        /// Seed: the same seed gives the same file.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Probability that a label is flipped (the best reachable accuracy is about 1 - noise).
        #[arg(long, default_value_t = 0.05)]
        noise: f64,
        /// Write all -1 examples first, then all +1 examples.
        #[arg(long)]
        sort_by_label: bool,
    },
    /// Generate a seeded corpus with K planted topics over disjoint word blocks, in the UCI
    /// bag-of-words format: OUTPUT is the docword file, and vocab.* next to it (docword.X.txt ->
    /// vocab.X.txt; word j of topic t is named t<t>_w<j>). NYTimes' shape: --docs 300000 --words
    /// 102660 --doc-length 330. Written to temporary files and renamed.
    SynthLda {
        /// Output docword file (name it docword.NAME.txt so that --model lda finds the vocabulary).
        output: String,
        /// Documents.
        #[arg(long, default_value_t = 10_000)]
        docs: usize,
        /// Vocabulary size W (split into --topics disjoint blocks).
        #[arg(long, default_value_t = 5_000)]
        words: usize,
        /// Planted topics K.
        #[arg(long, default_value_t = 50)]
        topics: usize,
        /// Mean tokens per document (lengths uniform in [L/2, 3L/2]).
        #[arg(long, default_value_t = 100)]
        doc_length: usize,
        /// Dirichlet parameter of each document's topic mix (small: few topics per document).
        #[arg(long, default_value_t = 0.1)]
        alpha: f64,
        /// N >= 1: every document mixes N distinct planted topics (drawn uniformly) in equal
        /// shares instead of a Dirichlet(--alpha) mix; 0: the Dirichlet mix.
        #[arg(long, value_name = "N", default_value_t = 0)]
        topics_per_doc: usize,
        /// Word j of a topic's block is drawn with weight (j+1)^-S: 1 is Zipf, 1 + a the discrete
        /// Pareto tail of shape a.
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        word_exponent: f64,
        /// Seed: the same seed gives the same corpus.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Describe a data file: examples, features, non-zeros, labels, memory.
    Info {
        /// Data file.
        path: String,
        /// Format when the extension does not tell.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        indexing: ZeroBasedArg,
    },
}

/// `data convert`: a whole file into HDF5, written to a temporary file and renamed.
fn convert(input: &str, output: &str, format: Option<Format>, indexing: &ZeroBasedArg) -> anyhow::Result<()> {
    let mut d = load_file(input, &LoadOptions { format, zero_based: indexing.zero_based.unwrap_or_default(), ..Default::default() })?.0;
    // Rows train holds dense are written dense (X, y), as training would standardise them.
    if let Features::Sparse(c) = &d.features {
        if super::dense_enough(c.data.len() as f64, d.len() as f64, d.dim()) {
            let width = d.dim();
            super::make_dense(&mut d, width);
        }
    }
    let out = Path::new(output);
    let tmp = temp_next_to(out)?;
    super::h5::write_h5(&tmp, &d).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("cannot rename {} to {output}", tmp.display()))?;
    eprintln!("wrote {output}: {} examples, dimension {}", d.len(), d.dim());
    Ok(())
}

/// Runs a `data` subcommand.
pub fn run(args: &DataArgs) -> anyhow::Result<()> {
    match &args.command {
        DataCommand::Convert { input, output, format, indexing } => convert(input, output, *format, indexing),
        DataCommand::Synth { output, rows, features, density, seed, noise, sort_by_label } => {
            anyhow::ensure!(*rows > 0 && *features > 0, "--rows and --features must be positive");
            anyhow::ensure!(*density > 0.0 && *density <= 1.0, "--density must be in (0, 1], got {density}");
            anyhow::ensure!((0.0..=0.5).contains(noise), "--noise must be in [0, 0.5], got {noise}");
            anyhow::ensure!(
                *features as u64 <= super::text::MAX_FEATURE_INDEX,
                "--features must be at most {}",
                super::text::MAX_FEATURE_INDEX
            );
            let spec = super::synth::SynthSpec {
                rows: *rows,
                features: *features,
                density: *density,
                seed: *seed,
                noise: *noise,
                sort_by_label: *sort_by_label,
            };
            let out = Path::new(output);
            let h5 = matches!(super::detect_format(output)?, Format::Hdf5);
            let tmp = temp_next_to(out)?;
            if h5 {
                let d = super::synth::generate(&spec)?;
                super::h5::write_h5(&tmp, &d).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
            } else {
                let f = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
                let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
                super::synth::write_libsvm(&spec, &mut w).with_context(|| format!("cannot write {}", tmp.display()))?;
                w.into_inner().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?.sync_all()?;
            }
            std::fs::rename(&tmp, out).with_context(|| format!("cannot rename {} to {output}", tmp.display()))?;
            eprintln!("wrote {output}: {rows} examples, {features} features, density {density}, seed {seed}");
            Ok(())
        }
        DataCommand::SynthLda { output, docs, words, topics, doc_length, alpha, topics_per_doc, word_exponent, seed } => {
            let spec = super::synth_lda::LdaSynthSpec {
                docs: *docs,
                words: *words,
                topics: *topics,
                doc_length: *doc_length,
                alpha: *alpha,
                topics_per_doc: *topics_per_doc,
                word_exponent: *word_exponent,
                seed: *seed,
            };
            let vocab = super::bow::vocab_path_for(output).ok_or_else(|| {
                anyhow::anyhow!("{output}: name the output docword.NAME.txt (the vocabulary goes to vocab.NAME.txt beside it)")
            })?;
            let write = |path: &str, fill: &dyn Fn(&mut std::io::BufWriter<std::fs::File>) -> anyhow::Result<()>| -> anyhow::Result<()> {
                let out = Path::new(path);
                let tmp = temp_next_to(out)?;
                let f = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
                let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
                fill(&mut w).with_context(|| format!("cannot write {}", tmp.display()))?;
                w.into_inner().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?.sync_all()?;
                std::fs::rename(&tmp, out).with_context(|| format!("cannot rename {} to {path}", tmp.display()))
            };
            let counts = std::cell::Cell::new((0, 0));
            write(output, &|w| {
                counts.set(super::synth_lda::write_docword(&spec, w)?);
                Ok(())
            })?;
            write(&vocab, &|w| Ok(super::synth_lda::write_vocab(&spec, w)?))?;
            let (nnz, tokens) = counts.get();
            eprintln!("wrote {output} and {vocab}: {docs} documents, {words} words, {topics} planted topics, {nnz} lines, {tokens} tokens, seed {seed}");
            Ok(())
        }
        DataCommand::Info { path, format, indexing } => {
            let (d, zero_based) = load_file(
                path,
                &LoadOptions { format: *format, zero_based: indexing.zero_based.unwrap_or_default(), ..Default::default() },
            )?;
            anyhow::ensure!(
                !d.is_empty(),
                "{path} holds no examples (an empty file, or only comments and blank lines): nothing to describe"
            );
            let (kind, nnz) = match &d.features {
                Features::Dense { x, .. } => ("dense", x.iter().filter(|v| **v != 0.0).count()),
                Features::Sparse(c) => ("sparse", c.data.len()),
                Features::Ratings { .. } => ("ratings", d.len()),
            };
            println!("file        {path}");
            println!("layout      {kind}");
            println!("examples    {}", d.len());
            println!("dimension   {}", d.dim());
            if let Some(z) = zero_based {
                println!("indices     {}-based (LIBSVM; --zero-based {})", if z { 0 } else { 1 }, if z { "true" } else { "false" });
            }
            println!("non-zeros   {nnz} ({:.3} % dense)", 100.0 * nnz as f64 / (d.len() * d.dim().max(1)) as f64);
            let mut hist = std::collections::BTreeMap::<String, usize>::new();
            for y in &d.labels {
                *hist.entry(format!("{y}")).or_default() += 1;
            }
            let mut top: Vec<_> = hist.into_iter().collect();
            top.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
            let shown: Vec<String> = top.iter().take(10).map(|(k, v)| format!("{k}: {v}")).collect();
            println!("labels      {} distinct; {}", top.len(), shown.join(", "));
            println!("memory      {:.1} MB in this program", d.heap_bytes() as f64 / 1e6);
            Ok(())
        }
    }
}

/// A temporary name in the output's directory (created if needed), renamed over the output when
/// complete, so an interrupted run never leaves a half-written file under the real name.
fn temp_next_to(out: &Path) -> anyhow::Result<std::path::PathBuf> {
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.join(format!(".{}.tmp", out.file_name().and_then(|s| s.to_str()).unwrap_or("out"))))
}
