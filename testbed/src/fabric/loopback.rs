//! The benches' small fabrics on one machine: a shape from
//! [`testkit::FabricSpec`], under a pool name of its own, with every
//! listener on a free port (of a loopback address unless the spec gives a
//! device port another address, as a RoCEv2 port's control listener).

use anyhow::{Context, anyhow};
use testkit::FabricSpec;
use topology::Topology;

/// `spec`'s topology as pool `pool` with `replicas` copies of each region
/// (`None`: the pool's default, one), each server NIC and fabric device
/// port on a free port of its own (at the address the spec gives it,
/// `127.0.0.1` unless said otherwise), checked valid.
///
/// # Errors
///
/// When no loopback port is free, or the pool's settings make the
/// topology invalid.
pub fn loopback_topology(
    spec: &FabricSpec,
    pool: &str,
    replicas: Option<u64>,
) -> anyhow::Result<Topology> {
    let mut topology = spec.topology();
    topology.pool.name = pool.to_owned();
    topology.pool.replicas = replicas;
    topology.source = format!("<{pool} topology>");
    let listeners = topology
        .servers
        .iter_mut()
        .flat_map(|s| s.nics.iter_mut().map(|nic| &mut nic.listen))
        .chain(
            topology
                .fabric_devices
                .iter_mut()
                .flat_map(|d| d.ports.iter_mut().map(|port| &mut port.listen)),
        );
    for listen in listeners {
        let port = testkit::try_free_loopback_port().context("no free loopback port")?;
        let host = listen
            .rsplit_once(':')
            .map_or("127.0.0.1", |(host, _)| host);
        *listen = format!("{host}:{port}");
    }
    topology
        .validate()
        .map_err(|errors| anyhow!("the {pool} topology is invalid: {errors}"))?;
    Ok(topology)
}
