//! Paths of the workspace's binaries, built on demand.
//!
//! An integration test sees `CARGO_BIN_EXE_<name>` only for the binaries of
//! its own package. To run another package's daemon, [`binary`] asks cargo to
//! build it into the target directory the test itself was built in, once per
//! test process and binary.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};

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
    let path = build(package, name);
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
