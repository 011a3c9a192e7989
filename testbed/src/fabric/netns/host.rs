//! What the host must offer: root, and a prefix no other run uses.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use super::NetnsError;
use super::ip::{in_block, list_namespaces, root_addresses, root_links};
use super::plan::mgmt_block;

/// Fails with [`NetnsError::NotRoot`] unless the effective user is root.
pub fn require_root() -> Result<(), NetnsError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok(())
    } else {
        Err(NetnsError::NotRoot)
    }
}

/// A prefix no namespace, root interface or management block on this machine
/// uses yet and that this process has not handed out before: `pf` plus four
/// base-36 characters.
pub fn fresh_prefix() -> Result<String, NetnsError> {
    static GIVEN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
    let namespaces = list_namespaces()?;
    let links = root_links()?;
    let addresses = root_addresses()?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(nanos);
    for _ in 0..4096 {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let mut n = (seed >> 4) % 1_679_616; // 36^4
        let mut digits = [0u8; 4];
        for digit in digits.iter_mut().rev() {
            *digit = b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize];
            n /= 36;
        }
        let prefix = format!("pf{}", String::from_utf8_lossy(&digits));
        let block = mgmt_block(&prefix);
        let dash = format!("{prefix}-");
        if given.contains(&block)
            || namespaces.iter().any(|n| n.starts_with(&dash))
            || links.iter().any(|l| l.starts_with(&dash))
            || addresses.iter().any(|a| in_block(*a, block))
        {
            continue;
        }
        given.insert(block);
        return Ok(prefix);
    }
    Err(NetnsError::InUse(
        "no free netns prefix found; remove old runs with `testbed down`".to_owned(),
    ))
}
