//! Every shipped config validates; every broken fixture produces its error.

use std::path::PathBuf;

use topology::{EnvOverrides, Layout, LoadError, ProblemKind, Topology};

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn load(rel: &str) -> Topology {
    let path = configs().join(rel);
    Topology::load_with(&path, &EnvOverrides::None)
        .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()))
}

#[test]
fn shipped_configs_are_valid() {
    for name in ["default.toml", "single.toml", "fig4a.toml", "lab.toml"] {
        let topology = load(name);
        if let Err(errors) = topology.validate() {
            panic!("{name}: {errors}");
        }
        Layout::new(&topology).unwrap();
    }
}

#[test]
fn every_shipped_config_has_the_right_shape() {
    for entry in std::fs::read_dir(configs()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Topology::load_with(&path, &EnvOverrides::None)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

#[test]
fn a_written_topology_reads_back_through_the_shape_check() {
    for name in ["default.toml", "fig4a.toml", "alloc.toml", "lab.toml"] {
        let mut topology = load(name);
        for client in &mut topology.clients {
            client.allow.push(topology::AllowRange {
                region: "PA.1".into(),
                offset: topology::ByteSize(0),
                size: None,
                access: topology::Access::Read,
            });
        }
        // Every optional key set, so that each is written and read back.
        topology.pool.region_alignment = Some(topology::ByteSize(4 << 20));
        topology.pool.allocator = Some(topology::AllocatorConfig {
            metadata_region: Some("PA.1".into()),
            page_table_entries: Some(64),
            names: Some(16),
        });
        for server in &mut topology.servers {
            server.data_dir = Some("/var/lib/pmem".into());
            server.persistence = topology::Persistence::Msync;
            for socket in &mut server.sockets {
                for device in &mut socket.devices {
                    device.path = Some(format!("/mnt/{}", device.id));
                    for region in &mut device.regions {
                        region.cache = topology::CachePolicy::NonTemporal;
                    }
                }
            }
            for nic in &mut server.nics {
                nic.transport = topology::NicTransport::Verbs;
                nic.rdma_device = Some("rxe0".into());
            }
        }
        for device in &mut topology.fabric_devices {
            for port in &mut device.ports {
                port.roce = Some(topology::RocePort {
                    interface: "veth0".into(),
                    ip: "10.0.0.1".into(),
                    mtu: 1024,
                });
            }
        }
        for client in &mut topology.clients {
            for rnic in &mut client.rnics {
                rnic.port = Some("p0".into());
                rnic.transport = topology::RnicTransport::Roce;
                rnic.rdma_device = Some("rxe0".into());
            }
        }
        let text = toml::to_string(&topology).expect("serializes");
        let back = Topology::from_toml_str(name, &text, &EnvOverrides::None)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(back.pool, topology.pool, "{name}");
        assert_eq!(back.servers, topology.servers, "{name}");
        assert_eq!(back.fabric_devices, topology.fabric_devices, "{name}");
        assert_eq!(back.clients, topology.clients, "{name}");
    }
}

#[test]
fn fig4a_has_the_seed_counts() {
    let t = load("fig4a.toml");
    assert_eq!(t.clients.len(), 9);
    assert_eq!(t.fabric_devices.len(), 3);
    assert_eq!(t.servers.len(), 6);
    assert_eq!(t.regions().count(), 36);
    for client in &t.clients {
        assert_eq!(client.rnics.len(), 3, "client {}", client.id);
    }
    for server in &t.servers {
        assert_eq!(server.sockets.len(), 2);
        for socket in &server.sockets {
            assert_eq!(socket.devices.len(), 3);
        }
    }
}

#[test]
fn fig4a_without_one_link_names_device_and_server() {
    let mut t = load("fig4a.toml");
    let device = &mut t.fabric_devices[1];
    let removed = device.links.remove(2);
    let errors = t.validate().unwrap_err();
    assert_eq!(errors.problems.len(), 1, "{errors}");
    let problem = &errors.problems[0];
    assert_eq!(
        problem.kind,
        ProblemKind::MissingLink {
            server: removed.server.clone()
        }
    );
    let text = problem.to_string();
    assert!(text.contains("fabric device \"B\""), "{text}");
    assert!(text.contains("server \"C\""), "{text}");
    assert!(text.contains("fig4a.toml"), "{text}");
}

/// An invalid fixture's name, the item its first problem names, and a check
/// of that problem's kind.
type Expectation = (&'static str, &'static str, fn(&ProblemKind) -> bool);

fn expectations() -> Vec<Expectation> {
    vec![
        ("duplicate-id", "region \"PA.1\"", |k| {
            *k == ProblemKind::DuplicateId
        }),
        (
            "unknown-reference",
            "fabric device \"A\" link #2 (Z/n0)",
            |k| matches!(k, ProblemKind::UnknownReference { kind: "server", id } if id == "Z"),
        ),
        (
            "bad-extent-size",
            "pool",
            |k| matches!(k, ProblemKind::BadExtentSize { size } if *size == 3 << 20),
        ),
        ("zero-size", "region \"PA.1\"", |k| {
            *k == ProblemKind::ZeroSize
        }),
        ("replicas-share-domain", "region \"PA.1\"", |k| {
            matches!(
                k,
                ProblemKind::Replicas(topology::PlacementProblem::SameDomain { domain, .. })
                    if domain == "rack-a"
            )
        }),
        ("size-not-extent-multiple", "region \"PA.1\"", |k| {
            matches!(k, ProblemKind::SizeNotExtentMultiple { .. })
        }),
        ("address-misaligned", "region \"PA.1\"", |k| {
            matches!(
                k,
                ProblemKind::AddressMisaligned {
                    address: 0x1_0000_1000,
                    ..
                }
            )
        }),
        (
            "address-overlap",
            "region \"PA.2\"",
            |k| matches!(k, ProblemKind::AddressOverlap { other } if other.as_str() == "PA.1"),
        ),
        ("address-overflow", "region \"PA.1\"", |k| {
            *k == ProblemKind::AddressOverflow
        }),
        (
            "missing-link",
            "fabric device \"B\"",
            |k| matches!(k, ProblemKind::MissingLink { server } if server.as_str() == "A"),
        ),
        (
            "rnic-unreachable",
            "client \"c1\" RNIC \"r0\"",
            |k| matches!(k, ProblemKind::RnicUnreachable { device } if device.as_str() == "Q"),
        ),
        ("no-ports", "fabric device \"A\"", |k| {
            *k == ProblemKind::NoPorts
        }),
        ("no-rnics", "client \"c1\"", |k| *k == ProblemKind::NoRnics),
        ("no-nics", "server \"A\"", |k| *k == ProblemKind::NoNics),
        ("empty", "topology", |k| {
            matches!(k, ProblemKind::Empty { what: "clients" })
        }),
        ("unsafe-region-id", "region \"../PA.1\"", |k| {
            matches!(k, ProblemKind::UnsafeRegionId)
        }),
        (
            "duplicate-device-path",
            "server \"A\" socket \"1\" PMEM device \"pmem1\"",
            |k| {
                matches!(k, ProblemKind::DuplicateDevicePath { path, other }
                    if path == "/dev/dax0.0/"
                        && other == "server \"A\" socket \"0\" PMEM device \"pmem0\"")
            },
        ),
        (
            "relative-device-path",
            "server \"A\" socket \"0\" PMEM device \"pmem0\"",
            |k| matches!(k, ProblemKind::RelativeDevicePath { path } if path == "mnt/pmem0"),
        ),
        ("roce-rnic-address", "client \"c1\" RNIC \"r0\"", |k| {
            matches!(k, ProblemKind::RoceRnicAddress)
        }),
        ("roce-rnic-port", "client \"c1\" RNIC \"r0\"", |k| {
            matches!(k, ProblemKind::RoceRnicPort)
        }),
        ("verbs-nic-address", "server \"A\" NIC \"n0\"", |k| {
            matches!(k, ProblemKind::VerbsNicAddress)
        }),
        (
            "verbs-link-without-roce",
            "fabric device \"A\" link #1 (A/n0)",
            |k| matches!(k, ProblemKind::VerbsLinkWithoutRoce),
        ),
        (
            "bad-roce-address",
            "fabric device \"A\" port \"p0\" roce",
            |k| matches!(k, ProblemKind::BadAddress { address, .. } if address == "fe80::1"),
        ),
        (
            "bad-address",
            "server \"A\" NIC \"n0\"",
            |k| matches!(k, ProblemKind::BadAddress { address, .. } if address == "server-a:seven-thousand"),
        ),
        (
            "duplicate-listen",
            "fabric device \"A\" port \"p0\"",
            |k| matches!(k, ProblemKind::DuplicateListen { other, .. } if other == "server \"A\" NIC \"n0\""),
        ),
        ("allow-out-of-range", "client \"c1\" allow #1", |k| {
            matches!(k, ProblemKind::AllowOutOfRange { .. })
        }),
        ("allocator-too-large", "pool.allocator", |k| {
            matches!(
                k,
                ProblemKind::AllocatorMetadata(topology::MetaError::MetadataTooLarge { .. })
            )
        }),
        (
            "allocator-unknown-region",
            "pool.allocator",
            |k| matches!(k, ProblemKind::UnknownReference { kind: "region", id } if id == "PA.9"),
        ),
    ]
}

#[test]
fn every_invalid_fixture_reports_its_problem() {
    let dir = configs().join("test-fixtures/invalid");
    let expected = expectations();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), expected.len(), "one expectation per fixture");
    for (name, item, is_kind) in expected {
        let path = dir.join(format!("{name}.toml"));
        let t = Topology::load_with(&path, &EnvOverrides::None)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let errors = t.validate().expect_err(name);
        let first = &errors.problems[0];
        assert_eq!(first.item, item, "{name}: {errors}");
        assert!(is_kind(&first.kind), "{name}: {errors}");
        assert!(
            first.file.ends_with(&format!("{name}.toml")),
            "{name}: {first}"
        );
        assert!(first.to_string().starts_with(&first.file), "{first}");
    }
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let mut t = load("default.toml");
    t.clients[0].rnics.clear();
    t.fabric_devices[0].links.clear();
    t.servers[1].sockets[0].devices[0].regions[0].size = topology::ByteSize(3 << 20);
    let errors = t.validate().unwrap_err();
    let kinds: Vec<_> = errors.problems.iter().map(|p| &p.kind).collect();
    assert!(kinds.contains(&&ProblemKind::NoRnics), "{errors}");
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, ProblemKind::SizeNotExtentMultiple { .. })),
        "{errors}"
    );
    let missing = kinds
        .iter()
        .filter(|k| matches!(k, ProblemKind::MissingLink { .. }))
        .count();
    assert_eq!(missing, 2, "{errors}");
}

#[test]
fn unparsable_fixtures_fail_with_file_and_key() {
    let dir = configs().join("test-fixtures/unparsable");
    let cases = [
        ("not-toml", ""),
        ("unknown-field", "extent_sise"),
        ("bad-size", "parsecs"),
        ("wrong-type", "servers"),
    ];
    for (name, needle) in cases {
        let path = dir.join(format!("{name}.toml"));
        let err = Topology::load_with(&path, &EnvOverrides::None).expect_err(name);
        assert!(matches!(err, LoadError::Schema { .. }), "{name}: {err:?}");
        let chain = err.to_string();
        assert!(chain.contains(&format!("{name}.toml")), "{chain}");
        assert!(chain.contains(needle), "{name}: {chain}");
    }
}

#[test]
fn missing_file_names_it() {
    let err = Topology::load_with("/nonexistent/topology.toml", &EnvOverrides::None).unwrap_err();
    assert!(matches!(err, LoadError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/topology.toml"));
}

#[test]
fn environment_overrides_apply() {
    let path = configs().join("default.toml");
    let vars = [
        ("PMEMFABRIC_POOL__EXTENT_SIZE", "4MiB"),
        ("PMEMFABRIC_POOL__NAME", "overridden"),
        ("UNRELATED", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let t = Topology::load_with(&path, &EnvOverrides::Vars(vars)).unwrap();
    assert_eq!(t.pool.extent_size.bytes(), 4 << 20);
    assert_eq!(t.pool.name, "overridden");
    assert_eq!(t.servers.len(), 2, "the file's other values stay");
}

#[test]
fn default_routes_prefer_same_socket() {
    let t = load("default.toml");
    let paths = t.routes(&"c1".into(), &"PB.2".into());
    // Two RNICs × two links to server B each.
    assert_eq!(paths.len(), 4);
    assert!(paths[0].same_socket && paths[1].same_socket);
    assert!(!paths[2].same_socket && !paths[3].same_socket);
    assert_eq!(paths[0].rnic.as_str(), "r0");
    assert_eq!(paths[0].server_nic.as_str(), "n1");
    assert_eq!(paths[1].rnic.as_str(), "r1");
    assert!(paths.iter().all(|p| p.server.as_str() == "B"));
}

#[test]
fn fig4a_routes_fall_back_across_sockets() {
    let t = load("fig4a.toml");
    // PC.5 sits on server C's socket 1. Device A reaches only
    // C's socket-0 NIC, device B only socket 1, device C (odd-indexed server)
    // socket 0.
    let paths = t.routes(&"A".into(), &"PC.5".into());
    let summary: Vec<_> = paths
        .iter()
        .map(|p| {
            (
                p.fabric_device.as_str(),
                p.server_nic.as_str(),
                p.same_socket,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![("B", "n1", true), ("A", "n0", false), ("C", "n0", false)]
    );
    assert!(t.routes(&"nobody".into(), &"PC.5".into()).is_empty());
    assert!(t.routes(&"A".into(), &"PZ.9".into()).is_empty());
}

#[test]
fn device_paths_are_checked_per_server() {
    let mut t = load("default.toml");
    // Each server is its own machine: the same path on two is fine.
    for server in &mut t.servers {
        server.sockets[0].devices[0].path = Some("/dev/dax0.0".into());
    }
    t.validate().unwrap();
    // Two devices of one server on the same memory are not.
    let server = &mut t.servers[0];
    let last = server.sockets.len() - 1;
    let device = server.sockets[last].devices.last_mut().unwrap();
    device.path = Some("/dev/./dax0.0".into());
    let errors = t.validate().unwrap_err();
    assert_eq!(errors.problems.len(), 1, "{errors}");
    let text = errors.problems[0].to_string();
    assert!(text.contains("is already used by server"), "{text}");
    assert!(text.starts_with(&t.source), "{text}");
}
