//! Exclusive `flock(2)` locks on files, for claims that test processes on
//! one host must respect: the kernel drops a lock when the descriptor that
//! holds it closes, at the latest when its process exits, so a crashed
//! holder never leaves a claim behind.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The file at `path`, made (with its folders) if missing, opened for
/// locking; its contents are never read or changed.
///
/// # Errors
///
/// When a folder or the file cannot be made or opened.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// Takes the exclusive lock of `file` if no other open of it holds one:
/// true when taken, false when another holds it.
///
/// # Errors
///
/// When `flock` fails for another reason.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(error) => Err(error),
    }
}

/// Takes the exclusive lock of `file`, waiting while another holds it.
///
/// # Errors
///
/// When `flock` fails.
pub fn lock_exclusive(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_EX)
}

/// `flock(2)` of `file` with `operation`.
fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    // SAFETY: the descriptor belongs to `file`, open for the whole call;
    // flock reads nothing from memory.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_held_until_its_file_closes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sub").join("a.lock");
        let held = open_lock_file(&path).expect("open");
        assert!(try_lock_exclusive(&held).expect("lock"));
        let other = File::open(&path).expect("open again");
        assert!(!try_lock_exclusive(&other).expect("try"));
        drop(held);
        assert!(try_lock_exclusive(&other).expect("free once the holder closed it"));
    }
}
