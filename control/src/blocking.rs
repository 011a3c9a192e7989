//! The runtime a blocking entry point (`*_blocking`, `read_copy_states`,
//! `device_registered`, ...) runs its control-plane calls on, for callers
//! without async code of their own.

use crate::error::ControlError;

/// A current-thread tokio runtime with I/O and timers, for one blocking
/// call's `block_on`.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ControlError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ControlError::Runtime { source })
}
