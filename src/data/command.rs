//! `asap-train data convert|info`.

use std::path::Path;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{load_shard, Features, Format, LoadOptions};

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
    /// `shape` attribute; or user,item,rating). Written to a temporary file and renamed.
    Convert {
        /// Input file.
        input: String,
        /// Output HDF5 file.
        output: String,
        /// Input format when the extension does not tell.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// Describe a data file: examples, features, non-zeros, labels, memory.
    Info {
        /// Data file.
        path: String,
        /// Format when the extension does not tell.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
}

/// Runs a `data` subcommand.
pub fn run(args: &DataArgs) -> anyhow::Result<()> {
    match &args.command {
        DataCommand::Convert { input, output, format } => {
            let d = load_shard(input, &LoadOptions { format: *format, ..Default::default() }, 0, 1)?;
            let out = Path::new(output);
            let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let tmp = dir.join(format!(".{}.tmp", out.file_name().and_then(|s| s.to_str()).unwrap_or("out")));
            super::h5::write_h5(&tmp, &d).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, out).with_context(|| format!("cannot rename {} to {output}", tmp.display()))?;
            eprintln!("wrote {output}: {} examples, dimension {}", d.len(), d.dim());
            Ok(())
        }
        DataCommand::Info { path, format } => {
            let d = load_shard(path, &LoadOptions { format: *format, ..Default::default() }, 0, 1)?;
            let (kind, nnz) = match &d.features {
                Features::Dense { x, .. } => ("dense", x.iter().filter(|v| **v != 0.0).count()),
                Features::Sparse(c) => ("sparse", c.data.len()),
                Features::Ratings { .. } => ("ratings", d.len()),
            };
            println!("file        {path}");
            println!("layout      {kind}");
            println!("examples    {}", d.len());
            println!("dimension   {}", d.dim());
            println!("non-zeros   {nnz} ({:.3} % dense)", 100.0 * nnz as f64 / (d.len() * d.dim().max(1)) as f64);
            let mut hist = std::collections::BTreeMap::<String, usize>::new();
            for y in &d.labels {
                *hist.entry(format!("{y}")).or_default() += 1;
            }
            let mut top: Vec<_> = hist.into_iter().collect();
            top.sort_by(|a, b| b.1.cmp(&a.1));
            let shown: Vec<String> = top.iter().take(10).map(|(k, v)| format!("{k}: {v}")).collect();
            println!("labels      {} distinct; {}", top.len(), shown.join(", "));
            println!("memory      {:.1} MB in this program", d.heap_bytes() as f64 / 1e6);
            Ok(())
        }
    }
}
