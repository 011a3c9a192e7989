//! Finding and removing what crashed runs left behind.

use std::collections::BTreeSet;

use super::NetnsError;
use super::apply::remove;
use super::enter::namespace_pids;
use super::host::require_root;
use super::ip::{list_namespaces, root_links};
use super::plan::{check_prefix, is_prefix, mgmt_group};

/// Whether a namespace name is one of a testbed run's (`pf…-s|f|c-…`).
pub(super) fn is_testbed_ns(name: &str, prefix: Option<&str>) -> bool {
    let Some((head, rest)) = name.split_once('-') else {
        return false;
    };
    let prefix_ok = match prefix {
        Some(p) => head == p,
        None => is_prefix(head),
    };
    prefix_ok && rest.len() > 2 && matches!(rest.as_bytes()[..2], [b's' | b'f' | b'c', b'-'])
}

/// Whether a root interface name is a testbed management end (`pf…-m<n>`).
pub(super) fn is_testbed_link(name: &str, prefix: Option<&str>) -> bool {
    let Some((head, rest)) = name.split_once('-') else {
        return false;
    };
    let prefix_ok = match prefix {
        Some(p) => head == p,
        None => is_prefix(head),
    };
    prefix_ok
        && rest
            .strip_prefix('m')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `testbed down`: removes every namespace and root-side management interface
/// of the run with `prefix`, or of every testbed run when `None`. Returns how
/// many namespaces and interfaces it removed. Processes still running inside
/// them keep their interfaces alive until they exit (see [`namespace_pids`]).
pub fn teardown_leftovers(prefix: Option<&str>) -> Result<usize, NetnsError> {
    if let Some(p) = prefix {
        check_prefix(p)?;
    }
    require_root()?;
    let namespaces: Vec<String> = list_namespaces()?
        .into_iter()
        .filter(|n| is_testbed_ns(n, prefix))
        .collect();
    let links: Vec<String> = root_links()?
        .into_iter()
        .filter(|n| is_testbed_link(n, prefix))
        .collect();
    let groups: BTreeSet<u32> = links
        .iter()
        .filter_map(|l| l.split_once('-'))
        .map(|(p, _)| mgmt_group(p))
        .collect();
    remove(&namespaces, &links, &Vec::from_iter(groups))
}

/// `testbed down` after a crash: kills the processes still running inside
/// the leftover namespaces of `prefix` (every testbed run when `None`), so
/// they release their interfaces, then removes the namespaces and
/// management interfaces. Returns (processes killed, items removed).
pub fn clean_up_crashed_runs(prefix: Option<&str>) -> Result<(usize, usize), NetnsError> {
    if let Some(p) = prefix {
        check_prefix(p)?;
    }
    require_root()?;
    let mut killed = 0;
    for ns in list_namespaces()?
        .into_iter()
        .filter(|n| is_testbed_ns(n, prefix))
    {
        for pid in namespace_pids(&ns)? {
            let Ok(pid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: kill(2) has no memory effects; the pid was listed by
            // the kernel as running inside a testbed namespace.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    if killed > 0 {
        // Give the kernel a moment to reap them and release their interfaces.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok((killed, teardown_leftovers(prefix)?))
}
