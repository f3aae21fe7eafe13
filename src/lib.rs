//! asap-train: data-parallel SGD over MPI.
//!
//! Layers (lower never depends on upper):
//! - [`graph`] (pure maths), [`data`] and [`model`] (no MPI) at the bottom;
//! - [`comm`] (MPI and one-sided RMA, knows nothing of ML) beside them;
//! - [`sync`] (the exchange modes, which see a model as a flat `f32` slice with rows);
//! - the training loop ([`train`]), configuration ([`config`]) and command line ([`cli`]) on top.

// Links OpenBLAS (through ndarray-linalg), which also serves ndarray's matrix products.
extern crate ndarray_linalg;

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod comm;
pub mod config;
pub mod data;
pub mod graph;
pub mod model;
pub mod plot;
pub mod predict;
pub mod rng;
pub mod sync;
pub mod train;
pub mod values;
