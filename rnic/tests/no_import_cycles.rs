//! The crate's modules form no import cycle: shared ids, constants and errors
//! live in leaf modules, so each file reads after the files it uses.

#[test]
fn no_two_modules_import_each_other() {
    testkit::assert_no_import_cycles(env!("CARGO_MANIFEST_DIR"));
}
