//! The lab's network namespace and its scripts: [`LabNet`] brings the
//! namespace up (building the guest image first) and moves the calling
//! thread into it; its guest commands boot QEMU guests on the lab's bridge.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::fabric::netns;

/// The lab's network namespace.
pub const NAMESPACE: &str = "pmemlab";

/// Why the lab could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A lab script could not be started.
    #[error("cannot run {script}")]
    Spawn {
        /// The script.
        script: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A lab script failed.
    #[error("{script} {args} failed ({status}):\n{output}")]
    Script {
        /// The script.
        script: PathBuf,
        /// Its arguments.
        args: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// The end of what it printed.
        output: String,
    },
    /// The calling thread could not enter the namespace.
    #[error("cannot enter the lab's network namespace")]
    Enter(#[source] netns::NetnsError),
    /// The lab's lock file could not be opened or locked.
    #[error("cannot lock {path}, which keeps lab runs on this host one at a time")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The lab needs root.
    #[error("the lab needs root (network namespaces, QEMU taps)")]
    NotRoot(#[source] netns::NetnsError),
}

/// The folder with the lab's scripts: `$PMEM_LAB_SCRIPTS`, or `lab/` of the
/// source tree this testbed was built from.
pub fn scripts_dir() -> PathBuf {
    std::env::var_os("PMEM_LAB_SCRIPTS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab"),
        PathBuf::from,
    )
}

/// Runs lab script `name` with `args` and waits for it; its output goes to
/// the error on failure.
pub fn run_script(name: &str, args: &[&str]) -> Result<(), LabError> {
    let script = scripts_dir().join(name);
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .env("PMEM_LAB_NS", NAMESPACE)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            script: script.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    Err(LabError::Script {
        script,
        args: args.join(" "),
        status: out.status,
        output: lines[lines.len().saturating_sub(30)..].join("\n"),
    })
}

/// The file whose lock a lab run holds from before its network comes up
/// until after it is removed: the lab's namespace, bridge and addresses
/// are one per host, and a second run bringing them up would tear down
/// the first's.
pub const LOCK_FILE: &str = "/run/lock/pmem-fabric-lab.lock";

/// The lab's network, up; removed again when dropped.
#[derive(Debug)]
pub struct LabNet {
    up: bool,
    /// The namespace the thread came from, to go back to before teardown
    /// (the teardown stops every process whose main thread is in the lab).
    home: Option<std::fs::File>,
    /// Held while the lab is this run's (see [`LOCK_FILE`]); declared
    /// last, so it is released after the network is removed.
    _lock: std::fs::File,
}

impl LabNet {
    /// Waits until no other run on this host uses the lab, builds the
    /// guest image if needed, brings the lab's namespace up and moves the
    /// calling thread into it.
    pub fn enter() -> Result<LabNet, LabError> {
        netns::require_root().map_err(LabError::NotRoot)?;
        let lock = take_lab()?;
        run_script("image.sh", &[])?;
        let home = std::fs::File::open("/proc/thread-self/ns/net").ok();
        run_script("net.sh", &["up"])?;
        let lab = LabNet {
            up: true,
            home,
            _lock: lock,
        };
        netns::enter(NAMESPACE).map_err(LabError::Enter)?;
        Ok(lab)
    }

    /// A command that boots a guest and runs `program` in it (add the
    /// program's arguments to the result). `shares` are host folders the
    /// guest sees at the same paths: the program's folder is always one.
    /// The guest's console is the command's stdout, and is copied to `console`.
    pub fn guest_command(&self, program: &Path, shares: &[&Path], console: &Path) -> Command {
        self.guest_command_with(program, shares, console, None, &[])
    }

    /// [`guest_command`](Self::guest_command) with variables set for the
    /// program inside the guest (it does not inherit this process's
    /// environment).
    pub fn guest_command_with_env(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Command {
        self.guest_command_with(program, shares, console, None, env)
    }

    /// [`guest_command`](Self::guest_command) for a guest with `storage`
    /// besides its initramfs.
    pub fn guest_with_storage(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        storage: &GuestStorage<'_>,
    ) -> Command {
        self.guest_command_with(program, shares, console, Some(storage), &[])
    }

    fn guest_command_with(
        &self,
        program: &Path,
        shares: &[&Path],
        console: &Path,
        storage: Option<&GuestStorage<'_>>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Command {
        let mut command = Command::new("bash");
        command
            .arg(scripts_dir().join("guest.sh"))
            .env("PMEM_LAB_NS", NAMESPACE)
            .arg("--log")
            .arg(console);
        if let Some(folder) = program.parent() {
            command.arg("--share").arg(folder);
        }
        for share in shares {
            command.arg("--share").arg(share);
        }
        if let Some(storage) = storage {
            if let Some(disk) = storage.disk {
                command.arg("--disk").arg(disk);
            }
            for nvdimm in storage.nvdimms {
                command.arg("--nvdimm").arg(nvdimm);
            }
            command
                .arg("--nodes")
                .arg(storage.nodes.max(1).to_string())
                .arg("--pidfile")
                .arg(storage.pidfile);
            if let Some(address) = storage.address {
                command.arg("--ip").arg(address);
            }
        }
        for (name, value) in env {
            let mut pair = std::ffi::OsString::from(format!("{name}="));
            pair.push(value);
            command.arg("--env").arg(pair);
        }
        command.arg("--").arg(program);
        command
    }
}

impl Drop for LabNet {
    fn drop(&mut self) {
        if let Some(home) = self.home.take()
            && let Err(e) = netns::enter_file(&home)
        {
            tracing::warn!("cannot leave the lab's namespace: {e}");
            return;
        }
        if std::mem::take(&mut self.up)
            && let Err(e) = run_script("net.sh", &["down"])
        {
            tracing::warn!("removing the lab's network failed: {e}");
        }
    }
}

/// The lab for this run alone: the lock of [`LOCK_FILE`], waited for (and
/// said so) while another run holds it.
fn take_lab() -> Result<std::fs::File, LabError> {
    take_lock(Path::new(LOCK_FILE))
}

/// The exclusive lock of the file at `path` (made if missing), waited for.
fn take_lock(path: &Path) -> Result<std::fs::File, LabError> {
    let lock_error = |source| LabError::Lock {
        path: path.to_owned(),
        source,
    };
    let file = testkit::open_lock_file(path).map_err(lock_error)?;
    if testkit::try_lock_exclusive(&file).map_err(lock_error)? {
        return Ok(file);
    }
    eprintln!(
        "the RDMA lab is in use by another run on this host ({}); waiting for it",
        path.display()
    );
    testkit::lock_exclusive(&file).map_err(lock_error)?;
    Ok(file)
}

/// What a guest stores data on besides its initramfs, and where its QEMU
/// writes its process id (to cut the guest's power: SIGKILL).
#[derive(Debug, Clone, Copy)]
pub struct GuestStorage<'a> {
    /// A raw disk image, `/dev/vda` in the guest (virtio). What the guest
    /// wrote to it survives a power cut; its page cache does not.
    pub disk: Option<&'a Path>,
    /// Backing files of emulated NVDIMMs (sizes multiples of 2 MiB):
    /// libnvdimm pmem devices in the guest, raw namespaces until `ndctl
    /// create-namespace` makes them fsdax or devdax. Every store the guest
    /// makes lands in the file, written back from a CPU cache or not.
    pub nvdimms: &'a [&'a Path],
    /// NUMA nodes (one vCPU each); NVDIMM i sits on node i mod `nodes`.
    pub nodes: usize,
    /// QEMU's pid file.
    pub pidfile: &'a Path,
    /// The guest's eth0 address (CIDR); `None`: 10.77.0.2/24.
    pub address: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lab_lock_is_held_until_its_file_closes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sub").join("lab.lock");
        let held = take_lock(&path).expect("the first lock");
        let other = std::fs::File::open(&path).expect("open again");
        assert!(!testkit::try_lock_exclusive(&other).expect("flock"));
        drop(held);
        assert!(testkit::try_lock_exclusive(&other).expect("free once the holder closed it"));
    }
}
