//! Keeping a NIC on the NUMA node of its socket's PMEM: the CPUs of a node
//! from sysfs and pinning the calling thread to them (threads it starts
//! afterwards inherit the pinning), and which node an RDMA device is on, so
//! a `verbs` NIC uses an RNIC of its own node.

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

/// The NUMA node of RDMA device `name`, from sysfs under `sys`: its PCI
/// function's `numa_node`, or for a software device (rxe), which names the
/// network device it runs on in `parent`, that network device's. `None`
/// when the kernel does not know (`-1`, no such file).
// Used by the `verbs` feature's NICs; tested without it too.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub fn rdma_device_node(sys: &Path, name: &str) -> Option<u32> {
    let device = sys.join("class/infiniband").join(name);
    let pci = match rdma_device_parent(sys, name) {
        Some(netdev) => sys.join("class/net").join(netdev).join("device"),
        None => device.join("device"),
    };
    let text = std::fs::read_to_string(pci.join("numa_node")).ok()?;
    text.trim().parse().ok()
}

/// The network device a software RDMA device (Linux rxe) runs on, from its
/// `parent` attribute; `None` for a hardware RNIC, which has none.
// Used by the `verbs` feature's NICs; tested without it too.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub fn rdma_device_parent(sys: &Path, name: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(sys.join("class/infiniband").join(name).join("parent")).ok()?;
    Some(text.trim().to_owned()).filter(|p| !p.is_empty())
}

/// The RDMA device a `verbs` NIC whose topology names none uses: the first
/// of `present` on NUMA node `node` (by `node_of`), or the first of all when
/// none is (or the node is unknown).
// Used by the `verbs` feature's NICs; tested without it too.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub fn choose_rdma_device(
    present: &[String],
    node: Option<u32>,
    node_of: impl Fn(&str) -> Option<u32>,
) -> Option<&str> {
    node.and_then(|node| present.iter().find(|d| node_of(d) == Some(node)))
        .or(present.first())
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs with a PCI RNIC `mlx5_0` on node 1, an rxe device
    /// `rxe0` over `eth0` on node 0, and `rxe1` over `eth1`, whose node the
    /// kernel does not know.
    fn fake_rdma_sysfs() -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = sys.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("class/infiniband/mlx5_0/device/numa_node", "1\n");
        write("class/infiniband/rxe0/parent", "eth0\n");
        write("class/net/eth0/device/numa_node", "0\n");
        write("class/infiniband/rxe1/parent", "eth1\n");
        write("class/net/eth1/device/numa_node", "-1\n");
        sys
    }

    #[test]
    fn an_rnics_node_comes_from_its_pci_function_or_its_network_device() {
        let sys = fake_rdma_sysfs();
        assert_eq!(rdma_device_node(sys.path(), "mlx5_0"), Some(1));
        assert_eq!(rdma_device_node(sys.path(), "rxe0"), Some(0));
        assert_eq!(rdma_device_node(sys.path(), "rxe1"), None);
        assert_eq!(rdma_device_node(sys.path(), "absent"), None);
        assert_eq!(
            rdma_device_parent(sys.path(), "rxe0").as_deref(),
            Some("eth0")
        );
        assert_eq!(rdma_device_parent(sys.path(), "mlx5_0"), None);
    }

    #[test]
    fn a_nic_without_a_named_rnic_takes_one_on_its_node() {
        let sys = fake_rdma_sysfs();
        let present: Vec<String> = ["rxe1", "rxe0", "mlx5_0"].map(String::from).to_vec();
        let node_of = |d: &str| rdma_device_node(sys.path(), d);
        assert_eq!(
            choose_rdma_device(&present, Some(1), node_of),
            Some("mlx5_0")
        );
        assert_eq!(choose_rdma_device(&present, Some(0), node_of), Some("rxe0"));
        // No RNIC on node 2, or the node unknown: the first there is.
        assert_eq!(choose_rdma_device(&present, Some(2), node_of), Some("rxe1"));
        assert_eq!(choose_rdma_device(&present, None, node_of), Some("rxe1"));
        assert_eq!(choose_rdma_device(&[], Some(0), node_of), None);
    }

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
