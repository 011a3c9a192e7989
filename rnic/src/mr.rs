//! [`Registration`]: memory registered with the RNIC at an I/O virtual
//! address the caller chooses, so that a remote peer names a place in it
//! by its offset rather than by this process's addresses.
//!
//! sideway registers memory only at its own virtual address, so this calls
//! `ibv_reg_mr_iova2` itself and deregisters on drop.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys::{ibv_dereg_mr, ibv_mr, ibv_reg_mr_iova2};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use crate::error::RnicError;

/// `EOPNOTSUPP` from `ibv_reg_mr`: the kernel will not pin these pages for
/// long (fsdax file pages, since Linux 5.x), or the provider lacks an
/// access flag.
pub const EOPNOTSUPP: i32 = 95;
/// `EFAULT` from `ibv_reg_mr`: writable file pages that need dirty
/// tracking (an ordinary filesystem's page cache) cannot be pinned for long.
pub const EFAULT: i32 = 14;
/// `EINVAL` from `ibv_reg_mr`: an access flag the device refuses for this
/// memory (rxe: FLUSH_PERSISTENT on pages that are not persistent memory).
pub const EINVAL: i32 = 22;

/// A memory registration; deregistered on drop (before its protection
/// domain, which it keeps alive).
#[derive(Debug)]
pub struct Registration {
    mr: NonNull<ibv_mr>,
    len: usize,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an ibv_mr is a handle the verbs library allows to be used and
// deregistered from any thread; this value owns it alone.
unsafe impl Send for Registration {}
// SAFETY: `&self` only reads the handle's immutable lkey and rkey.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `len` bytes at `addr` with `access`, at I/O virtual
    /// address `iova` (remote requests name `iova + offset`).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be mapped for as long as the registration
    /// lives, and what remote peers write there (per `access`) must be
    /// acceptable to whoever else uses that memory.
    pub unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
        what: &str,
    ) -> Result<Self, RnicError> {
        // SAFETY: the PD handle is valid while `pd` lives, and the
        // registration keeps `pd` alive; the memory range is the caller's
        // promise. Access bits are a plain int the kernel validates.
        let mr = unsafe {
            ibv_reg_mr_iova2(
                pd.pd().as_ptr(),
                addr.cast(),
                len,
                iova,
                access.bits() as u32,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Registration {
                mr,
                len,
                _pd: Arc::clone(pd),
            }),
            None => Err(RnicError::RegMr {
                what: what.to_owned(),
                len,
                source: io::Error::last_os_error(),
            }),
        }
    }

    /// The key remote peers present.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the handle is valid until drop; rkey never changes.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The key local work requests present.
    pub fn lkey(&self) -> u32 {
        // SAFETY: as for `rkey`.
        unsafe { self.mr.as_ref().lkey }
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered in `new` and deregistered only here; the PD is
        // still alive (we hold it).
        unsafe {
            ibv_dereg_mr(self.mr.as_ptr());
        }
    }
}
