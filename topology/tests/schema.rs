//! Problems with a topology file's shape: one fixture per message under
//! `tests/fixtures/schema`, each reported with its line and column, and
//! environment overrides blamed on their variable.

use std::collections::HashMap;
use std::path::PathBuf;

use topology::{EnvOverrides, LoadError, Topology};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema")
        .join(format!("{name}.toml"))
}

/// The shape problems of fixture `name`, each as `line:column: item: message`.
fn problems(name: &str) -> Vec<String> {
    problems_with(name, &EnvOverrides::None)
}

fn problems_with(name: &str, env: &EnvOverrides) -> Vec<String> {
    let path = fixture(name);
    let file = path.display().to_string();
    match Topology::load_with(&path, env) {
        Err(LoadError::Schema { problems, .. }) => problems
            .iter()
            .map(|p| {
                let text = p.to_string();
                text.strip_prefix(&format!("{file}:"))
                    .map(str::to_owned)
                    .unwrap_or(text)
            })
            .collect(),
        other => panic!("{name}: expected shape problems, got {other:?}"),
    }
}

fn vars(pairs: &[(&str, &str)]) -> EnvOverrides {
    EnvOverrides::Vars(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    )
}

#[test]
fn a_missing_key_is_named_by_the_ids_of_its_item() {
    assert_eq!(
        problems("missing-listen"),
        [
            "17:3: server \"A\" NIC \"n0\": listen is missing (an IP address and port such as \
             \"127.0.0.1:7000\")"
        ]
    );
}

#[test]
fn an_item_without_id_is_numbered() {
    assert_eq!(
        problems("missing-id"),
        ["6:1: server #1: id is missing (a name such as \"A\")"]
    );
}

#[test]
fn an_unknown_choice_lists_the_allowed_ones() {
    assert_eq!(
        problems("unknown-access"),
        ["30:38: client \"c1\" allow #1: access \"rw\": expected one of \"read-write\", \"read\""]
    );
    assert_eq!(
        problems("unknown-persistence"),
        [
            "8:15: server \"A\": persistence \"fsync\": expected one of \"auto\", \"dax\", \
             \"msync\", \"libpmem\", \"emulated\""
        ]
    );
}

#[test]
fn sizes_that_are_not_sizes_say_why() {
    assert_eq!(
        problems("negative-size"),
        ["15:14: region \"PA.1\": size: \"-64MiB\" is negative: a size counts bytes up from 0"]
    );
    assert_eq!(
        problems("fractional-size"),
        [
            "15:14: region \"PA.1\": size: \"1.5GiB\" is not a whole number of its unit; \
             write 1536MiB"
        ]
    );
    assert_eq!(
        problems("wrong-type"),
        ["15:14: region \"PA.1\": size = true: expected a size such as 65536 or \"64MiB\""]
    );
}

#[test]
fn a_misspelt_key_gets_the_nearest_known_one() {
    assert_eq!(
        problems("misspelt-key"),
        ["4:1: pool: unknown key \"extent_sise\"; did you mean \"extent_size\"?"]
    );
}

#[test]
fn a_decimal_size_gets_a_hint_from_validation() {
    let path = fixture("decimal-size");
    let topology = Topology::load_with(&path, &EnvOverrides::None).expect("the shape is right");
    let errors = topology
        .validate()
        .expect_err("64 MB is no extent multiple");
    assert_eq!(errors.problems.len(), 1, "{errors}");
    assert_eq!(
        errors.problems[0].to_string(),
        format!(
            "{}: region \"PA.1\": size 64000000 is not a multiple of the extent size 2MiB; \
             64MB is 64,000,000 bytes; did you mean 64MiB?",
            path.display()
        )
    );
}

#[test]
fn text_that_is_not_toml_gives_its_position() {
    let found = problems("not-toml");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("2:6: topology: not valid TOML: "),
        "{found:?}"
    );
}

#[test]
fn every_problem_is_reported_at_once_in_file_order() {
    assert_eq!(
        problems("many-problems"),
        [
            "4:1: pool: unknown key \"extent_sise\"; did you mean \"extent_size\"?",
            "15:14: region \"PA.1\": size: unknown unit \"parsecs\" (use B, KiB, MiB, GiB, TiB, \
             KB, MB, GB or TB)",
            "20:15: server \"A\" NIC \"n0\": transport \"udp\": expected one of \"tcp\", \"verbs\"",
            "24:10: fabric device \"A\" port \"p0\": listen is missing (an IP address and port \
             such as \"127.0.0.1:7000\")",
        ]
    );
}

#[test]
fn the_whole_list_is_in_the_error_once() {
    let err = Topology::load_with(fixture("many-problems"), &EnvOverrides::None)
        .expect_err("broken on purpose");
    let text = err.to_string();
    assert!(text.contains("invalid topology, 4 problem(s):"), "{text}");
    assert_eq!(text.matches("extent_sise").count(), 1, "{text}");
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
}

#[test]
fn an_unreadable_override_is_blamed_on_its_variable() {
    let found = problems_with(
        "env-base",
        &vars(&[("PMEMFABRIC_POOL__EXTENT_SIZE", "lots")]),
    );
    assert_eq!(
        found,
        [
            "environment variable PMEMFABRIC_POOL__EXTENT_SIZE=lots: pool: extent_size: \
             \"lots\" is not a number"
        ]
    );
    let found = problems_with(
        "env-base",
        &vars(&[("PMEMFABRIC_POOL__EXTENT_SIZ", "4MiB")]),
    );
    assert_eq!(
        found,
        [
            "environment variable PMEMFABRIC_POOL__EXTENT_SIZ=4MiB: pool: unknown key \
             \"extent_siz\"; did you mean \"extent_size\"?"
        ]
    );
    let found = problems_with("env-base", &vars(&[("PMEMFABRIC_SERVERS__ID", "B")]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "environment variable PMEMFABRIC_SERVERS__ID=B: servers.id: servers is a list, \
             not a table"
        ),
        "{found:?}"
    );
}

#[test]
fn an_override_the_regions_do_not_fit_is_reported_once_on_its_variable() {
    let path = fixture("env-base");
    let topology = Topology::load_with(&path, &vars(&[("PMEMFABRIC_POOL__EXTENT_SIZE", "4MiB")]))
        .expect("the shape is right");
    let errors = topology
        .validate()
        .expect_err("4MiB divides neither region");
    assert_eq!(errors.problems.len(), 1, "{errors}");
    assert_eq!(
        errors.problems[0].to_string(),
        "environment variable PMEMFABRIC_POOL__EXTENT_SIZE=4MiB: pool extent_size: extent \
         size 4MiB does not divide the size of region(s) \"PA.1\" (2MiB), \"PA.2\" (6MiB); \
         every region's size must be a multiple of the extent size"
    );

    let topology = Topology::load_with(&path, &vars(&[("PMEMFABRIC_POOL__EXTENT_SIZE", "3MiB")]))
        .expect("the shape is right");
    let errors = topology.validate().expect_err("3MiB is no power of two");
    assert_eq!(errors.problems.len(), 1, "{errors}");
    assert_eq!(
        errors.problems[0].to_string(),
        "environment variable PMEMFABRIC_POOL__EXTENT_SIZE=3MiB: pool: extent size 3MiB \
         (3145728 bytes) is not a non-zero power of two (such as 2MiB or 4MiB)"
    );
}

#[test]
fn every_schema_fixture_is_tested() {
    let source = include_str!("schema.rs");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema");
    for entry in std::fs::read_dir(dir).expect("the fixtures") {
        let path = entry.expect("an entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).expect("a name");
        assert!(
            source.contains(&format!("\"{name}\"")),
            "fixture {name} has no test"
        );
    }
}
