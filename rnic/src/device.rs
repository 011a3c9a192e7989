//! Opening an RDMA device by name (or the first) and choosing its RoCE v2
//! GID for a local IPv4 address.

use std::net::Ipv4Addr;
use std::sync::Arc;

use sideway::ibverbs::address::{Gid, GidType};
use sideway::ibverbs::device::{DeviceInfo, DeviceList, GetDeviceListErrorKind};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};

use crate::error::RnicError;

/// `EOPNOTSUPP`: what rdma-mummy-sys's stubs return when `libibverbs.so.1`
/// could not be loaded.
const EOPNOTSUPP: i32 = 95;
/// `ENOSYS`: libibverbs without kernel RDMA support.
const ENOSYS: i32 = 38;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`, what `ibv_query_gid_type` says for RoCE v2.
const SYSFS_ROCE_V2: u32 = 1;

/// The names of the RDMA devices present.
pub fn device_names() -> Result<Vec<String>, RnicError> {
    let list = device_list()?;
    Ok(list.iter().map(|d| d.name()).collect())
}

fn device_list() -> Result<DeviceList, RnicError> {
    DeviceList::new().map_err(|e| {
        let errno = match &e.0 {
            GetDeviceListErrorKind::Ibverbs(io) => io.raw_os_error(),
            _ => None,
        };
        match errno {
            Some(EOPNOTSUPP) => RnicError::NoLibrary(e),
            Some(ENOSYS) => RnicError::NoDevice,
            _ => RnicError::GetDeviceList(e),
        }
    })
}

/// Opens the device called `name`, or the first one; returns it and its name.
pub fn open(name: Option<&str>) -> Result<(Arc<DeviceContext>, String), RnicError> {
    let list = device_list()?;
    if list.is_empty() {
        return Err(RnicError::NoDevice);
    }
    let device = match name {
        None => list.get(0).ok_or(RnicError::NoDevice)?,
        Some(name) => {
            list.iter()
                .find(|d| d.name() == name)
                .ok_or_else(|| RnicError::UnknownDevice {
                    name: name.to_owned(),
                    present: list.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "),
                })?
        }
    };
    let device_name = device.name();
    let ctx = device.open().map_err(|source| RnicError::OpenDevice {
        device: device_name.clone(),
        source,
    })?;
    Ok((ctx, device_name))
}

/// What the queue pair needs to know about the local port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// The GID index whose GID is `::ffff:<local ip>`, RoCE v2.
    pub gid_index: u8,
    /// That GID.
    pub gid: Gid,
    /// The port's active MTU.
    pub active_mtu: Mtu,
    /// Most READs and atomics one QP may have outstanding as requester.
    pub max_rd_atomic: u8,
}

/// The IPv4-mapped GID `::ffff:a.b.c.d`.
pub fn ipv4_gid(ip: Ipv4Addr) -> Gid {
    Gid::from(ip.to_ipv6_mapped())
}

/// Queries port `port` of the device: it must be ACTIVE and have a RoCE v2
/// GID for `ip`.
pub fn port_info(
    ctx: &DeviceContext,
    device: &str,
    port: u8,
    ip: Ipv4Addr,
) -> Result<PortInfo, RnicError> {
    let attr = ctx
        .query_device()
        .map_err(|source| RnicError::QueryDevice {
            device: device.to_owned(),
            source,
        })?;
    let port_attr = ctx
        .query_port(port)
        .map_err(|source| RnicError::QueryPort {
            device: device.to_owned(),
            port,
            source,
        })?;
    let state = port_attr.port_state();
    if state != PortState::Active {
        return Err(RnicError::PortDown {
            device: device.to_owned(),
            port,
            state: format!("{state:?}"),
        });
    }
    let want = ipv4_gid(ip);
    let mut seen = Vec::new();
    let mut found = None;
    for index in 0..u32::try_from(port_attr.gid_tbl_len()).unwrap_or(0) {
        // Empty slots fail with ENODATA; they are simply not candidates.
        let (gid, kind) = match ctx.query_gid_ex(port, index) {
            Ok(entry) => (entry.gid(), entry.gid_type()),
            // Older libibverbs: the plain query and the sysfs type.
            Err(_) => match (ctx.query_gid(port, index), ctx.query_gid_type(port, index)) {
                (Ok(gid), Ok(SYSFS_ROCE_V2)) => (gid, GidType::RoceV2),
                (Ok(gid), Ok(_)) => (gid, GidType::RoceV1),
                _ => continue,
            },
        };
        if gid.is_zero() {
            continue;
        }
        seen.push(format!(
            "{index}={}/{kind:?}",
            std::net::Ipv6Addr::from(gid)
        ));
        if found.is_none() && gid == want && kind == GidType::RoceV2 {
            found = u8::try_from(index).ok().map(|i| (i, gid));
        }
    }
    let Some((gid_index, gid)) = found else {
        return Err(RnicError::NoGid {
            device: device.to_owned(),
            port,
            ip,
            seen: if seen.is_empty() {
                "none".to_owned()
            } else {
                seen.join(", ")
            },
        });
    };
    Ok(PortInfo {
        gid_index,
        gid,
        active_mtu: port_attr.active_mtu(),
        max_rd_atomic: u8::try_from(attr.max_qp_init_rd_atom().clamp(1, 16)).unwrap_or(1),
    })
}

/// An MTU in bytes.
pub fn mtu_bytes(mtu: Mtu) -> u16 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

/// The MTU of `bytes`, if verbs has one.
pub fn mtu_from_bytes(bytes: u16) -> Option<Mtu> {
    Some(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gid_of_an_ipv4_address_is_ipv4_mapped() {
        let gid = ipv4_gid(Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(
            gid.raw,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2]
        );
    }

    #[test]
    fn without_an_rdma_device_opening_says_so() {
        match open(None) {
            // A machine with an RNIC or rxe.
            Ok(_) => {}
            Err(RnicError::NoDevice | RnicError::NoLibrary(_)) => {}
            Err(e) => panic!("unexpected error: {e:?}"),
        }
        let err = open(Some("no-such-rdma-device"))
            .map(drop)
            .expect_err("unknown");
        assert!(
            matches!(
                err,
                RnicError::NoDevice | RnicError::NoLibrary(_) | RnicError::UnknownDevice { .. }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn mtus_round_trip() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_from_bytes(bytes).map(mtu_bytes), Some(bytes));
        }
        assert_eq!(mtu_from_bytes(1500), None);
    }
}
