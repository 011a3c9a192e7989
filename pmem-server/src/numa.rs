//! Running a NIC's threads on the NUMA node of its socket's PMEM: the CPUs
//! of a node from sysfs, and pinning the calling thread to them (threads it
//! starts afterwards inherit the pinning).

use std::io;
use std::path::Path;

/// The CPUs of NUMA node `node`, from `<sys>/devices/system/node/nodeN/cpulist`.
pub fn node_cpus(sys: &Path, node: u32) -> Option<Vec<usize>> {
    let list = std::fs::read_to_string(
        sys.join("devices/system/node")
            .join(format!("node{node}"))
            .join("cpulist"),
    )
    .ok()?;
    parse_cpulist(&list)
}

/// Parses a kernel CPU list (`0-3,8,10-11`); `None` when malformed or empty.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b >= libc::CPU_SETSIZE as usize {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => {
                let cpu: usize = part.parse().ok()?;
                if cpu >= libc::CPU_SETSIZE as usize {
                    return None;
                }
                cpus.push(cpu);
            }
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: `cpu` is below CPU_SETSIZE (checked by parse_cpulist), and
        // CPU_SET only sets a bit of `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpulist("0-3,8\n"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpulist("1"), Some(vec![1]));
        assert_eq!(parse_cpulist(""), None);
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
        assert_eq!(parse_cpulist("0-99999"), None);
    }

    #[test]
    fn a_node_of_a_fake_sysfs_and_pinning_this_thread() {
        let sys = tempfile::tempdir().unwrap();
        let node = sys.path().join("devices/system/node/node1");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("cpulist"), "0\n").unwrap();
        assert_eq!(node_cpus(sys.path(), 1), Some(vec![0]));
        assert_eq!(node_cpus(sys.path(), 2), None);
        // On a thread of its own: pinned to CPU 0, it runs on CPU 0.
        std::thread::spawn(|| {
            pin_current_thread(&[0]).expect("sched_setaffinity");
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() }, 0);
        })
        .join()
        .unwrap();
    }
}
