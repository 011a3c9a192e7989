//! The admin endpoint over real sockets.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use telemetry::{AdminServer, Health, METRICS_CONTENT_TYPE, Registry, http_get};

const TIMEOUT: Duration = Duration::from_secs(5);

fn start(registry: Arc<Registry>, healthy: Arc<AtomicBool>) -> AdminServer {
    let health = Arc::new(move || {
        if healthy.load(Ordering::SeqCst) {
            Health::Healthy
        } else {
            Health::Unhealthy("region r1 is read-only".into())
        }
    });
    AdminServer::start((Ipv4Addr::LOCALHOST, 0).into(), registry, health)
        .expect("start the admin endpoint")
}

fn sample_registry() -> Arc<Registry> {
    let registry = Arc::new(Registry::new());
    registry
        .counter("requests_total", "Requests served.")
        .expect("register requests_total")
        .add(3);
    registry
}

/// Sends raw bytes, then returns everything the server answers until it closes
/// (the request asks it to, or is HTTP/1.0).
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("set timeout");
    stream.write_all(request).expect("send request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read answer");
    String::from_utf8(answer).expect("UTF-8 answer")
}

#[test]
fn serves_metrics() {
    let registry = sample_registry();
    let server = start(Arc::clone(&registry), Arc::new(AtomicBool::new(true)));
    let (status, body) = http_get(server.local_addr(), "/metrics", TIMEOUT).unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, registry.render());
    assert!(body.contains("requests_total 3\n"));

    let answer = exchange(
        server.local_addr(),
        b"GET /metrics?x=1 HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let headers: Vec<&str> = head.split("\r\n").collect();
    assert!(
        headers.contains(&format!("Content-Type: {METRICS_CONTENT_TYPE}").as_str()),
        "{head}"
    );
    assert!(
        headers.contains(&format!("Content-Length: {}", body.len()).as_str()),
        "{head}"
    );
    assert_eq!(body, registry.render());
    server.shutdown();
}

#[test]
fn head_has_headers_only() {
    let server = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let answer = exchange(
        server.local_addr(),
        b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Length: "));
    assert!(!head.contains("Content-Length: 0\r\n"));
    assert_eq!(body, "");
    let answer = exchange(server.local_addr(), b"HEAD /healthz HTTP/1.0\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(answer.contains("\r\nContent-Length: 3\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n"), "{answer}");
}

#[test]
fn health_flips() {
    let healthy = Arc::new(AtomicBool::new(true));
    let server = start(sample_registry(), Arc::clone(&healthy));
    let addr = server.local_addr();
    assert_eq!(
        http_get(addr, "/healthz", TIMEOUT).unwrap(),
        (200, "ok\n".to_owned())
    );
    healthy.store(false, Ordering::SeqCst);
    assert_eq!(
        http_get(addr, "/healthz", TIMEOUT).unwrap(),
        (503, "unhealthy: region r1 is read-only\n".to_owned())
    );
    healthy.store(true, Ordering::SeqCst);
    assert_eq!(http_get(addr, "/healthz", TIMEOUT).unwrap().0, 200);
}

#[test]
fn errors() {
    let server = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let addr = server.local_addr();
    assert_eq!(http_get(addr, "/nope", TIMEOUT).unwrap().0, 404);
    assert_eq!(http_get(addr, "/metrics/", TIMEOUT).unwrap().0, 404);

    let post = exchange(
        addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert!(
        post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{post}"
    );
    assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
    let delete = exchange(addr, b"DELETE /healthz HTTP/1.0\r\n\r\n");
    assert!(delete.starts_with("HTTP/1.0 405 "), "{delete}");

    for garbage in [
        &b"garbage\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\r\nno header colon\r\n\r\n",
    ] {
        let answer = exchange(addr, garbage);
        assert!(
            answer.contains(" 400 Bad Request\r\n"),
            "{garbage:?}: {answer}"
        );
    }
    // Half a request, then the client gives up.
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metr").unwrap();
    drop(stream);

    // After all of that the endpoint still serves.
    assert_eq!(http_get(addr, "/metrics", TIMEOUT).unwrap().0, 200);
}

/// Clients that send nothing, or half a request, stay connected while
/// others are answered: the endpoint reads requests without waiting on
/// them (it has no read timeout, so a wait would never end).
#[test]
fn a_silent_client_blocks_nobody() {
    let server = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let addr = server.local_addr();
    let _silent = TcpStream::connect(addr).unwrap();
    let mut trickling = TcpStream::connect(addr).unwrap();
    trickling.write_all(b"GET /met").unwrap();

    for _ in 0..5 {
        assert_eq!(http_get(addr, "/metrics", TIMEOUT).unwrap().0, 200);
    }
    // The trickling client was waited for, not dropped: its request ends
    // now and is answered.
    trickling
        .write_all(b"rics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    trickling.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut answer = String::new();
    trickling.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn shutdown_stops_accepting_and_joins() {
    let server = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let addr = server.local_addr();
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    assert_eq!(http_get(addr, "/healthz", TIMEOUT).unwrap().0, 200);

    // The stalled client never finishes its request, so a shutdown that
    // waited for it would never return (the 60 s only bound the hang).
    let (done, shut) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        server.shutdown();
        let _ = done.send(());
    });
    assert!(
        shut.recv_timeout(Duration::from_secs(60)).is_ok(),
        "shutdown waited for the stalled client"
    );
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}

#[test]
fn drop_stops_the_server() {
    let server = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let addr = server.local_addr();
    drop(server);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}

#[test]
fn bind_errors_are_typed() {
    let first = start(sample_registry(), Arc::new(AtomicBool::new(true)));
    let taken = first.local_addr();
    let error =
        AdminServer::start(taken, sample_registry(), Arc::new(|| Health::Healthy)).unwrap_err();
    assert!(matches!(error, telemetry::AdminError::Bind { addr, .. } if addr == taken));
}
