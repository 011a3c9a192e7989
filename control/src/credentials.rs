//! An etcd user's credentials, read from a file the operator provisions:
//! one line `user:password`, readable by its owner only (mode 600), like
//! the principals' key files. They are never taken on the command line,
//! where other users of the host could read them.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable naming a credentials file, for daemons and
/// `pmemctl` alike (`--etcd-credentials FILE` wins over it).
pub const CREDENTIALS_ENV: &str = "PMEM_FABRIC_ETCD_CREDENTIALS";

/// An etcd user and its password; the password is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// A credentials file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Group or others may read or write it.
    #[error("{path}: mode {mode:o} lets others read the etcd password; run `chmod 600 {path}`")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It is not one line `user:password` with both parts present.
    #[error("{path}: not etcd credentials (one line `user:password` expected, {why})")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: &'static str,
    },
    /// Reading or writing it failed.
    #[error("{path}: cannot read or write the etcd credentials file")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl Credentials {
    /// Credentials of `user` with `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The etcd user's name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Reads `path`, which must be owner-only and hold `user:password`.
    pub fn read(path: &Path) -> Result<Self, CredentialsError> {
        let io_err = |source| CredentialsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mode = fs::metadata(path).map_err(io_err)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(CredentialsError::Permissions {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        let text = fs::read_to_string(path).map_err(io_err)?;
        let malformed = |why| CredentialsError::Malformed {
            path: path.to_path_buf(),
            why,
        };
        let line = text.trim_end_matches(['\n', '\r']);
        if line.contains('\n') {
            return Err(malformed("it has more than one line"));
        }
        let (user, password) = line.split_once(':').ok_or_else(|| malformed("no ':'"))?;
        if user.is_empty() {
            return Err(malformed("the user is empty"));
        }
        if password.is_empty() {
            return Err(malformed("the password is empty"));
        }
        Ok(Self::new(user, password))
    }

    /// Writes these credentials to `path` (its folder made if missing),
    /// owner-only; an existing file is replaced.
    pub fn write(&self, path: &Path) -> Result<(), CredentialsError> {
        let io_err = |source| CredentialsError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io_err)?;
        }
        let _ = fs::remove_file(path);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err)?;
        writeln!(file, "{}:{}", self.user, self.password).map_err(io_err)?;
        file.sync_all().map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_round_trip_and_loose_or_bad_files_are_refused() {
        let temp = tempfile::tempdir().expect("temp dir");
        let path = temp.path().join("creds").join("operator.etcd");
        let creds = Credentials::new("pool.operator", "s3cret:with:colons");
        creds.write(&path).expect("write");
        assert_eq!(Credentials::read(&path).expect("read"), creds);
        assert!(!format!("{creds:?}").contains("s3cret"));

        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
        let err = Credentials::read(&path).expect_err("loose");
        assert!(err.to_string().contains("chmod 600"), "{err}");

        for (text, why) in [
            ("nocolon\n", "no ':'"),
            (":pw\n", "user is empty"),
            ("user:\n", "password is empty"),
            ("a:b\nc:d\n", "more than one line"),
        ] {
            fs::write(&path, text).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            let err = Credentials::read(&path).expect_err(text);
            assert!(err.to_string().contains(why), "{text:?}: {err}");
        }
        let err = Credentials::read(&temp.path().join("absent")).expect_err("absent");
        assert!(matches!(err, CredentialsError::Io { .. }), "{err}");
    }
}
