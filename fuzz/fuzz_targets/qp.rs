//! QP_CONNECT and QP_ACCEPT bodies (setting up a RoCEv2 queue pair over a
//! control connection) from arbitrary bytes, alone and as whole frames.
//!
//! A body that parses re-emits to the very same bytes (reserved bits are
//! zero, the optional lane and capabilities are kept as they came), an
//! accepted R_Key table has the length its count says and rebuilds the
//! same QP_ACCEPT through `Accept::new`.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmem_fabric_fuzz::frames::{check_frame, framed};
use proto::Opcode;
use proto::qp::{self, Accept, Connect, Endpoint};

#[derive(Debug, Arbitrary)]
struct Input {
    tag: u64,
    body: Vec<u8>,
}

fn check_connect(body: &[u8]) {
    let Ok(connect) = Connect::parse(body) else {
        return;
    };
    assert_eq!(connect.buffer_len(), body.len());
    let mut again = vec![0; connect.buffer_len()];
    connect.emit(&mut again);
    assert_eq!(again, body, "{connect:?} re-emits to other bytes");
    assert_eq!(Endpoint::parse(body), Ok(connect.endpoint));
    if let Some(atomics) = connect.atomics {
        assert_ne!(
            atomics.lane, 0,
            "lane 0 belongs to requests that carry their number"
        );
    }
}

fn check_accept(body: &[u8]) {
    let Ok(accept) = Accept::parse(body) else {
        return;
    };
    assert_eq!(accept.buffer_len(), body.len());
    assert_eq!(accept.caps() & !qp::caps::KNOWN, 0, "unknown caps kept");
    let mut again = vec![0; accept.buffer_len()];
    accept.emit(&mut again);
    assert_eq!(again, body, "{accept:?} re-emits to other bytes");
    let pairs: Vec<(u32, u32)> = accept.rkeys().collect();
    assert!(pairs.len() <= qp::MAX_RKEYS);
    let table = qp::encode_rkeys(&pairs);
    let rebuilt = Accept::new(accept.endpoint, &table)
        .expect("a table that parsed is accepted")
        .with_caps(accept.caps());
    assert_eq!(rebuilt, accept);
}

fuzz_target!(|input: Input| {
    check_connect(&input.body);
    check_accept(&input.body);
    for opcode in [Opcode::QpConnect, Opcode::QpAccept] {
        let mut frame = Vec::new();
        framed(opcode, input.tag, &input.body, &mut frame);
        check_frame(&frame);
    }
});
