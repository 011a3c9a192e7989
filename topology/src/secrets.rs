//! The secret keys the operator provisions for the fabric's principals:
//! one file per principal in a folder, `client.<id>.key` for a client,
//! `device.<id>.key` for a fabric device and `operator.<name>.key` for an
//! operator (who may rotate region keys), each holding 64 hexadecimal
//! digits (32 bytes) and readable by its owner only.
//!
//! A connecting principal proves it holds its key (see `proto::auth`); a
//! listener holds the keys of the principals that may connect to it.
//! [`write_key`] makes a fresh random key file with the right permissions.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// Who a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Principal<'a> {
    /// A client of the topology, by id.
    Client(&'a str),
    /// A fabric device of the topology, by id.
    Device(&'a str),
    /// An operator, by name; operators are not part of the topology: the
    /// key files in a listener's folder say who they are.
    Operator(&'a str),
}

impl Principal<'_> {
    /// The key file's name.
    pub fn file_name(self) -> String {
        match self {
            Principal::Client(id) => format!("client.{id}.key"),
            Principal::Device(id) => format!("device.{id}.key"),
            Principal::Operator(name) => format!("operator.{name}.key"),
        }
    }
}

/// The names of the operators whose key files are in `dir`, sorted.
pub fn operators(dir: &Path) -> Result<Vec<String>, SecretError> {
    let io_err = |source| SecretError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let name = entry.map_err(io_err)?.file_name();
        let name = name.to_string_lossy();
        if let Some(operator) = name
            .strip_prefix("operator.")
            .and_then(|rest| rest.strip_suffix(".key"))
            .filter(|o| !o.is_empty())
        {
            names.push(operator.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file is not there.
    #[error("{path}: no key file (make the fabric's keys with `testbed keygen`)")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Group or others may read or write it.
    #[error("{path}: mode {mode:o} lets others read the key; run `chmod 600 {path}`")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It does not hold 64 hexadecimal digits.
    #[error("{path}: not a key (64 hexadecimal digits expected)")]
    Malformed {
        /// The file.
        path: PathBuf,
    },
    /// Reading or writing it failed.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Reads `principal`'s key from folder `dir`.
pub fn read_key(dir: &Path, principal: Principal<'_>) -> Result<[u8; KEY_LEN], SecretError> {
    let path = dir.join(principal.file_name());
    let io_err = |source: io::Error| {
        if source.kind() == io::ErrorKind::NotFound {
            SecretError::Missing { path: path.clone() }
        } else {
            SecretError::Io {
                path: path.clone(),
                source,
            }
        }
    };
    let mode = fs::metadata(&path).map_err(io_err)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(SecretError::Permissions {
            path,
            mode: mode & 0o777,
        });
    }
    let text = fs::read_to_string(&path).map_err(io_err)?;
    let text = text.trim();
    let malformed = || SecretError::Malformed { path: path.clone() };
    if text.len() != 2 * KEY_LEN || !text.is_ascii() {
        return Err(malformed());
    }
    let mut key = [0u8; KEY_LEN];
    for (byte, pair) in key.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| malformed())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| malformed())?;
    }
    Ok(key)
}

/// Writes `key` as `principal`'s key file in `dir` (made if missing),
/// readable and writable by the owner only; an existing file is replaced.
pub fn write_key(
    dir: &Path,
    principal: Principal<'_>,
    key: &[u8; KEY_LEN],
) -> Result<PathBuf, SecretError> {
    let path = dir.join(principal.file_name());
    let io_err = |source| SecretError::Io {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    let _ = fs::remove_file(&path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_err)?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(file, "{hex}").map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_loose_or_bad_files_are_refused() {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path().join("keys");
        let key = [0xA5u8; KEY_LEN];
        let path = write_key(&dir, Principal::Client("c1"), &key).expect("write");
        assert!(path.ends_with("client.c1.key"));
        assert_eq!(read_key(&dir, Principal::Client("c1")).expect("read"), key);
        assert!(matches!(
            read_key(&dir, Principal::Device("c1")),
            Err(SecretError::Missing { .. })
        ));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = read_key(&dir, Principal::Client("c1")).expect_err("loose");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        fs::write(&path, "not hex").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(
            read_key(&dir, Principal::Client("c1")),
            Err(SecretError::Malformed { .. })
        ));
    }

    #[test]
    fn operators_are_named_by_their_key_files() {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path();
        for principal in [
            Principal::Operator("zoe"),
            Principal::Client("c1"),
            Principal::Operator("ann"),
        ] {
            write_key(dir, principal, &[1; KEY_LEN]).expect("write");
        }
        fs::write(dir.join("operator..key"), "").expect("write");
        assert_eq!(operators(dir).expect("list"), ["ann", "zoe"]);
        assert!(matches!(
            operators(&dir.join("absent")),
            Err(SecretError::Io { .. })
        ));
    }
}
