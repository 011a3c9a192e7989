//! A path's live link to its fabric device: the device protocol over TCP
//! ([`crate::conn`]), or RDMA on a RoCEv2 queue pair (`verbs`, feature
//! `verbs`). The pool sends requests and gives up on them the same way on
//! both.

#[cfg(feature = "verbs")]
use std::sync::Arc;

use proto::request::{self, ExactlyOnce};
use tokio::sync::oneshot;

use crate::conn::{Lost, PathConn, Response};
#[cfg(feature = "verbs")]
use crate::verbs::link::{Resend, Ticket, VerbsLink};

/// What decides how a link carries a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carriage {
    /// An earlier attempt of the request may have run it.
    pub again: bool,
    /// The request is for a replicated region and the path's device is not
    /// its owner (the owner's paths are down or the client's map is
    /// behind): the device will most likely refuse it with NOT_OWNER. Over
    /// RDMA a refusal is a NAK, which puts the queue pair in the error
    /// state and takes the path down under every other request on it, so
    /// such a request goes on the RoCE path's control connection, where a
    /// refusal is an ordinary answer.
    pub to_non_owner: bool,
}

/// A path's link.
#[derive(Debug)]
pub(crate) enum PathLink {
    /// The device protocol over TCP.
    Tcp(PathConn),
    /// RDMA through the verbs library.
    #[cfg(feature = "verbs")]
    Verbs(VerbsLink),
}

/// A request sent on a link.
#[derive(Debug)]
pub(crate) struct Sent {
    /// Its answer; an error when the link died first.
    pub reply: oneshot::Receiver<Response>,
    how: How,
}

#[derive(Debug)]
enum How {
    Tcp(u64),
    #[cfg(feature = "verbs")]
    Verbs(Arc<Ticket>),
}

impl PathLink {
    /// The device protocol connection, when the link is one (a RoCE
    /// link's control connection is not reachable here).
    pub fn tcp(&self) -> Option<&PathConn> {
        match self {
            PathLink::Tcp(conn) => Some(conn),
            #[cfg(feature = "verbs")]
            PathLink::Verbs(_) => None,
        }
    }

    /// Sends `req`, carried as `carriage` says.
    pub fn send(&self, req: &request::Repr<'_>, carriage: Carriage) -> Result<Sent, Lost> {
        match self {
            PathLink::Tcp(conn) => {
                let _ = carriage;
                let (tag, reply) = conn.send(&proto::Message::Request(*req))?;
                Ok(Sent {
                    reply,
                    how: How::Tcp(tag),
                })
            }
            #[cfg(feature = "verbs")]
            PathLink::Verbs(link) => {
                let resend = if carriage.again {
                    Resend::Again
                } else {
                    Resend::First
                };
                let (reply, ticket) = link.send(req, resend, carriage.to_non_owner)?;
                Ok(Sent {
                    reply,
                    how: How::Verbs(ticket),
                })
            }
        }
    }

    /// After a request on this link timed out: makes sure nothing sent on
    /// it can still reach the device, before the request is tried on
    /// another path. A queue pair keeps retransmitting what it posted
    /// (an RDMA WRITE retried elsewhere meanwhile could land after the
    /// retry, or tear a later write of the same bytes), so the link is shut
    /// and its queue pair destroyed, waiting at most `limit`. On TCP the
    /// device has the request or never will; nothing to do.
    pub async fn fence(&self, limit: std::time::Duration) {
        match self {
            PathLink::Tcp(_) => {
                let _ = limit;
            }
            #[cfg(feature = "verbs")]
            PathLink::Verbs(link) => {
                link.shut();
                let deadline = tokio::time::Instant::now() + limit;
                while !link.is_destroyed() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        }
    }

    /// Stops waiting for `sent` (after a timeout).
    pub fn cancel(&self, sent: &Sent) {
        match (&sent.how, self) {
            (How::Tcp(tag), PathLink::Tcp(conn)) => conn.forget(*tag),
            #[cfg(feature = "verbs")]
            (How::Verbs(ticket), _) => ticket.cancel(),
            #[cfg(feature = "verbs")]
            (How::Tcp(_), PathLink::Verbs(_)) => {}
        }
    }
}

impl Sent {
    /// The identity the device gave the request when it went as a
    /// device-numbered RDMA atomic: asked again, it must carry this one.
    pub fn identity(&self) -> Option<ExactlyOnce> {
        match &self.how {
            How::Tcp(_) => None,
            #[cfg(feature = "verbs")]
            How::Verbs(ticket) => ticket.identity(),
        }
    }
}
