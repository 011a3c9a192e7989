//! Proving who is at the other end of a connection: a mutual
//! challenge–response keyed by the connecting principal's secret
//! (HMAC-SHA256), sans-IO.
//!
//! ```text
//! connector → listener  HELLO (role, name)
//! listener → connector  HELLO, then AUTH_CHALLENGE: nonce_l
//! connector → listener  AUTH_PROOF: nonce_c, HMAC(K, transcript(connector))
//! listener → connector  AUTH_PROOF: nonce 0, HMAC(K, transcript(listener))
//! ```
//!
//! `K` is the secret the operator provisioned for the connecting principal
//! (a client, or a fabric device toward its servers); the listener holds
//! the secrets of the principals that may connect to it. The transcript
//! binds both nonces, the principal's role and name, the listener's name
//! and which side speaks, so a proof cannot be replayed on another
//! connection, for another name, or reflected back. A listener that
//! requires authentication answers nothing but the challenge and the proof
//! before it has checked one.
//!
//! AUTH_CHALLENGE body: `nonce` (32 bytes). AUTH_PROOF body: `nonce`
//! (32 bytes, the connector's; zero from the listener), `mac` (32 bytes).

use core::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};
use crate::hello::Role;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof's MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of a secret key.
pub const KEY_LEN: usize = 32;
/// Bytes of an AUTH_PROOF body.
pub const PROOF_LEN: usize = NONCE_LEN + MAC_LEN;

/// Domain separation: what the MACs are for and in which version.
const CONTEXT: &[u8] = b"pmem-fabric auth v1";

/// A principal's secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(…)")
    }
}

impl Key {
    /// A key from its bytes.
    pub const fn new(bytes: [u8; KEY_LEN]) -> Self {
        Key(bytes)
    }

    fn mac(&self, side: Side, transcript: &Transcript<'_>) -> Hmac<Sha256> {
        // HMAC takes keys of any length; 32 bytes cannot be refused.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(CONTEXT);
        mac.update(&[side as u8, u8::from(transcript.role)]);
        for name in [transcript.principal, transcript.listener] {
            mac.update(&(name.len() as u16).to_le_bytes());
            mac.update(name.as_bytes());
        }
        mac.update(&transcript.listener_nonce);
        mac.update(&transcript.connector_nonce);
        mac
    }

    /// The MAC `side` sends for `transcript`.
    pub fn prove(&self, side: Side, transcript: &Transcript<'_>) -> [u8; MAC_LEN] {
        self.mac(side, transcript).finalize().into_bytes().into()
    }

    /// Whether `mac` is what `side` must send for `transcript` (compared in
    /// constant time).
    pub fn verify(&self, side: Side, transcript: &Transcript<'_>, mac: &[u8; MAC_LEN]) -> bool {
        self.mac(side, transcript).verify_slice(mac).is_ok()
    }
}

/// Who sends a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Side {
    /// The side that connected and said HELLO first.
    Connector = 1,
    /// The side that accepted the connection and sent the challenge.
    Listener = 2,
}

/// What a proof covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript<'a> {
    /// The connecting principal's role (from its HELLO).
    pub role: Role,
    /// The connecting principal's name (from its HELLO).
    pub principal: &'a str,
    /// The listener's name (from its HELLO).
    pub listener: &'a str,
    /// The listener's challenge.
    pub listener_nonce: [u8; NONCE_LEN],
    /// The connector's nonce, sent with its proof.
    pub connector_nonce: [u8; NONCE_LEN],
}

/// An AUTH_PROOF body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proof {
    /// The sender's nonce (zero from the listener).
    pub nonce: [u8; NONCE_LEN],
    /// The MAC over the transcript.
    pub mac: [u8; MAC_LEN],
}

impl Proof {
    /// Parses an AUTH_PROOF body.
    pub fn parse(body: &[u8]) -> Result<Proof> {
        if body.len() != PROOF_LEN {
            return Err(Error::LengthMismatch {
                what: "auth proof body",
                expected: PROOF_LEN,
                got: body.len(),
            });
        }
        let mut proof = Proof {
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
        };
        proof.nonce.copy_from_slice(&body[..NONCE_LEN]);
        proof.mac.copy_from_slice(&body[NONCE_LEN..]);
        Ok(proof)
    }

    /// Writes the body into a buffer of [`PROOF_LEN`] bytes.
    pub fn emit(&self, body: &mut [u8]) {
        body[..NONCE_LEN].copy_from_slice(&self.nonce);
        body[NONCE_LEN..PROOF_LEN].copy_from_slice(&self.mac);
    }
}

/// Parses an AUTH_CHALLENGE body: the listener's nonce.
pub fn parse_challenge(body: &[u8]) -> Result<[u8; NONCE_LEN]> {
    <[u8; NONCE_LEN]>::try_from(body).map_err(|_| Error::LengthMismatch {
        what: "auth challenge body",
        expected: NONCE_LEN,
        got: body.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript<'a>(principal: &'a str, listener: &'a str) -> Transcript<'a> {
        Transcript {
            role: Role::Client,
            principal,
            listener,
            listener_nonce: [1; NONCE_LEN],
            connector_nonce: [2; NONCE_LEN],
        }
    }

    #[test]
    fn a_proof_holds_only_for_its_key_side_names_and_nonces() {
        let key = Key::new([7; KEY_LEN]);
        let t = transcript("c1", "F");
        let mac = key.prove(Side::Connector, &t);
        assert!(key.verify(Side::Connector, &t, &mac));
        assert!(
            !Key::new([8; KEY_LEN]).verify(Side::Connector, &t, &mac),
            "another key"
        );
        assert!(
            !key.verify(Side::Listener, &t, &mac),
            "reflected to the other side"
        );
        assert!(
            !key.verify(Side::Connector, &transcript("c2", "F"), &mac),
            "another name"
        );
        assert!(
            !key.verify(Side::Connector, &transcript("c1", "G"), &mac),
            "another listener"
        );
        let mut other = t;
        other.listener_nonce[0] ^= 1;
        assert!(
            !key.verify(Side::Connector, &other, &mac),
            "another challenge"
        );
        let mut role = t;
        role.role = Role::FabricDevice;
        assert!(!key.verify(Side::Connector, &role, &mac), "another role");
        // Names are length-prefixed: moving a byte between them changes the MAC.
        assert!(!key.verify(Side::Connector, &transcript("c1F", ""), &mac));
    }

    #[test]
    fn bodies_round_trip_and_refuse_wrong_lengths() {
        let proof = Proof {
            nonce: [3; NONCE_LEN],
            mac: [4; MAC_LEN],
        };
        let mut body = [0u8; PROOF_LEN];
        proof.emit(&mut body);
        assert_eq!(Proof::parse(&body), Ok(proof));
        assert!(Proof::parse(&body[..63]).is_err());
        assert_eq!(parse_challenge(&[5; 32]), Ok([5; 32]));
        assert!(parse_challenge(&[5; 31]).is_err());
        assert_eq!(format!("{:?}", Key::new([9; 32])), "Key(…)");
    }
}
