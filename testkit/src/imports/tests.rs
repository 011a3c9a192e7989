use super::*;

/// Writes a crate of `files` (path under the crate directory, text) and
/// returns its cycles as text, one line each.
fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dirs");
        std::fs::write(path, text).expect("write source");
    }
    import_cycles(dir.path())
        .expect("scan")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn siblings_that_use_each_other_are_a_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::Id;\npub fn f(_: Id) {}\n"),
        ("src/b.rs", "pub struct Id;\n\nfn g() { crate::a::f(Id) }\n"),
    ]);
    assert_eq!(
        found,
        ["src/a.rs:1 imports crate::b and src/b.rs:3 imports crate::a"]
    );
}

#[test]
fn a_shared_leaf_module_is_no_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod ids;\n"),
        ("src/ids.rs", "pub struct Id;\n"),
        ("src/a.rs", "use crate::ids::Id;\nuse crate::b::g;\n"),
        ("src/b.rs", "use crate::ids::Id;\npub fn g(_: Id) {}\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_name_reexported_at_the_root_counts_as_its_module() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;\npub use b::{Id as Ident};\n"),
        ("src/a.rs", "use crate::Ident;\npub fn f() {}\n"),
        ("src/b.rs", "pub struct Id;\n\nfn g() { crate::a::f() }\n"),
    ]);
    assert_eq!(
        found,
        ["src/a.rs:1 imports crate::b and src/b.rs:3 imports crate::a"]
    );
}

#[test]
fn a_child_using_its_parent_that_uses_it_is_no_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod dedup;\n"),
        (
            "src/dedup/mod.rs",
            "mod store;\npub const WINDOW: u64 = 8;\nfn open() { store::Store::open() }\n",
        ),
        (
            "src/dedup/store.rs",
            "use super::WINDOW;\npub struct Store;\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn children_of_one_parent_that_use_each_other_are_a_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod peers;\n"),
        ("src/peers/mod.rs", "mod procfs;\nmod process;\n"),
        (
            "src/peers/procfs.rs",
            "use super::process::Pid;\npub fn stat() {}\n",
        ),
        (
            "src/peers/process.rs",
            "pub struct Pid;\nfn cpu() { super::procfs::stat() }\n",
        ),
    ]);
    assert_eq!(
        found,
        [
            "src/peers/process.rs:2 imports crate::peers::procfs and src/peers/procfs.rs:1 imports crate::peers::process"
        ]
    );
}

#[test]
fn tests_of_a_module_and_relative_paths_in_them_are_no_cycle() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod dedup;\nmod other;\n"),
        (
            "src/dedup/mod.rs",
            "mod store;\npub use store::Store;\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "src/dedup/store.rs",
            "pub struct Store;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        (
            "src/dedup/tests.rs",
            "use super::*;\nfn t() { let _ = Store; }\n",
        ),
        (
            "src/other.rs",
            "mod inner {\n    use super::super::dedup::Store;\n}\n",
        ),
        ("src/main.rs", "use crate::other; fn main() {}\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn strings_comments_docs_and_tests_name_nothing() {
    let found = cycles_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::Id;\n#[cfg(test)]\nmod tests;\n"),
        ("src/a/tests.rs", "use crate::b::Id;\n"),
        (
            "src/b.rs",
            "pub struct Id;\n// crate::a::f\nconst S: &str = \"crate::a::f\";\n/// Used by [`crate::a`].\nfn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n}\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_missing_source_directory_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error = import_cycles(dir.path()).expect_err("no src directory");
    assert!(matches!(error, ImportScanError::ListDir { .. }));
    assert!(error.to_string().contains("src"), "{error}");
}
