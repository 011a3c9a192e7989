//! Client authentication in the forwarding core (with `--secrets`): a
//! client proves its key after HELLO before anything else is answered.

use std::collections::HashMap;

use proto::hello::{self, Capabilities, Role};
use proto::{Message, Opcode, Status};

use super::{
    ClientAction, ConnId, Forwarder, PROTOCOL_VERSION, Reply, error_reply, frame_reply, fresh_nonce,
};
use crate::metrics::DeviceMetrics;

impl Forwarder {
    /// Requires every client to prove its key (from `keys`, by client id)
    /// after HELLO; a client without a key is refused. Returns the keys it
    /// replaces (none the first time). Connections already proven stay;
    /// one whose client the map no longer names is refused at its next
    /// frame.
    pub fn require_client_keys(
        &mut self,
        keys: HashMap<String, proto::auth::Key>,
    ) -> Option<HashMap<String, proto::auth::Key>> {
        self.client_keys.replace(keys)
    }

    /// The clients' keys proofs are checked against (with authentication).
    pub fn client_keys(&self) -> Option<&HashMap<String, proto::auth::Key>> {
        self.client_keys.as_ref()
    }

    /// A frame from a client that has not proven its key (client
    /// authentication on): HELLO draws a challenge, the proof is checked,
    /// anything else is refused and closes the connection.
    pub(super) fn at_the_gate(
        &mut self,
        conn: ConnId,
        message: Message<'_>,
        tag: u64,
    ) -> ClientAction<'static> {
        let refuse = |metrics: &DeviceMetrics, reason: &str, opcode, status| {
            metrics.hello_refused.with(&[reason]).inc();
            ClientAction::ReplyAndClose(error_reply(opcode, tag, status))
        };
        let challenged = self.sessions.get(&conn).and_then(|s| s.challenged.clone());
        match (message, challenged) {
            (Message::Hello(hello), None) => {
                if hello.version < PROTOCOL_VERSION {
                    return refuse(
                        &self.metrics,
                        "version",
                        Opcode::Hello,
                        Status::VersionMismatch,
                    );
                }
                let known = self.map.clients.contains_key(hello.name)
                    && self
                        .client_keys
                        .as_ref()
                        .is_some_and(|keys| keys.contains_key(hello.name));
                if !known {
                    return refuse(
                        &self.metrics,
                        "unknown_client",
                        Opcode::Hello,
                        Status::UnknownClient,
                    );
                }
                let nonce = fresh_nonce();
                if let Some(session) = self.sessions.get_mut(&conn) {
                    session.challenged = Some((hello.name.to_owned(), nonce));
                }
                let mut bytes = Vec::new();
                let ours = Message::Hello(hello::Repr {
                    version: PROTOCOL_VERSION,
                    role: Role::FabricDevice,
                    capabilities: Capabilities::PIPELINING
                        | Capabilities::EXACTLY_ONCE
                        | Capabilities::QP_EPOCH,
                    name: self.map.device.as_str(),
                });
                if ours.encode_into(tag, &mut bytes).is_err()
                    || Message::AuthChallenge(nonce)
                        .encode_into(tag, &mut bytes)
                        .is_err()
                {
                    return ClientAction::ReplyAndClose(error_reply(
                        Opcode::Hello,
                        tag,
                        Status::IoError,
                    ));
                }
                ClientAction::Reply(Reply::Frame(bytes))
            }
            (Message::AuthProof(proof), Some((name, nonce))) => {
                let transcript = proto::auth::Transcript {
                    role: Role::Client,
                    principal: &name,
                    listener: self.map.device.as_str(),
                    listener_nonce: nonce,
                    connector_nonce: proof.nonce,
                };
                let key = self.client_keys.as_ref().and_then(|keys| keys.get(&name));
                let Some(key) =
                    key.filter(|k| k.verify(proto::auth::Side::Connector, &transcript, &proof.mac))
                else {
                    return refuse(
                        &self.metrics,
                        "bad_proof",
                        Opcode::AuthProof,
                        Status::AccessDenied,
                    );
                };
                let answer = proto::auth::Proof {
                    nonce: [0; proto::auth::NONCE_LEN],
                    mac: key.prove(proto::auth::Side::Listener, &transcript),
                };
                // Proven: the HELLO's checks (connection cap) apply now.
                if let Some(session) = self.sessions.get_mut(&conn) {
                    session.challenged = None;
                }
                let hello = hello::Repr {
                    version: PROTOCOL_VERSION,
                    role: Role::Client,
                    capabilities: Capabilities::NONE,
                    name: &name,
                };
                match self.hello(conn, &hello, tag) {
                    ClientAction::Reply(_) => {
                        ClientAction::Reply(frame_reply(&Message::AuthProof(answer), tag))
                    }
                    refused => refused,
                }
            }
            (message, _) => refuse(
                &self.metrics,
                "unauthenticated",
                message.opcode(),
                Status::UnknownClient,
            ),
        }
    }
}
