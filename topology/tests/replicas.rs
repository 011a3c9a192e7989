//! Replica sets: the placement rule, explicit places, and every refusal
//! with the region, the servers and the file it names.

use topology::{EnvOverrides, Layout, Topology};

const FILE: &str = "replicas.toml";

/// A server with two sockets, one PMEM device and one region on each.
fn server(id: &str, n: u8, domain: Option<&str>, region_extra: &str) -> String {
    let domain = domain.map_or(String::new(), |d| format!("domain = \"{d}\"\n"));
    format!(
        r#"
[[servers]]
id = "{id}"
{domain}
  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
      [[servers.sockets.devices.regions]]
      id = "P{id}.1"
      size = "4MiB"
      {region_extra}
  [[servers.sockets]]
  id = "1"
    [[servers.sockets.devices]]
    id = "pmem1"
      [[servers.sockets.devices.regions]]
      id = "P{id}.2"
      size = "4MiB"
  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "127.0.1.{n}:7000"
"#
    )
}

/// A topology of `servers` (id, domain, extra keys of its first region)
/// with `pool` keys, one fabric device reaching them all, one client.
fn topology(pool: &str, servers: &[(&str, Option<&str>, &str)]) -> String {
    let mut text = format!("[pool]\nname = \"r\"\nextent_size = \"2MiB\"\n{pool}\n");
    for (n, (id, domain, extra)) in servers.iter().enumerate() {
        text.push_str(&server(id, n as u8 + 1, *domain, extra));
    }
    let links: Vec<String> = servers
        .iter()
        .map(|(id, ..)| format!("{{ server = \"{id}\", nic = \"n0\" }}"))
        .collect();
    text.push_str(&format!(
        r#"
[[fabric_devices]]
id = "F"
ports = [{{ id = "p0", listen = "127.0.2.1:7100" }}]
links = [{}]

[[clients]]
id = "c1"
rnics = [{{ id = "r0", fabric_device = "F" }}]
"#,
        links.join(", ")
    ));
    text
}

fn load(text: &str) -> Topology {
    Topology::from_toml_str(FILE, text, &EnvOverrides::None).unwrap_or_else(|e| panic!("{e}"))
}

/// Each region's copies as `SERVER:SOCKET:DEVICE`, primary first.
fn places(t: &Topology) -> Vec<(String, Vec<String>)> {
    t.replica_sets()
        .iter()
        .map(|set| {
            let copies = set
                .replicas
                .iter()
                .map(|r| format!("{}:{}:{}", r.server, r.socket, r.device))
                .collect();
            (set.region.to_string(), copies)
        })
        .collect()
}

/// The one problem validation finds, as it is printed.
fn refusal(text: &str) -> String {
    let errors = load(text)
        .validate()
        .expect_err("the topology must be refused");
    assert_eq!(errors.problems.len(), 1, "{errors}");
    errors.problems[0].to_string()
}

fn default_text() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/default.toml"
    ))
    .expect("configs/default.toml")
}

#[test]
fn single_copy_topologies_are_unchanged() {
    let plain = load(&default_text());
    plain.validate().unwrap();
    assert!(!plain.is_replicated());
    assert!(plain.replica_sets().iter().all(|s| s.replicas.len() == 1));
    // The TOML written back (what a map edit stores) gains no key.
    let written = toml::to_string(&plain).unwrap();
    assert!(
        !written.contains("replicas") && !written.contains("domain"),
        "{written}"
    );
    // Replication does not move any address: same layout, same digest.
    let replicated =
        load(&default_text().replace("name = \"default\"", "name = \"default\"\nreplicas = 2"));
    replicated.validate().unwrap();
    assert!(replicated.is_replicated());
    assert_eq!(
        Layout::new(&plain).unwrap().digest(),
        Layout::new(&replicated).unwrap().digest()
    );
}

#[test]
fn backups_go_round_robin_to_the_next_servers_on_the_same_socket() {
    let t = load(&topology(
        "replicas = 2",
        &[("A", None, ""), ("B", None, ""), ("C", None, "")],
    ));
    t.validate().unwrap();
    let sets = places(&t);
    let of = |region: &str| sets.iter().find(|(r, _)| r == region).unwrap().1.clone();
    assert_eq!(of("PA.1"), ["A:0:pmem0", "B:0:pmem0"]);
    assert_eq!(of("PA.2"), ["A:1:pmem1", "B:1:pmem1"]);
    assert_eq!(of("PB.1"), ["B:0:pmem0", "C:0:pmem0"]);
    assert_eq!(of("PC.2"), ["C:1:pmem1", "A:1:pmem1"]);

    let three = load(&topology(
        "replicas = 3",
        &[("A", None, ""), ("B", None, ""), ("C", None, "")],
    ));
    three.validate().unwrap();
    let sets = places(&three);
    assert_eq!(sets[0].1, ["A:0:pmem0", "B:0:pmem0", "C:0:pmem0"]);
    assert_eq!(sets[4].1, ["C:0:pmem0", "A:0:pmem0", "B:0:pmem0"]);
}

#[test]
fn failure_domains_are_skipped_once_used() {
    let t = load(&topology(
        "replicas = 2",
        &[
            ("A", Some("rack-a"), ""),
            ("B", Some("rack-a"), ""),
            ("C", Some("rack-b"), ""),
        ],
    ));
    t.validate().unwrap();
    let sets = places(&t);
    // A's next server, B, shares rack-a: its backup goes to C.
    assert_eq!(sets[0].1, ["A:0:pmem0", "C:0:pmem0"]);
    assert_eq!(sets[2].1, ["B:0:pmem0", "C:0:pmem0"]);
    assert_eq!(sets[4].1, ["C:0:pmem0", "A:0:pmem0"]);
}

#[test]
fn a_region_may_name_its_backups_or_its_own_count() {
    let t = load(&topology(
        "",
        &[
            ("A", None, "replicas = [\"C:1\"]"),
            ("B", None, "replicas = 3"),
            ("C", None, ""),
        ],
    ));
    t.validate().unwrap();
    let sets = places(&t);
    assert_eq!(sets[0].1, ["A:0:pmem0", "C:1:pmem1"]);
    assert_eq!(sets[1].1, ["A:1:pmem1"]);
    assert_eq!(sets[2].1, ["B:0:pmem0", "C:0:pmem0", "A:0:pmem0"]);
    let device = load(&topology(
        "",
        &[("A", None, "replicas = [\"B:1:pmem1\"]"), ("B", None, "")],
    ));
    device.validate().unwrap();
    assert_eq!(places(&device)[0].1, ["A:0:pmem0", "B:1:pmem1"]);
}

#[test]
fn copy_counts_outside_one_to_three_are_refused() {
    let two = [("A", None, ""), ("B", None, "")];
    assert_eq!(
        refusal(&topology("replicas = 4", &two)),
        "replicas.toml: pool: replicas = 4 (the pool's): a region has 1, 2 or 3 copies"
    );
    assert_eq!(
        refusal(&topology(
            "",
            &[("A", None, "replicas = 0"), ("B", None, "")]
        )),
        "replicas.toml: region \"PA.1\": replicas = 0: a region has 1, 2 or 3 copies"
    );
    let many = "replicas = [\"B:0\", \"B:1\", \"B:0\"]";
    assert_eq!(
        refusal(&topology("", &[("A", None, many), ("B", None, "")])),
        "replicas.toml: region \"PA.1\": replicas = 4: a region has 1, 2 or 3 copies"
    );
}

#[test]
fn places_that_do_not_parse_or_do_not_exist_are_refused() {
    let with = |place: &str| {
        refusal(&topology(
            "",
            &[
                ("A", None, &format!("replicas = [\"{place}\"]")),
                ("B", None, ""),
            ],
        ))
    };
    assert_eq!(
        with("B"),
        "replicas.toml: region \"PA.1\": replica place \"B\" is not SERVER:SOCKET or \
         SERVER:SOCKET:DEVICE (such as \"B:0\")"
    );
    assert!(with("B::").contains("is not SERVER:SOCKET"));
    assert_eq!(
        with("Z:0"),
        "replicas.toml: region \"PA.1\": replica place \"Z:0\" names server \"Z\", which the \
         topology does not have"
    );
    assert!(
        with("B:7").contains("names socket \"7\" of server \"B\""),
        "{}",
        with("B:7")
    );
    assert!(
        with("B:0:pmem9").contains("names PMEM device \"pmem9\" of server \"B\" socket \"0\""),
        "{}",
        with("B:0:pmem9")
    );
}

#[test]
fn two_copies_on_one_server_are_refused_naming_it() {
    let text = topology("", &[("A", None, "replicas = [\"A:1\"]"), ("B", None, "")]);
    assert_eq!(
        refusal(&text),
        "replicas.toml: region \"PA.1\": two copies on server \"A\": each copy must be on a \
         server of its own (a server's death would take both)"
    );
    let twice = topology(
        "",
        &[
            ("A", None, "replicas = [\"B:0\", \"B:1\"]"),
            ("B", None, ""),
            ("C", None, ""),
        ],
    );
    assert!(refusal(&twice).contains("two copies on server \"B\""));
}

#[test]
fn two_copies_in_one_failure_domain_are_refused_naming_both_servers() {
    let text = topology(
        "",
        &[
            ("A", Some("rack-a"), "replicas = [\"B:0\"]"),
            ("B", Some("rack-a"), ""),
            ("C", None, ""),
        ],
    );
    assert_eq!(
        refusal(&text),
        "replicas.toml: region \"PA.1\": copies on servers \"A\" and \"B\" share failure domain \
         \"rack-a\": each copy must be in a domain of its own; name a server of another domain \
         or set its domain"
    );
}

#[test]
fn too_few_domains_for_the_copies_asked_are_refused_listing_them() {
    let text = topology(
        "replicas = 3",
        &[
            ("A", Some("rack-a"), ""),
            ("B", Some("rack-a"), ""),
            ("C", Some("rack-b"), ""),
        ],
    );
    let errors = load(&text).validate().unwrap_err();
    // Every region is named, each with the domains there are.
    assert_eq!(errors.problems.len(), 6, "{errors}");
    assert_eq!(
        errors.problems[0].to_string(),
        "replicas.toml: region \"PA.1\": needs 3 copies in 3 failure domains, but only 2 \
         domain(s) have a server with PMEM: \"rack-a\" (A, B), \"rack-b\" (C); add servers in \
         other domains, correct their domain, or lower replicas"
    );
    let single = topology("replicas = 2", &[("A", None, "")]);
    let errors = load(&single).validate().unwrap_err();
    assert!(errors.to_string().contains("only 1 domain(s)"), "{errors}");
}

#[test]
fn the_file_shape_of_replicas_is_checked() {
    let text = topology("", &[("A", None, "replicas = \"two\""), ("B", None, "")]);
    let err = Topology::from_toml_str(FILE, &text, &EnvOverrides::None).unwrap_err();
    assert!(
        err.to_string()
            .contains("replicas = \"two\": expected 1, 2 or 3 copies"),
        "{err}"
    );
    let text = topology("", &[("A", None, "replicas = [1]"), ("B", None, "")]);
    let err = Topology::from_toml_str(FILE, &text, &EnvOverrides::None).unwrap_err();
    assert!(
        err.to_string().contains("replicas #1: 1 is not a string"),
        "{err}"
    );
    let text = topology("replicas = -1", &[("A", None, ""), ("B", None, "")]);
    assert!(Topology::from_toml_str(FILE, &text, &EnvOverrides::None).is_err());
}

fn replicated_text() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/replicated.toml"
    ))
    .expect("configs/replicated.toml")
}

#[test]
fn owners_go_to_the_devices_in_turn_and_the_replicated_config_is_valid() {
    let t = load(&replicated_text());
    t.validate().unwrap_or_else(|e| panic!("{e}"));
    let owners: Vec<(String, String)> = t
        .default_owners()
        .into_iter()
        .map(|(region, owner)| (region.to_string(), owner.to_string()))
        .collect();
    let expected = [("PA.1", "A"), ("PA.2", "B"), ("PB.1", "A"), ("PB.2", "B")];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(r, o)| (r.to_string(), o.to_string()))
        .collect();
    assert_eq!(owners, expected);
    // Every copy of every region on both servers, in two domains.
    for (_, copies) in places(&t) {
        assert_eq!(copies.len(), 2, "{copies:?}");
    }
    // A single-copy topology has no owners.
    assert!(load(&default_text()).default_owners().is_empty());
}

#[test]
fn a_client_granted_a_replicated_region_must_reach_its_owner() {
    // c1 wired to device A only: PA.2 and PB.2 belong to B.
    let text = replicated_text().replace(
        "  { id = \"r1\", fabric_device = \"B\", local_addr = \"127.0.3.2\" },\n",
        "",
    );
    let errors = load(&text).validate().expect_err("c1 cannot reach B");
    let problems: Vec<String> = errors.problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    for (problem, region) in problems.iter().zip(["PA.2", "PB.2"]) {
        assert!(problem.contains(FILE), "{problem}");
        assert!(problem.contains(&format!("region {region:?}")), "{problem}");
        assert!(
            problem.contains("owner, fabric device \"B\"")
                && problem.contains("client \"c1\"")
                && problem.contains("wire one of the client's RNICs to \"B\""),
            "{problem}"
        );
    }
    // Granted only regions A owns: valid.
    let granted = text.replace(
        "[[clients]]\nid = \"c1\"\n",
        "[[clients]]\nid = \"c1\"\nallow = [{ region = \"PA.1\" }, { region = \"PB.1\" }]\n",
    );
    load(&granted).validate().unwrap_or_else(|e| panic!("{e}"));
    // The same wiring without replicas: nothing to reach.
    let single = text.replace("replicas = 2\n", "");
    load(&single).validate().unwrap_or_else(|e| panic!("{e}"));
}
