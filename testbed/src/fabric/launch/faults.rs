//! Faults a run injects into a running fabric: a daemon killed (a lab
//! guest server's power cut), stopped and let go (signals), and
//! restarted; a link cut and restored.

use std::process::Command;
use std::time::Instant;

use super::{DaemonKind, Fabric, LaunchError};
use crate::fabric::netns;

impl Fabric {
    /// Kills a daemon with SIGKILL; returns when the signal was sent, after
    /// the process is gone.
    pub fn kill(&mut self, kind: DaemonKind, id: &str) -> Result<Instant, LaunchError> {
        let daemon = self.daemon_mut(kind, id)?;
        let sent = Instant::now();
        if let Some(guest) = &daemon.guest {
            guest.power_cut();
        }
        let _ = daemon.child.kill();
        let _ = daemon.child.wait();
        Ok(sent)
    }

    /// Kills several daemons at one moment: SIGKILL to each in turn, then
    /// waits for them all to be gone; returns when the first signal was
    /// sent. Every daemon is checked to exist before any is killed.
    pub fn kill_together(
        &mut self,
        daemons: &[(DaemonKind, &str)],
    ) -> Result<Instant, LaunchError> {
        for &(kind, id) in daemons {
            self.daemon_mut(kind, id)?;
        }
        let sent = Instant::now();
        for &(kind, id) in daemons {
            let daemon = self.daemon_mut(kind, id)?;
            if let Some(guest) = &daemon.guest {
                guest.power_cut();
            }
            let _ = daemon.child.kill();
        }
        for &(kind, id) in daemons {
            let _ = self.daemon_mut(kind, id)?.child.wait();
        }
        Ok(sent)
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`) to a running
    /// daemon's process (a lab guest's emulator for a server in a guest);
    /// returns when it was sent.
    pub fn signal(
        &mut self,
        kind: DaemonKind,
        id: &str,
        signal: libc::c_int,
    ) -> Result<Instant, LaunchError> {
        let daemon = self.daemon_mut(kind, id)?;
        let pid = libc::pid_t::try_from(daemon.child.id()).map_err(|_| LaunchError::Unknown {
            kind,
            id: id.to_owned(),
        })?;
        let sent = Instant::now();
        // SAFETY: kill(2) on the pid of a child this fabric started and has
        // not reaped (it is still in `daemons`), so the pid is not reused.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(LaunchError::Io(std::io::Error::last_os_error()));
        }
        Ok(sent)
    }

    /// Starts a killed (or stopped) daemon again with the same arguments
    /// and waits until it is ready (and, for a device, its links are up).
    pub fn restart(&mut self, kind: DaemonKind, id: &str) -> Result<(), LaunchError> {
        let (args, guest) = self
            .daemons
            .remove(&(kind, id.to_owned()))
            .map(|mut d| {
                if let Some(guest) = &d.guest {
                    guest.power_cut();
                }
                let _ = d.child.kill();
                let _ = d.child.wait();
                (d.args, d.guest)
            })
            .ok_or_else(|| LaunchError::Unknown {
                kind,
                id: id.to_owned(),
            })?;
        match guest {
            Some(guest) => self.launch_guest(id, guest)?,
            None => self.launch(kind, id, args)?,
        }
        self.await_ready(kind, id)
    }

    /// Takes a topology link down or up (netns mode). `target` names it as
    /// `CLIENT/RNIC` (a client's RNIC) or `DEVICE>SERVER/NIC` (a fabric
    /// device's link to a server NIC).
    pub fn set_link(&self, target: &str, up: bool) -> Result<(), LaunchError> {
        let unknown = || LaunchError::UnknownLink(target.to_owned());
        if self.lab.is_some() {
            return self.set_lab_link(target, up);
        }
        let (plan, _) = self.net.as_ref().ok_or_else(unknown)?;
        let link = match target.split_once('>') {
            Some((device, rest)) => {
                let (server, nic) = rest.split_once('/').ok_or_else(unknown)?;
                netns::LinkRef::ServerLink {
                    device: device.into(),
                    server: server.into(),
                    nic: nic.into(),
                }
            }
            None => {
                let (client, rnic) = target.split_once('/').ok_or_else(unknown)?;
                let device = self
                    .topology
                    .client(&client.into())
                    .and_then(|c| c.rnics.iter().find(|r| r.id.as_str() == rnic))
                    .map(|r| r.fabric_device.clone())
                    .ok_or_else(unknown)?;
                netns::LinkRef::Rnic {
                    client: client.into(),
                    rnic: rnic.into(),
                    device,
                }
            }
        };
        let veth = plan.link(&link).ok_or_else(unknown)?;
        netns::set_link(veth, up)?;
        Ok(())
    }

    /// Lab mode: a client's RNIC `client/rnic` is cut by taking down the
    /// RoCEv2 interface of the device port it is wired to; the queue pair
    /// then runs out of retries while the control connection stays up.
    fn set_lab_link(&self, target: &str, up: bool) -> Result<(), LaunchError> {
        let unknown = || LaunchError::UnknownLink(target.to_owned());
        let (client, rnic) = target.split_once('/').ok_or_else(unknown)?;
        let rnic = self
            .topology
            .client(&client.into())
            .and_then(|c| c.rnics.iter().find(|r| r.id.as_str() == rnic))
            .ok_or_else(unknown)?;
        let interface = self
            .topology
            .fabric_device(&rnic.fabric_device)
            .and_then(|d| rnic.port_on(d))
            .and_then(|p| p.roce.as_ref())
            .map(|r| r.interface.clone())
            .ok_or_else(unknown)?;
        let state = if up { "up" } else { "down" };
        let status = Command::new("ip")
            .args(["link", "set", &interface, state])
            .status()
            .map_err(LaunchError::Io)?;
        if !status.success() {
            return Err(LaunchError::Io(std::io::Error::other(format!(
                "ip link set {interface} {state}: {status}"
            ))));
        }
        Ok(())
    }
}
