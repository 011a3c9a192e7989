//! Tells cargo how to link the system libpmem.
//!
//! Asks `pkg-config` (the program) for the flags of `libpmem` so that a
//! libpmem installed under a non-standard prefix is found; when pkg-config is
//! missing or does not know libpmem, links plain `-lpmem` and relies on the
//! default library search path.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_SYSROOT_DIR");

    if !link_with_pkg_config() {
        println!("cargo:rustc-link-lib=pmem");
    }
}

/// Emits the link directives pkg-config reports for libpmem; returns false
/// when pkg-config is unavailable, fails, or names no pmem library.
fn link_with_pkg_config() -> bool {
    let output = match Command::new("pkg-config")
        .args(["--libs", "libpmem"])
        .output()
    {
        Ok(output) if output.status.success() => output,
        _ => return false,
    };
    let Ok(flags) = String::from_utf8(output.stdout) else {
        return false;
    };

    let mut directives = Vec::new();
    let mut links_pmem = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            directives.push(format!("cargo:rustc-link-search=native={dir}"));
        } else if let Some(lib) = flag.strip_prefix("-l") {
            links_pmem |= lib == "pmem";
            directives.push(format!("cargo:rustc-link-lib={lib}"));
        }
    }
    if !links_pmem {
        return false;
    }
    for directive in directives {
        println!("{directive}");
    }
    true
}
