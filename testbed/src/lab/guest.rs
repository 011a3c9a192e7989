//! The one helper the lab's own guests share (a power-cut server, the
//! `bench-persist` guest, a guest server of a lab fabric): the work folder
//! the guest sees at the same path (its topology, keys and boot script), its
//! media (an ext4 disk image, an NVDIMM backing file), its boot with the
//! console copied to a file, and its power cut (SIGKILL to QEMU).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use topology::Topology;
use topology::secrets::SecretError;

use super::net::{GuestStorage, LabNet};

/// Why a guest could not be prepared, booted or powered off.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A file of the guest's work folder could not be written.
    #[error("cannot write {path} for the lab guest")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The topology could not be written as TOML.
    #[error("cannot write the guest's topology {path} as TOML: {why}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// What the TOML writer said.
        why: String,
    },
    /// The principals' keys could not be made.
    #[error("cannot make the keys in {dir}")]
    Keys {
        /// The key folder.
        dir: PathBuf,
        /// Why.
        #[source]
        source: SecretError,
    },
    /// `mkfs.ext4` could not be run.
    #[error("cannot run mkfs.ext4 for {path} (install the Debian package e2fsprogs)")]
    MkfsSpawn {
        /// The disk image.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `mkfs.ext4` failed.
    #[error("mkfs.ext4 {path} failed: {stderr}")]
    Mkfs {
        /// The disk image.
        path: PathBuf,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The testbed's own executable (the guest runs it) was not found.
    #[error("cannot find the testbed executable the guest runs")]
    Exe(#[source] io::Error),
    /// QEMU could not be started.
    #[error("cannot boot the lab guest ({script})")]
    Boot {
        /// The guest's boot script.
        script: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// QEMU's pid file was missing or held no process id.
    #[error("no QEMU process id in {path}: {why}")]
    Pid {
        /// The pid file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// SIGKILL to QEMU failed.
    #[error("cannot kill QEMU {pid}")]
    Kill {
        /// QEMU's process id.
        pid: i32,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The keys' folder in a work folder (the guest sees it at the same path).
pub const SECRETS: &str = "secrets";

/// The media a guest gets besides its initramfs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Media {
    /// Bytes of an ext4 disk image (`/dev/vda` in the guest), if any.
    pub disk: Option<u64>,
    /// Bytes of an NVDIMM backing file (`/dev/pmem0`, raw until the guest
    /// makes a namespace), if any; a multiple of 2 MiB.
    pub nvdimm: Option<u64>,
}

/// A guest's work folder, shared with the guest at the same path: its
/// topology, keys, boot script, media and QEMU's pid file.
#[derive(Debug, Clone)]
pub struct GuestWork {
    dir: PathBuf,
    script: PathBuf,
    media: Media,
}

impl GuestWork {
    /// The work folder `dir`, with the boot script `script_name` in it.
    pub fn new(dir: &Path, script_name: &str) -> Self {
        GuestWork {
            dir: dir.to_owned(),
            script: dir.join(script_name),
            media: Media::default(),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The topology file the guest's daemons read.
    pub fn topology(&self) -> PathBuf {
        self.dir.join("topology.toml")
    }

    /// The key folder.
    pub fn secrets(&self) -> PathBuf {
        self.dir.join(SECRETS)
    }

    /// QEMU's pid file.
    pub fn pidfile(&self) -> PathBuf {
        self.dir.join("qemu.pid")
    }

    fn disk(&self) -> PathBuf {
        self.dir.join("disk.img")
    }

    fn nvdimm(&self) -> PathBuf {
        self.dir.join("nvdimm.img")
    }

    /// Writes `topology`, a fresh key for each of its principals, and the
    /// boot script (`body` after `#!/bin/sh`), and makes `media` fresh: the
    /// disk image formatted ext4, the NVDIMM file zeroed.
    pub fn prepare(
        &mut self,
        topology: &Topology,
        body: &str,
        media: Media,
    ) -> Result<(), GuestError> {
        let write = |path: PathBuf| move |source| GuestError::Write { path, source };
        std::fs::create_dir_all(&self.dir).map_err(write(self.dir.clone()))?;
        let path = self.topology();
        let text = toml::to_string(topology).map_err(|e| GuestError::Toml {
            path: path.clone(),
            why: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(write(path.clone()))?;
        let secrets = self.secrets();
        crate::fabric::keys::generate(topology, &secrets).map_err(|source| GuestError::Keys {
            dir: secrets.clone(),
            source,
        })?;
        write_script(&self.script, body)?;
        if let Some(size) = media.disk {
            make_disk(&self.disk(), size)?;
        }
        if let Some(size) = media.nvdimm {
            make_nvdimm(&self.nvdimm(), size)?;
        }
        self.media = media;
        Ok(())
    }

    /// Boots the guest on its media with the testbed's folder shared, its
    /// console copied to `console` and nothing on this process's output;
    /// QEMU writes its pid to [`pidfile`](Self::pidfile).
    pub fn boot(&self, lab: &LabNet, console: &Path) -> Result<Child, GuestError> {
        let exe = std::env::current_exe().map_err(GuestError::Exe)?;
        let exe_dir = exe.parent().unwrap_or(Path::new("/"));
        let pidfile = self.pidfile();
        let _ = std::fs::remove_file(&pidfile);
        let (disk, nvdimm) = (self.disk(), self.nvdimm());
        let nvdimms = [nvdimm.as_path()];
        let storage = GuestStorage {
            disk: self.media.disk.is_some().then_some(disk.as_path()),
            nvdimms: if self.media.nvdimm.is_some() {
                &nvdimms
            } else {
                &[]
            },
            nodes: 1,
            pidfile: &pidfile,
            address: None,
        };
        lab.guest_with_storage(&self.script, &[exe_dir], console, &storage)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| GuestError::Boot {
                script: self.script.clone(),
                source,
            })
    }
}

/// Writes an executable shell script: `#!/bin/sh` and `body`.
pub fn write_script(path: &Path, body: &str) -> Result<(), GuestError> {
    use std::os::unix::fs::PermissionsExt;
    let write = |source| GuestError::Write {
        path: path.to_owned(),
        source,
    };
    std::fs::write(path, format!("#!/bin/sh\n{body}")).map_err(write)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(write)
}

/// Makes `path` a fresh ext4 disk image of `size` bytes (sparse).
pub fn make_disk(path: &Path, size: u64) -> Result<(), GuestError> {
    sparse_file(path, size)?;
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(path)
        .output()
        .map_err(|source| GuestError::MkfsSpawn {
            path: path.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(GuestError::Mkfs {
            path: path.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Makes `path` a fresh zeroed NVDIMM backing file of `size` bytes (sparse).
pub fn make_nvdimm(path: &Path, size: u64) -> Result<(), GuestError> {
    sparse_file(path, size)
}

/// Makes `path` a fresh zeroed file of `size` bytes (sparse).
fn sparse_file(path: &Path, size: u64) -> Result<(), GuestError> {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(size))
        .map_err(|source| GuestError::Write {
            path: path.to_owned(),
            source,
        })
}

/// The QEMU process id in `pidfile`.
pub fn qemu_pid(pidfile: &Path) -> Result<i32, GuestError> {
    let pid_error = |why: String| GuestError::Pid {
        path: pidfile.to_owned(),
        why,
    };
    let text = std::fs::read_to_string(pidfile).map_err(|e| pid_error(e.to_string()))?;
    match text.trim().parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(pid_error(format!("{:?} is not a process id", text.trim()))),
    }
}

/// Cuts a guest's power: SIGKILL to QEMU process `pid`. What the guest had
/// not written to its media is gone.
pub fn kill_qemu(pid: i32) -> Result<(), GuestError> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours;
    // `pid` is positive (one process, never a group) and comes from the pid
    // file QEMU wrote for a guest this testbed booted.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        return Err(GuestError::Kill {
            pid,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Cuts the power of the guest whose QEMU wrote `pidfile`.
pub fn power_off(pidfile: &Path) -> Result<(), GuestError> {
    kill_qemu(qemu_pid(pidfile)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_must_hold_one_positive_process_id() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pidfile = dir.path().join("qemu.pid");
        assert!(matches!(qemu_pid(&pidfile), Err(GuestError::Pid { .. })));
        for bad in ["", "0\n", "-1\n", "qemu\n"] {
            std::fs::write(&pidfile, bad).expect("write");
            let err = qemu_pid(&pidfile).expect_err(bad);
            assert!(err.to_string().contains("not a process id"), "{err}");
        }
        std::fs::write(&pidfile, "4242\n").expect("write");
        assert_eq!(qemu_pid(&pidfile).expect("a pid"), 4242);
    }

    #[test]
    fn the_work_folder_holds_topology_keys_script_and_media() {
        let dir = tempfile::tempdir().expect("temp dir");
        let topology = testkit::FabricSpec::new()
            .server("S", &[("S1", "8MiB")])
            .device("F")
            .client("c")
            .topology();
        let mut work = GuestWork::new(&dir.path().join("work"), "boot.sh");
        let media = Media {
            disk: None,
            nvdimm: Some(4 << 20),
        };
        work.prepare(&topology, "echo hi\n", media)
            .expect("prepared");
        let script = std::fs::read_to_string(dir.path().join("work/boot.sh")).expect("script");
        assert_eq!(script, "#!/bin/sh\necho hi\n");
        let written = topology::Topology::load(work.topology()).expect("loads");
        assert_eq!(written.servers, topology.servers);
        assert!(work.secrets().join("client.c.key").is_file());
        let nvdimm = std::fs::metadata(dir.path().join("work/nvdimm.img")).expect("nvdimm");
        assert_eq!(nvdimm.len(), 4 << 20);
        assert!(!dir.path().join("work/disk.img").exists());
    }
}
