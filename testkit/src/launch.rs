//! The command lines of the fabric's daemons, with their admin endpoints on
//! ephemeral loopback ports.
//!
//! The daemons refuse to start without keys unless told `--insecure`. A
//! test that gives no `--secrets` (nor `--insecure`) in `extra` gets
//! `--insecure` added: it does not exercise authentication, and runs on a
//! test host nobody else uses. A test of authentication passes `--secrets`.
//!
//! Each daemon has three entry points: `*_spec` (the [`DaemonSpec`] to adjust
//! before spawning), `*_with` (spawn a given executable, e.g. the package's
//! own `env!("CARGO_BIN_EXE_…")`) and the plain one, which runs the binary
//! [`binary`] builds.

use std::path::{Path, PathBuf};

use crate::binaries::binary;
use crate::daemon::{Daemon, DaemonSpec};

/// The variable that makes every test `pmem-server` use one persistence
/// mechanism (`--persistence`), unless the test passes its own.
pub const PMEM_SERVER_PERSISTENCE_VAR: &str = "PMEM_SERVER_TEST_PERSISTENCE";

/// The status `pmem-server --persistence emulated --emulated-power-cut-after
/// N` exits with when its emulated power goes.
pub const EMULATED_POWER_CUT_EXIT: i32 = 86;

/// `--insecure` unless `extra` gives `--secrets` (or `--insecure` itself).
fn authentication(extra: &[&str]) -> &'static [&'static str] {
    if extra
        .iter()
        .any(|a| *a == "--secrets" || *a == "--insecure")
    {
        &[]
    } else {
        &["--insecure"]
    }
}

/// `program --config CONFIG --server SERVER --admin 127.0.0.1:0 --data-dir
/// DATA_DIR EXTRA…`, plus `--insecure` when `extra` gives no `--secrets`,
/// and `--persistence $PMEM_SERVER_TEST_PERSISTENCE` when that variable is
/// set and `extra` does not choose a mechanism itself.
pub fn pmem_server_spec(
    program: impl Into<PathBuf>,
    config: &Path,
    server: &str,
    data_dir: &Path,
    extra: &[&str],
) -> DaemonSpec {
    let spec = DaemonSpec::new(program)
        .arg("--config")
        .arg(config)
        .args(["--server", server, "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .args(authentication(extra));
    match std::env::var(PMEM_SERVER_PERSISTENCE_VAR) {
        Ok(mode) if !extra.contains(&"--persistence") => spec.args(["--persistence", &mode]),
        _ => spec,
    }
}

/// Starts `program` as PMEM server `server` (see [`pmem_server_spec`]) and
/// waits for its ready line
/// (`ready server=S mode=M admin=ADDR nic.<id>=ADDR …`).
pub fn pmem_server_with(
    program: impl Into<PathBuf>,
    config: &Path,
    server: &str,
    data_dir: &Path,
    extra: &[&str],
) -> Result<Daemon, String> {
    Daemon::spawn(pmem_server_spec(program, config, server, data_dir, extra))
}

/// Starts the workspace's `pmem-server` binary (see [`pmem_server_with`]).
pub fn pmem_server(
    config: &Path,
    server: &str,
    data_dir: &Path,
    extra: &[&str],
) -> Result<Daemon, String> {
    pmem_server_with(binary("pmem-server"), config, server, data_dir, extra)
}

/// Starts the workspace's `pmem-server` for each of `servers`, each with
/// its data in `dir/<server>`; panics naming the server that did not start
/// (for tests).
pub fn pmem_servers(config: &Path, servers: &[&str], dir: &Path) -> Vec<Daemon> {
    servers
        .iter()
        .map(|id| {
            pmem_server(config, id, &dir.join(id), &[])
                .unwrap_or_else(|e| panic!("pmem-server {id} did not start:\n{e}"))
        })
        .collect()
}

/// `program --config CONFIG --device DEVICE --admin 127.0.0.1:0 EXTRA…`,
/// plus `--insecure` when `extra` gives no `--secrets`.
pub fn fabric_device_spec(
    program: impl Into<PathBuf>,
    config: &Path,
    device: &str,
    extra: &[&str],
) -> DaemonSpec {
    DaemonSpec::new(program)
        .arg("--config")
        .arg(config)
        .args(["--device", device, "--admin", "127.0.0.1:0"])
        .args(extra)
        .args(authentication(extra))
}

/// Starts `program` as fabric device `device` (see [`fabric_device_spec`])
/// and waits for its ready line (`ready device=D admin=ADDR port.<id>=ADDR …`).
pub fn fabric_device_with(
    program: impl Into<PathBuf>,
    config: &Path,
    device: &str,
    extra: &[&str],
) -> Result<Daemon, String> {
    Daemon::spawn(fabric_device_spec(program, config, device, extra))
}

/// Starts the workspace's `fabric-device` binary (see [`fabric_device_with`]).
pub fn fabric_device(config: &Path, device: &str, extra: &[&str]) -> Result<Daemon, String> {
    fabric_device_with(binary("fabric-device"), config, device, extra)
}

/// `program --etcd ETCD --pool POOL --server SERVER --admin 127.0.0.1:0
/// --data-dir DATA_DIR EXTRA…`, plus `--insecure` when `extra` gives no
/// `--secrets`: a server that takes its map from etcd.
pub fn pmem_server_on_etcd_spec(
    program: impl Into<PathBuf>,
    etcd: &str,
    pool: &str,
    server: &str,
    data_dir: &Path,
    extra: &[&str],
) -> DaemonSpec {
    DaemonSpec::new(program)
        .args(["--etcd", etcd, "--pool", pool, "--server", server])
        .args(["--admin", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .args(authentication(extra))
}

/// `program --etcd ETCD --pool POOL --device DEVICE --admin 127.0.0.1:0
/// EXTRA…`, plus `--insecure` when `extra` gives no `--secrets`: a fabric
/// device that takes its map from etcd.
pub fn fabric_device_on_etcd_spec(
    program: impl Into<PathBuf>,
    etcd: &str,
    pool: &str,
    device: &str,
    extra: &[&str],
) -> DaemonSpec {
    DaemonSpec::new(program)
        .args(["--etcd", etcd, "--pool", pool, "--device", device])
        .args(["--admin", "127.0.0.1:0"])
        .args(extra)
        .args(authentication(extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(spec: &DaemonSpec, flag: &str) -> bool {
        spec.args.iter().any(|a| a == flag)
    }

    #[test]
    fn a_daemon_without_keys_is_started_insecure_and_one_with_keys_is_not() {
        let (config, data) = (Path::new("t.toml"), Path::new("data"));
        let plain = pmem_server_spec("pmem-server", config, "S", data, &[]);
        assert!(has(&plain, "--insecure"), "{:?}", plain.args);
        let keyed = pmem_server_spec("pmem-server", config, "S", data, &["--secrets", "k"]);
        assert!(!has(&keyed, "--insecure"), "{:?}", keyed.args);
        let plain = fabric_device_spec("fabric-device", config, "F", &[]);
        assert!(has(&plain, "--insecure"), "{:?}", plain.args);
        let keyed = fabric_device_spec("fabric-device", config, "F", &["--secrets", "k"]);
        assert!(!has(&keyed, "--insecure"), "{:?}", keyed.args);
        let explicit = fabric_device_spec("fabric-device", config, "F", &["--insecure"]);
        let count = explicit.args.iter().filter(|a| *a == "--insecure").count();
        assert_eq!(count, 1, "{:?}", explicit.args);
        let etcd = "http://127.0.0.1:2379";
        let plain = pmem_server_on_etcd_spec("pmem-server", etcd, "p", "S", data, &[]);
        assert!(has(&plain, "--insecure"), "{:?}", plain.args);
        let keyed = pmem_server_on_etcd_spec("pmem-server", etcd, "p", "S", data, &["--secrets"]);
        assert!(!has(&keyed, "--insecure"), "{:?}", keyed.args);
        let plain = fabric_device_on_etcd_spec("fabric-device", etcd, "p", "F", &[]);
        assert!(has(&plain, "--insecure"), "{:?}", plain.args);
        let keyed = fabric_device_on_etcd_spec("fabric-device", etcd, "p", "F", &["--secrets"]);
        assert!(!has(&keyed, "--insecure"), "{:?}", keyed.args);
    }
}
