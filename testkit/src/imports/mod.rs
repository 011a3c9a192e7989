//! Import cycles between the source files of a crate: two modules that each
//! name something of the other. Shared ids, constants and errors belong in a
//! leaf module both import, so that each file can be read after the files it
//! depends on.
//!
//! A module imports another when its code names a path into it: in a `use`
//! declaration or in an expression or type (`crate::a::f()`,
//! `store::Store::open`). A name that a module re-exports with `pub use`
//! counts as the module it comes from. Not counted: doc comments (a doc may
//! point to a module's users), test modules (modules named `tests`, which
//! exercise modules together), and a module's own submodules (a parent that
//! names its children and a child that names its parent's items are one
//! unit). Binary roots (`main.rs`, `src/bin/`) and modules that `#[path]`
//! moves are not followed.
//!
//! A crate keeps itself free of them with one test:
//!
//! ```no_run
//! #[test]
//! fn no_two_modules_import_each_other() {
//!     testkit::assert_no_import_cycles(env!("CARGO_MANIFEST_DIR"));
//! }
//! ```

mod refs;
mod tokens;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use refs::{Kind, Reference, references};

/// Why a crate's sources could not be scanned.
#[derive(Debug, thiserror::Error)]
pub enum ImportScanError {
    /// A directory under `src/` could not be listed.
    #[error("cannot list the source directory {path}: {source}")]
    ListDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A source file could not be read.
    #[error("cannot read the source file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A module's path inside its crate: `[]` for the crate root,
/// `["dedup", "store"]` for `src/dedup/store.rs`.
type ModulePath = Vec<String>;

/// One file naming another module, at its first place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The importing file, relative to the crate's directory.
    pub file: PathBuf,
    /// The 1-based line of the first path into the imported module.
    pub line: usize,
    /// The imported module, as `crate::a::b`.
    pub module: String,
}

/// Two modules that import each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportCycle {
    pub first: Import,
    pub second: Import,
}

impl fmt::Display for ImportCycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { first, second } = self;
        write!(
            f,
            "{}:{} imports {} and {}:{} imports {}",
            first.file.display(),
            first.line,
            first.module,
            second.file.display(),
            second.line,
            second.module
        )
    }
}

/// The pairs of modules of the crate at `crate_dir` (the directory of its
/// `Cargo.toml`) that import each other, in file order.
///
/// # Errors
///
/// When `crate_dir/src` or a file under it cannot be read.
pub fn import_cycles(crate_dir: &Path) -> Result<Vec<ImportCycle>, ImportScanError> {
    let files = source_files(crate_dir)?;
    let crate_map = CrateMap::new(&files);
    let mut edges: BTreeMap<(ModulePath, ModulePath), Import> = BTreeMap::new();
    for file in &files {
        for reference in &file.references {
            let in_tests = file
                .module
                .iter()
                .chain(&reference.inline)
                .any(|m| m == "tests");
            if in_tests {
                continue;
            }
            let Some(target) = crate_map.resolve(&file.module, reference) else {
                continue;
            };
            if !target.starts_with(&file.module) && !file.module.starts_with(&target) {
                edges
                    .entry((file.module.clone(), target.clone()))
                    .or_insert_with(|| Import {
                        file: file.path.clone(),
                        line: reference.line,
                        module: display_module(&target),
                    });
            }
        }
    }
    Ok(edges
        .iter()
        .filter(|((from, to), _)| from < to)
        .filter_map(|((from, to), first)| {
            let second = edges.get(&(to.clone(), from.clone()))?;
            Some(ImportCycle {
                first: first.clone(),
                second: second.clone(),
            })
        })
        .collect())
}

/// Fails the calling test when two modules of the crate at `crate_dir`
/// import each other, naming each pair with the lines that import.
///
/// # Panics
///
/// On a cycle, or when the crate's sources cannot be read.
#[track_caller]
pub fn assert_no_import_cycles(crate_dir: impl AsRef<Path>) {
    let cycles = import_cycles(crate_dir.as_ref()).unwrap_or_else(|e| panic!("{e}"));
    assert!(cycles.is_empty(), "{}", describe_cycles(&cycles));
}

/// The cycles one a line, with what to do about them; for a test's failure
/// message.
pub fn describe_cycles(cycles: &[ImportCycle]) -> String {
    let mut text = format!(
        "{} pair(s) of modules import each other; move what both need into a leaf module that both import:\n",
        cycles.len()
    );
    for cycle in cycles {
        text.push_str(&format!("  {cycle}\n"));
    }
    text
}

fn display_module(module: &[String]) -> String {
    std::iter::once("crate")
        .chain(module.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

/// A library source file and the paths it names.
#[derive(Debug)]
struct SourceFile {
    /// Relative to the crate's directory.
    path: PathBuf,
    module: ModulePath,
    references: Vec<Reference>,
}

/// Every library source file under `crate_dir/src`, in path order.
fn source_files(crate_dir: &Path) -> Result<Vec<SourceFile>, ImportScanError> {
    let mut found = Vec::new();
    let mut dirs = vec![crate_dir.join("src")];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ImportScanError::ListDir {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| ImportScanError::ListDir {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(crate_dir).unwrap_or(&path).to_path_buf();
                let Some(module) = module_of(&relative) else {
                    continue;
                };
                let source = std::fs::read_to_string(&path)
                    .map_err(|source| ImportScanError::Read { path, source })?;
                found.push(SourceFile {
                    path: relative,
                    module,
                    references: references(&source),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The module a file under `src/` holds; `None` for binary roots.
fn module_of(relative: &Path) -> Option<ModulePath> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .skip(1) // `src`
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [root] if root == "main" => return None,
        [bin, ..] if bin == "bin" => return None,
        [root] if root == "lib" => parts.clear(),
        [.., last] if last == "mod" => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts)
}

/// The crate's file modules and what each re-exports.
struct CrateMap {
    modules: BTreeSet<ModulePath>,
    /// (module, name) → the path the module re-exports under that name.
    reexports: HashMap<(ModulePath, String), Vec<String>>,
    /// module → the paths it re-exports with a glob (`pub use a::*`).
    glob_reexports: HashMap<ModulePath, Vec<Vec<String>>>,
}

/// How many re-exports a name is followed through before giving up.
const MAX_REEXPORT_HOPS: usize = 8;

impl CrateMap {
    fn new(files: &[SourceFile]) -> Self {
        let mut map = Self {
            modules: files.iter().map(|f| f.module.clone()).collect(),
            reexports: HashMap::new(),
            glob_reexports: HashMap::new(),
        };
        for file in files {
            for reference in &file.references {
                let Kind::Use {
                    public: true,
                    binds,
                } = &reference.kind
                else {
                    continue;
                };
                if !reference.inline.is_empty() {
                    continue;
                }
                let Some(absolute) = map.absolute(&file.module, &reference.segments) else {
                    continue;
                };
                match binds {
                    Some(name) => {
                        map.reexports
                            .insert((file.module.clone(), name.clone()), absolute);
                    }
                    None => map
                        .glob_reexports
                        .entry(file.module.clone())
                        .or_default()
                        .push(absolute),
                }
            }
        }
        map
    }

    /// The file module `reference` (named in `module`) leads into, if it
    /// leads into this crate.
    fn resolve(&self, module: &ModulePath, reference: &Reference) -> Option<ModulePath> {
        let mut context = module.clone();
        context.extend(reference.inline.iter().cloned());
        let absolute = self.absolute(&context, &reference.segments)?;
        Some(self.module_of_path(&absolute, MAX_REEXPORT_HOPS))
    }

    /// `segments`, named in `context`, as a path from the crate root
    /// (without `crate`); `None` when it does not start in this crate.
    fn absolute(&self, context: &ModulePath, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut path = match first.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => context.clone(),
            _ => {
                let mut child = self.file_module_prefix(context);
                child.push(first.clone());
                if !self.modules.contains(&child) {
                    return None;
                }
                return Some(
                    child
                        .into_iter()
                        .chain(segments[1..].iter().cloned())
                        .collect(),
                );
            }
        };
        let mut rest = segments;
        if first == "crate" || first == "self" {
            rest = &segments[1..];
        }
        while rest.first().is_some_and(|s| s == "super") {
            path.pop()?;
            rest = &rest[1..];
        }
        path.extend(rest.iter().cloned());
        Some(path)
    }

    /// The longest prefix of `path` that is a file module.
    fn file_module_prefix(&self, path: &[String]) -> ModulePath {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains(p))
            .unwrap_or_default()
    }

    /// The file module an absolute path names or names an item of,
    /// following re-exports at most `hops` times.
    fn module_of_path(&self, path: &[String], hops: usize) -> ModulePath {
        let module = self.file_module_prefix(path);
        let Some(name) = path.get(module.len()) else {
            return module;
        };
        if hops == 0 {
            return module;
        }
        if let Some(target) = self.reexports.get(&(module.clone(), name.clone())) {
            let mut target = target.clone();
            target.extend(path[module.len() + 1..].iter().cloned());
            return self.module_of_path(&target, hops - 1);
        }
        for glob in self.glob_reexports.get(&module).into_iter().flatten() {
            let mut target = glob.clone();
            target.extend(path[module.len()..].iter().cloned());
            let resolved = self.module_of_path(&target, hops - 1);
            if resolved != module {
                return resolved;
            }
        }
        module
    }
}

#[cfg(test)]
mod tests;
