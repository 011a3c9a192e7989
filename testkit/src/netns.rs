//! A network namespace joined to the host by a veth pair, for tests and
//! benches that need real kernel packets between two "hosts" on one machine
//! (root or CAP_NET_ADMIN needed).
//!
//! The host end stays in the caller's namespace with address `.254` of the
//! subnet; the namespace end gets `.2`. `.1` is left free for a daemon that
//! answers ARP for an address itself (a fabric device's RoCEv2 port).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;

/// The namespace and its veth pair; both are removed on drop.
#[derive(Debug)]
pub struct VethNamespace {
    /// The namespace's name (`ip netns exec NAME …`).
    pub ns: String,
    /// The veth end in the caller's namespace.
    pub host: String,
    /// The veth end in the namespace.
    pub peer: String,
    /// The first three octets of the /24, e.g. `"10.251.0"`.
    pub subnet: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let status = Command::new("ip")
        .args(args)
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("ip {args:?}: {e} (iproute2 needed)")))?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("ip {args:?} failed ({status})")))
    }
}

impl VethNamespace {
    /// Creates namespace `<tag><pid>` with a veth pair on `subnet` (/24).
    pub fn create(tag: &str, subnet: &str) -> io::Result<Self> {
        let id = std::process::id() % 100_000;
        let ns = format!("{tag}{id}");
        let host = format!("{tag}h{id}");
        let peer = format!("{tag}c{id}");
        // Leftovers of an earlier run that was killed.
        for args in [
            ["netns", "del", ns.as_str()],
            ["link", "del", host.as_str()],
        ] {
            let _ = Command::new("ip")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status();
        }
        ip(&["netns", "add", &ns])?;
        let made = VethNamespace {
            ns: ns.clone(),
            host: host.clone(),
            peer: peer.clone(),
            subnet: subnet.to_owned(),
        };
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &ns])?;
        ip(&["addr", "add", &format!("{subnet}.254/24"), "dev", &host])?;
        ip(&["link", "set", &host, "up"])?;
        let peer_addr = format!("{subnet}.2/24");
        for args in [
            ["addr", "add", peer_addr.as_str(), "dev", peer.as_str()].as_slice(),
            &["link", "set", peer.as_str(), "up"],
            &["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", ns.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)?;
        }
        made.wait_until_up();
        Ok(made)
    }

    /// Waits (up to 5 s) until both ends say `state UP`: the kernel turns
    /// a veth's carrier on and gives it a queueing discipline a moment
    /// after `ip link set up`, and drops the frames sent before that.
    fn wait_until_up(&self) {
        let up = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("state UP"))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline
            && !(up(&["-o", "link", "show", "dev", &self.host])
                && up(&["-n", &self.ns, "-o", "link", "show", "dev", &self.peer]))
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Address `last` of the subnet, e.g. `addr(2)`.
    pub fn addr(&self, last: u8) -> std::net::Ipv4Addr {
        format!("{}.{last}", self.subnet)
            .parse()
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED)
    }

    /// Moves the calling thread into the namespace: sockets it opens from
    /// now on live there. Other threads are not affected.
    pub fn enter_on_this_thread(&self) -> io::Result<()> {
        let file = File::open(format!("/var/run/netns/{}", self.ns))?;
        // SAFETY: setns takes a namespace file descriptor we own for the
        // duration of the call and changes only this thread's namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for VethNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}
