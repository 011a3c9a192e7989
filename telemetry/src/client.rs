//! A tiny blocking HTTP GET client, enough to scrape an admin endpoint (or
//! query Prometheus) from tests and the testbed.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The largest response read; an admin endpoint answers far less.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Sends `GET path` to `addr` and returns the status code and the body, which
/// must be UTF-8. `timeout` bounds the connect and the whole exchange after it.
///
/// Errors are those of the connection, `TimedOut` past the deadline,
/// `InvalidInput` for a path that is not `/` followed by visible ASCII, and
/// `InvalidData` for a response that is not well-formed HTTP/1.x.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {path:?} is not '/' followed by visible ASCII"),
        ));
    }
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    let deadline = Instant::now() + timeout;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;

    let mut raw = Vec::new();
    let mut chunk = [0_u8; 8192];
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no complete response in time",
            ));
        }
        stream.set_read_timeout(Some(remaining))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(invalid("response larger than 64 MiB"));
        }
    }
    parse_response(&raw)
}

/// Splits a whole `Connection: close` response into status and body; the body
/// is cut to `Content-Length` when there is one.
fn parse_response(raw: &[u8]) -> io::Result<(u16, String)> {
    let head_len = raw
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(|| invalid("response head does not end"))?;
    let head =
        std::str::from_utf8(&raw[..head_len]).map_err(|_| invalid("response head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.")
        || code.len() != 3
        || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(invalid("malformed status line"));
    }
    let status: u16 = code.parse().map_err(|_| invalid("malformed status code"))?;

    let mut body = &raw[head_len + 4..];
    let mut dechunked = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(invalid("malformed header line"));
        };
        if name.eq_ignore_ascii_case("transfer-encoding")
            && value.trim().eq_ignore_ascii_case("chunked")
        {
            dechunked = Some(dechunk(body)?);
        } else if name.eq_ignore_ascii_case("content-length") {
            let length: usize = value
                .trim()
                .parse()
                .map_err(|_| invalid("malformed Content-Length"))?;
            body = body.get(..length).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "body shorter than Content-Length",
                )
            })?;
        }
    }
    let body = dechunked.unwrap_or_else(|| body.to_vec());
    let body = String::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?;
    Ok((status, body))
}

/// Decodes a `Transfer-Encoding: chunked` body: hex size lines, each
/// followed by that many bytes and CRLF, ending with a zero-size chunk.
fn dechunk(mut raw: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| invalid("chunk size line does not end"))?;
        let line = std::str::from_utf8(&raw[..line_end])
            .map_err(|_| invalid("chunk size is not ASCII"))?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| invalid("malformed chunk size"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = raw.get(..size).ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "chunk shorter than its size")
        })?;
        body.extend_from_slice(chunk);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\nextra";
        assert_eq!(parse_response(ok).unwrap(), (200, "ok\n".to_owned()));
        let no_length = b"HTTP/1.0 404 Not Found\r\n\r\nnope";
        assert_eq!(parse_response(no_length).unwrap(), (404, "nope".to_owned()));
        let no_reason = b"HTTP/1.1 503\r\n\r\n";
        assert_eq!(parse_response(no_reason).unwrap(), (503, String::new()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n6;x=y\r\npedia \r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (200, "Wikipedia ".to_owned())
        );
    }

    #[test]
    fn bad_responses() {
        for bad in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\n\r\n\xff",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort",
        ] {
            assert!(
                parse_response(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn paths_cannot_inject() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        for bad in ["", "metrics", "/a b", "/a\r\nX: y"] {
            let error = http_get(addr, bad, Duration::from_millis(100)).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        }
    }
}
