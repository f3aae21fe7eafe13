//! A safe one-sided (RMA) window over `mpi::ffi`, since rsmpi 0.8 has no RMA API.
//!
//! One [`Window`] is one `MPI_Win_allocate` region per rank, kept in a passive-target epoch
//! (`MPI_Win_lock_all`) for its whole life. Offsets are in bytes (displacement unit 1). Every
//! operation that reads or writes a caller's buffer completes locally before it returns, so the
//! buffer may be reused at once; remote completion needs [`Window::flush`].
//!
//! The window's own memory is written by other ranks behind the compiler's back, so local access
//! goes only through volatile or atomic loads and stores ([`Window::load_u64`],
//! [`Window::read_local`], ...), never through a plain slice.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::collective::CommunicatorCollectives;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

extern "C" {
    // Defined in src/comm/shim.c (compiled by build.rs against the same mpi.h).
    fn asap_mpi_op_replace() -> ffi::MPI_Op;
    fn asap_mpi_op_no_op() -> ffi::MPI_Op;
}

/// Error from an MPI one-sided call: the call's name and MPI's own error string.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {message} (MPI error code {code})")]
pub struct RmaError {
    /// The MPI function that failed.
    pub call: &'static str,
    /// MPI's error code.
    pub code: i32,
    /// MPI's description of the code.
    pub message: String,
}

/// Result of a window operation.
pub type RmaResult<T> = Result<T, RmaError>;

/// Turns an MPI return code into a [`RmaResult`], fetching MPI's error string on failure.
fn check(call: &'static str, code: c_int) -> RmaResult<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: buf holds MPI_MAX_ERROR_STRING + 1 bytes as MPI_Error_string requires, and len is a
    // valid out-pointer; MPI_Error_string may be called at any time after MPI_Init.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    let message = if rc == ffi::MPI_SUCCESS as c_int {
        String::from_utf8_lossy(&buf[..len.clamp(0, buf.len() as c_int) as usize]).into_owned()
    } else {
        "unknown MPI error".to_owned()
    };
    Err(RmaError { call, code, message })
}

mod sealed {
    pub trait Sealed {}
}

/// Element types the window can move, with their MPI datatype. Sealed: only plain-old-data
/// types whose every bit pattern is valid, so bytes written remotely are always a valid value.
pub trait RmaElement: Copy + Default + sealed::Sealed {
    /// The matching MPI datatype handle.
    fn datatype() -> ffi::MPI_Datatype;
}

macro_rules! rma_element {
    ($t:ty, $dt:ident) => {
        impl sealed::Sealed for $t {}
        impl RmaElement for $t {
            fn datatype() -> ffi::MPI_Datatype {
                // SAFETY: reading an immutable extern static initialised by rsmpi's C shim.
                unsafe { ffi::$dt }
            }
        }
    };
}
rma_element!(u8, RSMPI_UINT8_T);
rma_element!(u64, RSMPI_UINT64_T);
rma_element!(i64, RSMPI_INT64_T);
rma_element!(f32, RSMPI_FLOAT);
rma_element!(f64, RSMPI_DOUBLE);

/// Reduction operations for [`Window::accumulate`] and [`Window::fetch_and_op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaOp {
    /// target += origin.
    Sum,
    /// target = origin (atomic replace).
    Replace,
    /// target unchanged (atomic read with fetch_and_op).
    NoOp,
}

impl RmaOp {
    fn raw(self) -> ffi::MPI_Op {
        // SAFETY: RSMPI_SUM is an immutable extern static; the shim functions take no arguments
        // and return a predefined handle valid for the whole MPI session.
        unsafe {
            match self {
                RmaOp::Sum => ffi::RSMPI_SUM,
                RmaOp::Replace => asap_mpi_op_replace(),
                RmaOp::NoOp => asap_mpi_op_no_op(),
            }
        }
    }
}

/// Rounds a byte count up to a multiple of 16: MPICH 4.0.2 misplaces remote data by 8 bytes in
/// windows whose size is not a multiple of 16 (measured with Debian's MPICH 4.0.2 here).
pub fn pad16(bytes: usize) -> usize {
    bytes.div_ceil(16).max(1) * 16
}

/// An allocated RMA window in a `lock_all` epoch. Freed (after `unlock_all`) in `Drop`.
pub struct Window {
    win: ffi::MPI_Win,
    base: *mut u8,
    /// Usable bytes of the local window (padded size).
    len: usize,
    /// Private duplicate of the creating communicator: the window never depends on the caller
    /// keeping theirs alive, and its traffic cannot mix with the caller's messages.
    comm: SimpleCommunicator,
    rank: i32,
}

impl Window {
    /// Collectively allocates `bytes` (padded to 16) of zeroed window memory on every rank of
    /// `comm` and opens a passive-target epoch to all ranks. Ends with a barrier so no rank can
    /// write into a peer's window before that peer zeroed it.
    pub fn allocate(comm: &SimpleCommunicator, bytes: usize) -> RmaResult<Window> {
        let comm = comm.duplicate();
        let len = pad16(bytes);
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: RSMPI_WIN_NULL is the correct "no window" value for either MPI (pointer or
        // int handle types), never a null pointer literal.
        let mut win: ffi::MPI_Win = unsafe { ffi::RSMPI_WIN_NULL };
        // SAFETY: `comm` is a live communicator; MPI_Win_allocate writes the base address into
        // `base` (passed as a pointer to the pointer, as the standard specifies for baseptr) and
        // the new handle into `win`. Collective over `comm`, which every caller joins.
        check("MPI_Win_allocate", unsafe {
            ffi::MPI_Win_allocate(
                len as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                comm.as_raw(),
                (&mut base as *mut *mut u8).cast::<c_void>(),
                &mut win,
            )
        })?;
        // SAFETY: `win` is the window just created; errors must come back as codes so they turn
        // into `RmaError`s instead of aborting the job.
        check("MPI_Win_set_errhandler", unsafe { ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN) })?;
        let rank = comm.rank();
        let window = Window { win, base, len, comm, rank };
        // SAFETY: `base` points to `len` bytes we own; nobody else writes them before the barrier
        // below, and the epoch is not open yet.
        unsafe { std::ptr::write_bytes(window.base, 0, window.len) };
        // SAFETY: `win` is valid and no epoch is open on it yet.
        check("MPI_Win_lock_all", unsafe { ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, window.win) })?;
        window.sync()?;
        window.comm.barrier();
        Ok(window)
    }

    /// This rank's number in the window's communicator.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// Number of ranks sharing the window.
    pub fn size(&self) -> i32 {
        self.comm.size()
    }

    /// Usable bytes of the local window (after padding).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no usable bytes (never true: sizes are padded to 16).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window's private communicator (for barriers and collectives that must order with it).
    pub fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    fn check_target(&self, target: i32) -> RmaResult<()> {
        if target < 0 || target >= self.size() {
            return Err(RmaError { call: "target check", code: -1, message: format!("rank {target} is outside 0..{}", self.size()) });
        }
        Ok(())
    }

    fn count(call: &'static str, n: usize) -> RmaResult<c_int> {
        c_int::try_from(n).map_err(|_| RmaError { call, code: -1, message: format!("{n} elements exceed the MPI count range") })
    }

    /// Writes `data` into `target`'s window at byte `offset`. Locally complete on return;
    /// remotely complete after [`Window::flush`].
    pub fn put<T: RmaElement>(&self, target: i32, offset: usize, data: &[T]) -> RmaResult<()> {
        self.check_target(target)?;
        let n = Self::count("MPI_Put", data.len())?;
        // SAFETY: `data` is a live slice of n elements of T's datatype; `win` is in a lock_all
        // epoch. MPI reads the origin buffer until local completion, which flush_local forces
        // before `data`'s borrow ends. Remote bounds are checked by MPI (error, not UB).
        check("MPI_Put", unsafe {
            ffi::MPI_Put(data.as_ptr().cast(), n, T::datatype(), target, offset as ffi::MPI_Aint, n, T::datatype(), self.win)
        })?;
        self.flush_local(target)
    }

    /// Reads `out.len()` elements from `target`'s window at byte `offset` (blocking: the data is
    /// in `out` on return).
    pub fn get<T: RmaElement>(&self, target: i32, offset: usize, out: &mut [T]) -> RmaResult<()> {
        self.check_target(target)?;
        let n = Self::count("MPI_Get", out.len())?;
        // SAFETY: `out` is a live exclusive slice of n elements; MPI writes it until the flush
        // below completes the get, all within `out`'s borrow. Every bit pattern is a valid T.
        check("MPI_Get", unsafe {
            ffi::MPI_Get(out.as_mut_ptr().cast(), n, T::datatype(), target, offset as ffi::MPI_Aint, n, T::datatype(), self.win)
        })?;
        self.flush(target)
    }

    /// Reads `count` elements from `target`'s window at byte `offset` like [`Window::get`], but
    /// gives up after `limit`: `Ok(None)` when the read did not complete by then.
    ///
    /// For diagnosing a stuck job under MPICH 4.0.2 (ch4:ucx), where a get completes only while
    /// the target calls into MPI (measured: `MPI_Win_flush` after a get from a SIGSTOPped rank
    /// never returned). The get is a request (`MPI_Rget`) polled with `MPI_Test`; an unfinished
    /// one is leaked with its buffer (MPI may still write it), which is acceptable only on the
    /// way to an abort. Under Open MPI's osc/ucx prefer [`Window::get`]: there `MPI_Rget`
    /// requests often did not complete within 0.5 s even from live targets.
    pub fn get_within<T: RmaElement>(&self, target: i32, offset: usize, count: usize, limit: Duration) -> RmaResult<Option<Vec<T>>> {
        self.check_target(target)?;
        let n = Self::count("MPI_Rget", count)?;
        let mut buf = vec![T::default(); count].into_boxed_slice();
        // SAFETY: rsmpi's handle statics are immutable after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` is a heap buffer of n elements that stays alive and unmoved until the
        // request completes, or is leaked with the request below; every bit pattern is a valid T.
        check("MPI_Rget", unsafe {
            ffi::MPI_Rget(
                buf.as_mut_ptr().cast(),
                n,
                T::datatype(),
                target,
                offset as ffi::MPI_Aint,
                n,
                T::datatype(),
                self.win,
                &mut request,
            )
        })?;
        let start = Instant::now();
        loop {
            let mut done: c_int = 0;
            // SAFETY: `request` came from MPI_Rget and has not completed yet.
            check("MPI_Test", unsafe { ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE) })?;
            if done != 0 {
                return Ok(Some(buf.into_vec()));
            }
            if start.elapsed() > limit {
                std::mem::forget(buf);
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }

    /// Element-wise atomic `op` of `data` into `target`'s window at byte `offset` (atomic with
    /// respect to other accumulate-family operations on the same location). Locally complete on
    /// return.
    pub fn accumulate<T: RmaElement>(&self, target: i32, offset: usize, data: &[T], op: RmaOp) -> RmaResult<()> {
        self.check_target(target)?;
        let n = Self::count("MPI_Accumulate", data.len())?;
        // SAFETY: as in `put`: the origin buffer is live until flush_local completes the call.
        check("MPI_Accumulate", unsafe {
            ffi::MPI_Accumulate(
                data.as_ptr().cast(),
                n,
                T::datatype(),
                target,
                offset as ffi::MPI_Aint,
                n,
                T::datatype(),
                op.raw(),
                self.win,
            )
        })?;
        self.flush_local(target)
    }

    /// Atomically applies `op` with `value` to the element at byte `offset` of `target`'s window
    /// and returns its previous value (blocking).
    pub fn fetch_and_op<T: RmaElement>(&self, target: i32, offset: usize, value: T, op: RmaOp) -> RmaResult<T> {
        self.check_target(target)?;
        let mut result = T::default();
        // SAFETY: `value` and `result` are live locals for the whole call including the flush
        // that completes it; the datatype matches T.
        check("MPI_Fetch_and_op", unsafe {
            ffi::MPI_Fetch_and_op(
                (&value as *const T).cast(),
                (&mut result as *mut T).cast(),
                T::datatype(),
                target,
                offset as ffi::MPI_Aint,
                op.raw(),
                self.win,
            )
        })?;
        self.flush(target)?;
        Ok(result)
    }

    /// Atomically adds `value` to the u64 at `offset` in `target`'s window; returns the old value.
    pub fn fetch_add_u64(&self, target: i32, offset: usize, value: u64) -> RmaResult<u64> {
        self.fetch_and_op(target, offset, value, RmaOp::Sum)
    }

    /// Atomically reads the u64 at `offset` in `target`'s window (fetch_and_op with MPI_NO_OP),
    /// consistent with concurrent accumulates; also drives MPI progress.
    pub fn atomic_read_u64(&self, target: i32, offset: usize) -> RmaResult<u64> {
        self.fetch_and_op(target, offset, 0u64, RmaOp::NoOp)
    }

    /// Atomic compare-and-swap of the u64 at `offset` in `target`'s window: stores `new` if the
    /// value equals `compare`; returns the previous value either way.
    pub fn compare_and_swap_u64(&self, target: i32, offset: usize, compare: u64, new: u64) -> RmaResult<u64> {
        self.check_target(target)?;
        let mut result = 0u64;
        // SAFETY: all three buffers are live locals until the flush completes the operation.
        check("MPI_Compare_and_swap", unsafe {
            ffi::MPI_Compare_and_swap(
                (&new as *const u64).cast(),
                (&compare as *const u64).cast(),
                (&mut result as *mut u64).cast(),
                u64::datatype(),
                target,
                offset as ffi::MPI_Aint,
                self.win,
            )
        })?;
        self.flush(target)?;
        Ok(result)
    }

    /// Completes every operation this rank issued to `target`, at the target.
    pub fn flush(&self, target: i32) -> RmaResult<()> {
        self.check_target(target)?;
        // SAFETY: `win` is valid and in a lock_all epoch.
        check("MPI_Win_flush", unsafe { ffi::MPI_Win_flush(target, self.win) })
    }

    /// Completes every operation this rank issued to `target`, locally (origin buffers free).
    pub fn flush_local(&self, target: i32) -> RmaResult<()> {
        // SAFETY: `win` is valid and in a lock_all epoch.
        check("MPI_Win_flush_local", unsafe { ffi::MPI_Win_flush_local(target, self.win) })
    }

    /// Completes every operation this rank issued, at all targets.
    pub fn flush_all(&self) -> RmaResult<()> {
        // SAFETY: `win` is valid and in a lock_all epoch.
        check("MPI_Win_flush_all", unsafe { ffi::MPI_Win_flush_all(self.win) })
    }

    /// Synchronises the public and private copies of the local window (`MPI_Win_sync`): call it
    /// before local loads of remotely written data and after local stores others should see.
    pub fn sync(&self) -> RmaResult<()> {
        // SAFETY: `win` is valid and in a lock_all epoch (required by MPI_Win_sync).
        check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win) })
    }

    /// Lets MPI progress incoming operations (some osc components need the target to call into
    /// MPI). A cheap non-blocking probe on the window's communicator.
    pub fn progress(&self) -> RmaResult<()> {
        let mut flag: c_int = 0;
        // SAFETY: the communicator is live; flag is a valid out-pointer; RSMPI_STATUS_IGNORE is
        // the predefined "no status" pointer.
        check("MPI_Iprobe", unsafe {
            ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, ffi::RSMPI_ANY_TAG, self.comm.as_raw(), &mut flag, ffi::RSMPI_STATUS_IGNORE)
        })
    }

    fn check_local(&self, offset: usize, bytes: usize, align: usize) {
        assert!(
            offset.is_multiple_of(align) && offset.checked_add(bytes).is_some_and(|end| end <= self.len),
            "local window access [{offset}, +{bytes}) misaligned (need {align}) or outside 0..{}",
            self.len
        );
    }

    /// Atomic (acquire) load of the u64 at `offset` of the local window. Panics if misaligned or
    /// out of bounds (a programming error, not a run-time condition).
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.check_local(offset, 8, 8);
        // SAFETY: bounds and 8-byte alignment are checked (the base from MPI_Win_allocate is at
        // least 16-aligned); AtomicU64 has u64's layout, and atomic access is the right tool for
        // memory another agent writes concurrently. The window outlives the reference.
        let cell = unsafe { &*(self.base.add(offset) as *const AtomicU64) };
        cell.load(Ordering::Acquire)
    }

    /// The u64 at `offset` of the local window as an atomic cell, for a thread of this process
    /// that must update it without borrowing the window (the caller keeps the window alive for
    /// as long as it uses the pointer). Panics if misaligned or out of bounds.
    pub fn local_atomic_u64(&self, offset: usize) -> *const AtomicU64 {
        self.check_local(offset, 8, 8);
        // SAFETY: in bounds and aligned (checked above); only a pointer is formed here.
        unsafe { self.base.add(offset) as *const AtomicU64 }
    }

    /// Atomic (release) store of a u64 at `offset` of the local window.
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.check_local(offset, 8, 8);
        // SAFETY: as in `load_u64`.
        let cell = unsafe { &*(self.base.add(offset) as *const AtomicU64) };
        cell.store(value, Ordering::Release);
    }

    /// Copies `out.len()` elements from the local window at `offset` with volatile loads, so the
    /// compiler never reuses an earlier read of memory that remote ranks may have changed.
    pub fn read_local<T: RmaElement>(&self, offset: usize, out: &mut [T]) {
        let size = std::mem::size_of::<T>();
        self.check_local(offset, std::mem::size_of_val(out), size);
        std::sync::atomic::fence(Ordering::Acquire);
        let src = self.base.wrapping_add(offset) as *const T;
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: in bounds and aligned (checked above); every bit pattern is a valid T
            // (sealed RmaElement). A concurrent remote write can give a torn value, which the
            // caller's header/footer check detects; it cannot make the read itself unsound for
            // these plain types.
            *o = unsafe { std::ptr::read_volatile(src.add(i)) };
        }
        std::sync::atomic::fence(Ordering::Acquire);
    }
}

impl Window {
    /// Lends `len` elements of the local window at `offset` to `f` as a plain slice (bulk,
    /// vectorisable reads instead of [`Window::read_local`]'s volatile element copies). Only for
    /// memory that no rank writes while `f` runs, which the caller's protocol must guarantee
    /// (NOTIFY-ACK: a slot between its NOTIFY and our ACK); panics if out of bounds or misaligned.
    pub fn quiescent_local<T: RmaElement, R>(&self, offset: usize, len: usize, f: impl FnOnce(&[T]) -> R) -> R {
        let size = std::mem::size_of::<T>();
        self.check_local(offset, len * size, size);
        // Remote writes completed before the caller's MPI_Win_sync are visible from here on.
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: in bounds and aligned (checked above); every bit pattern is a valid T (sealed
        // RmaElement); the window memory outlives this call, and by the caller's protocol no
        // remote put targets this range while the shared slice exists, so nothing mutates
        // memory behind the reference.
        let slice = unsafe { std::slice::from_raw_parts(self.base.add(offset) as *const T, len) };
        f(slice)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Freeing after MPI_Finalize is undefined; the OS reclaims the memory then anyway.
        if mpi::environment::is_finalized() {
            return;
        }
        // SAFETY: `win` is valid and in the lock_all epoch opened in `allocate`; after unlock
        // MPI_Win_free (collective, like every rank's Drop) releases it and resets the handle.
        // Errors cannot be returned from Drop; they are reported on stderr.
        unsafe {
            if let Err(e) = check("MPI_Win_unlock_all", ffi::MPI_Win_unlock_all(self.win)) {
                eprintln!("asap-train: rank {}: {e}", self.rank);
            }
            if let Err(e) = check("MPI_Win_free", ffi::MPI_Win_free(&mut self.win)) {
                eprintln!("asap-train: rank {}: {e}", self.rank);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pad16;

    #[test]
    fn window_sizes_pad_to_16_bytes_and_never_to_zero() {
        assert_eq!(pad16(0), 16);
        assert_eq!(pad16(1), 16);
        assert_eq!(pad16(16), 16);
        assert_eq!(pad16(17), 32);
        assert_eq!(pad16(7850 * 4 + 16), 31424);
    }
}
