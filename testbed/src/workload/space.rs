//! Where a run's keys and counters live.
//!
//! On a pool without an allocator that is the whole static virtual space
//! from `VIRT_BASE`. On a pool with `[pool.allocator]` the static space is
//! not mapped; the run's coordinator allocates one named object,
//! [`NAMED_OBJECT`], big enough for every client's keys, and the workers and
//! the final counter check open it by name.

use pmem_client::{AllocError, Allocator, AsyncPool, VIRT_BASE, error_chain};
use topology::Layout;

/// The named object holding a run's keys on an allocator pool.
pub const NAMED_OBJECT: &str = "testbed.workload";

/// A run's part of the virtual space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// First virtual address.
    pub base: u64,
    /// Bytes.
    pub len: u64,
}

/// The space of a run that needs `need` bytes: the static space, or the
/// named object, allocated here when it does not exist yet. Run once, by
/// the coordinator, before any worker starts.
pub async fn prepare(pool: &AsyncPool, need: u64) -> Result<Space, String> {
    let Some(allocator) = allocator(pool).await? else {
        return Ok(static_space(&pool.layout()));
    };
    let space = match allocator.open(NAMED_OBJECT).await {
        Ok((base, len)) => Space {
            base: base.get(),
            len,
        },
        Err(AllocError::NameNotFound(_)) => {
            let base = allocator
                .alloc_named(NAMED_OBJECT, need)
                .await
                .map_err(|e| format!("allocate {NAMED_OBJECT:?}: {}", error_chain(&e)))?;
            Space {
                base: base.get(),
                len: need,
            }
        }
        Err(e) => return Err(format!("open {NAMED_OBJECT:?}: {}", error_chain(&e))),
    };
    if space.len < need {
        return Err(format!(
            "named object {NAMED_OBJECT:?} holds {} bytes, this run needs {need}: \
             remove it (`pmemctl rm {NAMED_OBJECT}`) or run with fewer keys",
            space.len
        ));
    }
    Ok(space)
}

/// The space [`prepare`] made ready, for a worker or the counter check.
pub async fn open(pool: &AsyncPool) -> Result<Space, String> {
    let Some(allocator) = allocator(pool).await? else {
        return Ok(static_space(&pool.layout()));
    };
    let (base, len) = allocator
        .open(NAMED_OBJECT)
        .await
        .map_err(|e| format!("open {NAMED_OBJECT:?}: {}", error_chain(&e)))?;
    Ok(Space {
        base: base.get(),
        len,
    })
}

/// The pool's allocator, or `None` for a pool without one.
async fn allocator(pool: &AsyncPool) -> Result<Option<Allocator>, String> {
    if pool.layout().meta().is_none() {
        return Ok(None);
    }
    Allocator::attach(pool.clone())
        .await
        .map(Some)
        .map_err(|e| error_chain(&e))
}

/// Every region's bytes, from `VIRT_BASE`.
fn static_space(layout: &Layout) -> Space {
    Space {
        base: VIRT_BASE,
        len: layout.entries().iter().map(|e| e.len).sum(),
    }
}
