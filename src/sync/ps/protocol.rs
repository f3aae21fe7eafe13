//! The messages between the SSP clients and the shard servers of the parameter-server engine
//! (Bosen §3.1-3.2: a push carries a clock's update with the read request of the next clock; the
//! answer carries the rows changed since the worker last got them). Two-sided messages on the
//! rank's postbox; the rows themselves are encoded by the row codec ([`crate::sync::codec::rows`]).

/// Worker -> server: `[clock u64][want u64][flags u64]` + rows (the rows this worker changed).
pub const TAG_PUSH: i32 = 11;
/// Server -> worker: `[cmin u64][flags u64]` + rows (the rows changed since this worker got them).
pub const TAG_ROWS: i32 = 12;
/// Push flag: part of a clock's update sent early (bosen), not the end of the clock.
pub const PARTIAL: u64 = 1;
/// Push flag: values are binary16.
pub const HALF: u64 = 2;
/// Flag: each row carries the version it was computed from / is sent at (AdaRevision).
pub const VERSIONS: u64 = 4;
/// Rows flag: pushed by the server between clocks (bosen), not the answer to a read.
pub const UNSOLICITED: u64 = 1;
/// Rows flag: besides [`UNSOLICITED`], sent by the send policy from spare budget (bosen's fresh
/// rows), not a part of a read's answer: it may be taken back before it leaves.
pub const EARLY: u64 = 8;
