//! Paths of the workspace's binaries, built on demand.
//!
//! An integration test sees `CARGO_BIN_EXE_<name>` only for the binaries of
//! its own package. To run another package's daemon, [`binary`] asks cargo to
//! build it into the target directory the test itself was built in, once per
//! test process and binary. A caller that has just built every binary there
//! (`cargo test --workspace` does, for its packages' integration tests) says
//! so with [`PREBUILT_VAR`], and [`binary`] then takes them as they are.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Set to `1` by a caller whose build has just put every workspace binary,
/// fresh, into the test's target directory (as `cargo test --workspace`
/// does): [`binary`] then uses one found there without running cargo, which
/// saves a cargo run per test process and binary, and a rebuild when the
/// package alone resolves its dependencies' features otherwise than the
/// workspace. Unset, or for a binary not found there, [`binary`] builds.
pub const PREBUILT_VAR: &str = "TESTKIT_PREBUILT_BINARIES";

/// Binaries already built by this process, by (package, binary).
static BUILT: OnceLock<Mutex<HashMap<(String, String), PathBuf>>> = OnceLock::new();

/// The path of the workspace binary `name` of the package of the same name
/// (`pmem-server`, `fabric-device`, …), building it first if this process
/// has not yet done so.
///
/// The build uses the package's default features. In a package's own tests,
/// prefer `env!("CARGO_BIN_EXE_<name>")`: it is the binary built with the
/// features of the test run (e.g. `--features libpmem`), and building the
/// same binary here with other features would overwrite it.
///
/// # Panics
///
/// When the build fails (with cargo's stderr) or the binary is not where
/// cargo was asked to put it.
pub fn binary(name: &str) -> PathBuf {
    binary_in(name, name)
}

/// The path of binary `name` of workspace package `package`, built on demand
/// like [`binary`].
///
/// # Panics
///
/// As [`binary`].
pub fn binary_in(package: &str, name: &str) -> PathBuf {
    let built = BUILT.get_or_init(Mutex::default);
    // A panicking build leaves nothing half-inserted; the map stays usable.
    let mut built = built.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (package.to_owned(), name.to_owned());
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let prebuilt = std::env::current_exe()
        .ok()
        .and_then(|exe| TargetLayout::of_executable(&exe))
        .and_then(|layout| {
            prebuilt(
                &layout.profile_dir,
                name,
                std::env::var_os(PREBUILT_VAR).as_deref(),
            )
        });
    let path = prebuilt.unwrap_or_else(|| build(package, name));
    built.insert(key, path.clone());
    path
}

/// Where the running test's build put its artifacts.
#[derive(Debug, PartialEq, Eq)]
struct TargetLayout {
    /// `…/target`.
    target_dir: PathBuf,
    /// `…/target/<profile>`, where binaries land.
    profile_dir: PathBuf,
    /// The profile directory's name: `debug`, `release` or a custom profile.
    profile: String,
}

impl TargetLayout {
    /// The layout around an executable in `…/target/<profile>/deps/` (tests)
    /// or `…/target/<profile>/examples/`, or directly in the profile directory.
    fn of_executable(exe: &Path) -> Option<TargetLayout> {
        let mut dir = exe.parent()?;
        if dir
            .file_name()
            .is_some_and(|name| name == "deps" || name == "examples")
        {
            dir = dir.parent()?;
        }
        Some(TargetLayout {
            target_dir: dir.parent()?.to_path_buf(),
            profile: dir.file_name()?.to_str()?.to_owned(),
            profile_dir: dir.to_path_buf(),
        })
    }

    /// The cargo flags that select this layout's profile.
    fn profile_args(&self) -> Vec<String> {
        match self.profile.as_str() {
            "debug" => Vec::new(),
            "release" => vec!["--release".to_owned()],
            other => vec!["--profile".to_owned(), other.to_owned()],
        }
    }
}

/// Binary `name` in `profile_dir`, when `said` (the value of
/// [`PREBUILT_VAR`]) is `1` and the binary is there.
fn prebuilt(profile_dir: &Path, name: &str, said: Option<&OsStr>) -> Option<PathBuf> {
    if said != Some(OsStr::new("1")) {
        return None;
    }
    let path = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    path.is_file().then_some(path)
}

/// Runs `cargo build` for one binary and returns its path.
fn build(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let layout = TargetLayout::of_executable(&exe)
        .unwrap_or_else(|| panic!("{} is not inside a cargo target directory", exe.display()));
    // Cargo sets CARGO for the processes it runs, tests included.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(&cargo);
    command
        .args(["build", "--quiet", "-p", package, "--bin", name])
        .args(layout.profile_args())
        .arg("--target-dir")
        .arg(&layout.target_dir);
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.to_string_lossy()));
    if !output.status.success() {
        panic!(
            "building {name} failed ({}): {command:?}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let path = layout
        .profile_dir
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "cargo built {name} but {} does not exist",
        path.display()
    );
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_executables_find_their_profile() {
        let layout =
            TargetLayout::of_executable(Path::new("/w/target/release/deps/daemon-0123abcd"))
                .unwrap();
        assert_eq!(
            layout,
            TargetLayout {
                target_dir: PathBuf::from("/w/target"),
                profile_dir: PathBuf::from("/w/target/release"),
                profile: "release".to_owned(),
            }
        );
        assert_eq!(layout.profile_args(), ["--release"]);

        let debug = TargetLayout::of_executable(Path::new("/w/target/debug/deps/t")).unwrap();
        assert!(debug.profile_args().is_empty());
        let custom = TargetLayout::of_executable(Path::new("/w/target/ci/examples/x")).unwrap();
        assert_eq!(custom.profile_dir, Path::new("/w/target/ci"));
        assert_eq!(custom.profile_args(), ["--profile", "ci"]);
    }

    #[test]
    fn a_prebuilt_binary_is_taken_only_when_said_and_there() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = dir
            .path()
            .join(format!("daemon{}", std::env::consts::EXE_SUFFIX));
        std::fs::write(&daemon, b"").unwrap();
        let yes = Some(OsStr::new("1"));
        assert_eq!(prebuilt(dir.path(), "daemon", yes), Some(daemon.clone()));
        assert_eq!(prebuilt(dir.path(), "daemon", None), None, "not said");
        let no = Some(OsStr::new("0"));
        assert_eq!(prebuilt(dir.path(), "daemon", no), None, "said otherwise");
        assert_eq!(prebuilt(dir.path(), "other", yes), None, "not there");
    }

    #[test]
    #[should_panic(expected = "building no-such-daemon failed")]
    fn a_failed_build_panics_with_cargos_stderr() {
        binary("no-such-daemon");
    }

    #[test]
    fn this_tests_own_layout_is_found() {
        let exe = std::env::current_exe().unwrap();
        let layout = TargetLayout::of_executable(&exe).unwrap();
        assert!(layout.profile_dir.join("deps").is_dir(), "{layout:?}");
    }
}
