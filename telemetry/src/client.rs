//! A blocking HTTP GET over `ureq`, enough to scrape an admin endpoint (or
//! query Prometheus) from tests, pmemctl and the testbed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ureq::Agent;

/// The largest body read; an admin endpoint answers far less.
const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;

/// Sends `GET path` to `http://addr` and returns the status code and the body,
/// which must be UTF-8. `timeout` bounds the whole exchange, connect included.
/// Any status is returned, not only 2xx; no proxy is used.
///
/// Errors are those of the connection (`ureq`'s errors are wrapped, with
/// `TimedOut` past the deadline), and `InvalidInput` for a path that is not
/// `/` followed by visible ASCII.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {path:?} is not '/' followed by visible ASCII"),
        ));
    }
    let agent: Agent = Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let mut response = agent
        .get(format!("http://{addr}{path}"))
        .call()
        .map_err(into_io)?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY_BYTES)
        .read_to_string()
        .map_err(into_io)?;
    Ok((status, body))
}

/// An `io::Error` whose source is `error`, or the I/O error it wraps.
fn into_io(error: ureq::Error) -> io::Error {
    match error {
        ureq::Error::Timeout(_) => io::Error::new(io::ErrorKind::TimedOut, error),
        error => error.into_io(),
    }
}

/// The sum of every sample of metric `name` whose labels contain `labels`
/// (`""` for all), from text in the exposition format (a
/// scraped `/metrics`); `None` when there is none.
pub fn metric_sum(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let mut found = None;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (series, value) = match rest.rsplit_once(' ') {
            Some(pair) => pair,
            None => continue,
        };
        if !(series.is_empty() || series.starts_with('{')) || !series.contains(labels) {
            continue;
        }
        if let Ok(value) = value.parse::<f64>() {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_inject() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        for bad in ["", "metrics", "/a b", "/a\r\nX: y"] {
            let error = http_get(addr, bad, Duration::from_millis(100)).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn samples_of_a_metric_add_up_by_name_and_labels() {
        let text = "# TYPE ops_total counter\n\
            ops_total{op=\"READ\",status=\"OK\"} 3\n\
            ops_total{op=\"WRITE\",status=\"OK\"} 4\n\
            ops_total_created 9\n\
            cpu_seconds_total 0.25\n";
        assert_eq!(metric_sum(text, "ops_total", ""), Some(7.0));
        assert_eq!(metric_sum(text, "ops_total", "op=\"READ\""), Some(3.0));
        assert_eq!(metric_sum(text, "cpu_seconds_total", ""), Some(0.25));
        assert_eq!(metric_sum(text, "missing", ""), None);
    }

    #[test]
    fn refused_connections_are_io_errors() {
        // A port that was free a moment ago: nothing listens there now.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = http_get(addr, "/metrics", Duration::from_secs(2)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    }
}
