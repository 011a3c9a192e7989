//! The admin HTTP endpoint: `GET /metrics` and `GET /healthz`, served by
//! `tiny_http` on threads of its own (the daemons have no async runtime).

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use prometheus_client::encoding::prometheus_text;
use tiny_http::{Header, Method, Request, Response, Server};

use crate::registry::Registry;

/// The `Content-Type` of `/metrics`: the text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Threads answering requests; `tiny_http` accepts connections and reads
/// requests on threads of its own.
const WORKERS: usize = 2;

/// What `/healthz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Serving: 200 with `ok`.
    Healthy,
    /// Not serving: 503 with this reason.
    Unhealthy(String),
}

/// The health check `/healthz` calls on every request.
pub type HealthCheck = Arc<dyn Fn() -> Health + Send + Sync>;

/// Why the admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound.
    #[error("cannot bind the admin endpoint to {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// The bound listener could not be set up.
    #[error("cannot set up the admin listener")]
    Listener(#[source] io::Error),
    /// The HTTP server could not be started on the listener.
    #[error("cannot start the admin HTTP server")]
    Server(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A thread answering requests could not be started.
    #[error("cannot start an admin thread")]
    Spawn(#[source] io::Error),
}

/// A running admin endpoint. [`AdminServer::shutdown`], or dropping it, stops
/// accepting connections and joins the threads answering requests.
pub struct AdminServer {
    local_addr: SocketAddr,
    server: Arc<Server>,
    /// The listening socket `server` accepts on, to close it at shutdown.
    listener: TcpListener,
    workers: Vec<JoinHandle<()>>,
}

impl AdminServer {
    /// Binds `addr` (port 0 picks a free port; see [`AdminServer::local_addr`])
    /// and serves `registry` on `/metrics` and `health` on `/healthz`.
    pub fn start(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: HealthCheck,
    ) -> Result<Self, AdminError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| AdminError::Bind { addr, source })?;
        let local_addr = listener.local_addr().map_err(AdminError::Listener)?;
        let handle = listener.try_clone().map_err(AdminError::Listener)?;
        let server = Server::from_listener(listener, None).map_err(AdminError::Server)?;
        let mut admin = Self {
            local_addr,
            server: Arc::new(server),
            listener: handle,
            workers: Vec::with_capacity(WORKERS),
        };
        let routes = Arc::new(Routes { registry, health });
        for _ in 0..WORKERS {
            let server = Arc::clone(&admin.server);
            let routes = Arc::clone(&routes);
            let worker = thread::Builder::new()
                .name("admin-http".into())
                .spawn(move || serve(&server, &routes))
                // Dropping `admin` stops the workers started so far.
                .map_err(AdminError::Spawn)?;
            admin.workers.push(worker);
        }
        Ok(admin)
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting connections and joins the threads answering requests.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        // Shutting the listening socket down fails `tiny_http`'s blocked accept
        // and refuses new connections at once, not when its thread gets to it.
        let _ = socket2::SockRef::from(&self.listener).shutdown(Shutdown::Both);
        for _ in &self.workers {
            self.server.unblock();
        }
        for worker in self.workers.drain(..) {
            // A worker does not panic; if it did, there is nothing left to stop.
            let _ = worker.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminServer")
            .field("local_addr", &self.local_addr)
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

/// Answers requests until the server is unblocked or stops accepting.
fn serve(server: &Server, routes: &Routes) {
    loop {
        match server.recv() {
            Ok(request) => routes.answer(request),
            Err(error) => {
                tracing::debug!(%error, "admin endpoint thread stops");
                return;
            }
        }
    }
}

/// What the endpoint serves.
struct Routes {
    registry: Arc<Registry>,
    health: HealthCheck,
}

impl Routes {
    fn answer(&self, request: Request) {
        let readable = matches!(request.method(), Method::Get | Method::Head);
        let path = request.url().split('?').next().unwrap_or_default();
        let response = match path {
            "/metrics" | "/healthz" if !readable => {
                with_header(text(405, "method not allowed\n"), "Allow", "GET, HEAD")
            }
            "/metrics" => with_header(
                text(200, self.registry.render()),
                "Content-Type",
                METRICS_CONTENT_TYPE,
            ),
            "/healthz" => match (self.health)() {
                Health::Healthy => text(200, "ok\n"),
                Health::Unhealthy(reason) => text(503, format!("unhealthy: {reason}\n")),
            },
            _ => text(404, "not found\n"),
        };
        if let Err(error) = request.respond(response) {
            tracing::debug!(%error, "cannot answer an admin request");
        }
    }
}

/// A `text/plain` response; `tiny_http` sends a HEAD request only its headers.
fn text(status: u16, body: impl Into<String>) -> TextResponse {
    Response::from_string(body).with_status_code(status)
}

type TextResponse = Response<io::Cursor<Vec<u8>>>;

/// Adds a header; the names and values given here are constants, all valid.
fn with_header(response: TextResponse, name: &str, value: &str) -> TextResponse {
    match Header::from_bytes(name, value) {
        Ok(header) => response.with_header(header),
        Err(()) => response,
    }
}
