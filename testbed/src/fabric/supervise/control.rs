//! The control socket of a running `testbed up`, and its client
//! (`testbed restart`, `testbed status` from another shell).
//!
//! A unix socket in the run's folder (`control.sock`): a request gets its
//! answer on the same connection (a restart's outcome once the daemon is
//! ready or has failed, so the caller's exit status tells), nothing has to
//! poll a file, a stale socket of a crashed run refuses connections and so
//! is told from a live one, and the folder's permissions limit who may
//! connect.
//!
//! The protocol is one request line from the client; the answer is lines of
//! text ending with `ok` or `failed` on a line of its own.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::Duration;

/// The socket's file name in the run's folder.
pub const SOCKET_NAME: &str = "control.sock";

/// The answer's last line when the request did what it asked.
const OK: &str = "ok";
/// The answer's last line when it did not.
const FAILED: &str = "failed";

/// Why the control socket could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be made.
    #[error("cannot listen on {path}")]
    Listen {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No `testbed up` answers at this socket.
    #[error(
        "no running `testbed up` at {path} (it stopped, or this is not its run folder; \
         `testbed up` prints its folder)"
    )]
    NotRunning {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking to it failed half way.
    #[error("lost the connection to `testbed up` at {path}")]
    Lost {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No running `up` under the reports folder.
    #[error(
        "no running `testbed up` under {reports}: start one, or pass --run with the folder \
         `testbed up` printed"
    )]
    NoneRunning {
        /// The folder searched.
        reports: PathBuf,
    },
    /// More than one running `up` under the reports folder.
    #[error("{} `testbed up` runs are running under {reports}: pass --run with one of {}", .runs.len(), .runs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Several {
        /// The folder searched.
        reports: PathBuf,
        /// The run folders whose socket answers.
        runs: Vec<PathBuf>,
    },
}

/// A request that came in on the socket; the answer goes back on it.
#[derive(Debug)]
pub struct Incoming {
    /// The request line.
    pub line: String,
    stream: UnixStream,
}

impl Incoming {
    /// Sends `text` and whether the request succeeded, then closes.
    pub fn answer(mut self, text: &str, ok: bool) {
        let mut body = text.trim_end().to_owned();
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(if ok { OK } else { FAILED });
        body.push('\n');
        // The client may have gone; nothing else to do then.
        let _ = self.stream.write_all(body.as_bytes());
    }
}

/// A listening control socket; the file is removed when it is dropped.
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
}

impl ControlSocket {
    /// Listens at `run_dir/control.sock` and hands every request line to
    /// `requests` (from a thread of its own).
    pub fn listen<T: From<Incoming> + Send + 'static>(
        run_dir: &Path,
        requests: Sender<T>,
    ) -> Result<Self, ControlError> {
        let path = run_dir.join(SOCKET_NAME);
        let listen_error = |source| ControlError::Listen {
            path: path.clone(),
            source,
        };
        // A socket left by a crashed run of the same folder is in the way.
        if path.exists() && UnixStream::connect(&path).is_err() {
            std::fs::remove_file(&path).map_err(listen_error)?;
        }
        let listener = UnixListener::bind(&path).map_err(listen_error)?;
        std::thread::Builder::new()
            .name("control-socket".to_owned())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let Some(incoming) = read_request(stream) else {
                        continue;
                    };
                    if requests.send(T::from(incoming)).is_err() {
                        break;
                    }
                }
            })
            .map_err(listen_error)?;
        Ok(Self { path })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads one request line; a client that sends nothing within a few
/// seconds, or no text, is dropped.
fn read_request(stream: UnixStream) -> Option<Incoming> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).ok()?;
    stream.set_read_timeout(None).ok()?;
    Some(Incoming {
        line: line.trim().to_owned(),
        stream,
    })
}

/// Sends `request` to the `up` whose run folder is `run_dir` and returns
/// its answer text and whether it succeeded. Waits as long as the request
/// takes (a restart waits for the daemon to be ready).
pub fn send(run_dir: &Path, request: &str) -> Result<(String, bool), ControlError> {
    let path = run_dir.join(SOCKET_NAME);
    let mut stream = UnixStream::connect(&path).map_err(|source| ControlError::NotRunning {
        path: path.clone(),
        source,
    })?;
    let lost = |source| ControlError::Lost {
        path: path.clone(),
        source,
    };
    stream
        .write_all(format!("{}\n", request.trim()).as_bytes())
        .map_err(lost)?;
    let mut lines = Vec::new();
    for line in BufReader::new(&stream).lines() {
        lines.push(line.map_err(lost)?);
    }
    let ok = match lines.pop().as_deref() {
        Some(OK) => true,
        Some(FAILED) => false,
        other => {
            return Err(lost(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the answer ended without ok or failed (last line {other:?})"),
            )));
        }
    };
    Ok((lines.join("\n"), ok))
}

/// The one run folder under `reports` whose `up` answers on its control
/// socket.
pub fn find_running(reports: &Path) -> Result<PathBuf, ControlError> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(reports)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|run| UnixStream::connect(run.join(SOCKET_NAME)).is_ok())
        .collect();
    runs.sort();
    match runs.len() {
        0 => Err(ControlError::NoneRunning {
            reports: reports.to_owned(),
        }),
        1 => Ok(runs.remove(0)),
        _ => Err(ControlError::Several {
            reports: reports.to_owned(),
            runs,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_gets_its_answer_and_outcome() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (tx, rx) = std::sync::mpsc::channel::<Incoming>();
        let socket = ControlSocket::listen(dir.path(), tx).expect("listen");
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let incoming = rx.recv().expect("a request");
                let ok = incoming.line == "status";
                let text = format!("you said {}", incoming.line);
                incoming.answer(&text, ok);
            }
        });
        assert_eq!(
            send(dir.path(), "status").expect("send"),
            ("you said status".to_owned(), true)
        );
        assert_eq!(
            send(dir.path(), "restart Z").expect("send"),
            ("you said restart Z".to_owned(), false)
        );
        server.join().expect("server");
        drop(socket);
        assert!(!dir.path().join(SOCKET_NAME).exists(), "removed on drop");
        assert!(matches!(
            send(dir.path(), "status"),
            Err(ControlError::NotRunning { .. })
        ));
    }

    #[test]
    fn the_running_up_is_found_and_stale_sockets_are_not() {
        let reports = tempfile::tempdir().expect("temp dir");
        let live = reports.path().join("live");
        let stale = reports.path().join("stale");
        std::fs::create_dir_all(&live).expect("mkdir");
        std::fs::create_dir_all(&stale).expect("mkdir");
        // A socket file nobody listens on, as a crashed run leaves it.
        drop(UnixListener::bind(stale.join(SOCKET_NAME)).expect("bind"));
        assert!(matches!(
            find_running(reports.path()),
            Err(ControlError::NoneRunning { .. })
        ));
        let (tx, _rx) = std::sync::mpsc::channel::<Incoming>();
        let _socket = ControlSocket::listen(&live, tx).expect("listen");
        assert_eq!(find_running(reports.path()).expect("found"), live);
    }
}
