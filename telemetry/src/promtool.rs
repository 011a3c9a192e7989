//! Linting rendered metrics with Prometheus' own `promtool check metrics`.

use std::io::{self, Write};
use std::process::{Command, Stdio};
use std::thread;

/// Runs `promtool check metrics` with `text` on its standard input.
///
/// `Ok` when promtool accepts the text; otherwise the error holds promtool's
/// complaints — parse errors and lint problems alike, such as a missing HELP or a
/// counter without the `_total` suffix, since promtool fails on both — or says
/// that promtool is missing and how to install it (Debian package `prometheus`).
pub fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => format!(
                "promtool is not installed (not found on PATH): install the Debian \
                 package `prometheus` (apt-get install prometheus), which provides \
                 /usr/bin/promtool ({error})"
            ),
            _ => format!("cannot run promtool: {error}"),
        })?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| "promtool's standard input was not captured".to_owned())?;
    // Write from another thread so a large text cannot deadlock against promtool's
    // output; dropping `stdin` at the end of the write closes it.
    let (written, output) = thread::scope(|scope| {
        let writer = scope.spawn(move || {
            let mut stdin = stdin;
            stdin.write_all(text.as_bytes())
        });
        let output = child.wait_with_output();
        (writer.join(), output)
    });
    let output = output.map_err(|error| format!("cannot wait for promtool: {error}"))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(format!(
            "promtool check metrics failed ({}):\n{report}",
            output.status
        ));
    }
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("cannot write the metrics to promtool: {error}")),
        Err(_) => Err("the thread writing to promtool panicked".to_owned()),
    }
}
