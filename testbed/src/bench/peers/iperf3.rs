//! iperf3: the byte-moving floor, one TCP stream.

use std::time::Duration;

use super::output::tail;
use super::process::{run, start_server, strings, whole_seconds};
use super::{OVERSHOOT, PeerError, READY_TIMEOUT};

/// iperf3, one TCP stream over loopback for `duration` (whole seconds, at
/// least one): `iperf3 -s -1` and `iperf3 -c 127.0.0.1 -t SECS -J`; returns
/// the bytes per second the receiver got.
pub fn iperf3_bandwidth(duration: Duration) -> Result<f64, PeerError> {
    let secs = whole_seconds(duration);
    let (_server, port) = start_server("iperf3", READY_TIMEOUT, &|port| {
        strings(&["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
    })?;
    let args = strings(&[
        "-c",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-J",
    ]);
    let done = run("iperf3", &args, Duration::from_secs(secs) + OVERSHOOT)?;
    parse_iperf3_json(&done.stdout)
}

/// Reads `end.sum_received.bits_per_second` from `iperf3 -J` output and
/// returns bytes per second; an `error` member (iperf3 3.12 exits 0 when it
/// cannot connect) is an error.
pub fn parse_iperf3_json(json: &str) -> Result<f64, PeerError> {
    let parse_error = |what: &str| PeerError::Parse {
        program: "iperf3".into(),
        what: what.into(),
        output_tail: tail(json),
    };
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| parse_error(&format!("its JSON ({e})")))?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        return Err(PeerError::Failed {
            command: "iperf3 -c 127.0.0.1 … -J".into(),
            status: "reported an error".into(),
            stderr_tail: error.to_owned(),
        });
    }
    let bits = value
        .pointer("/end/sum_received/bits_per_second")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| parse_error("end.sum_received.bits_per_second"))?;
    if !bits.is_finite() || bits <= 0.0 {
        return Err(parse_error("a positive end.sum_received.bits_per_second"));
    }
    Ok(bits / 8.0)
}

// ---------------------------------------------------------------------------
// redis.
