//! Reading a topology from TOML, with environment overrides.
//!
//! Values come from the file first, then from environment variables named
//! `PMEMFABRIC_<KEY>` with `__` between nesting levels, e.g.
//! `PMEMFABRIC_POOL__EXTENT_SIZE=4MiB` overrides `[pool] extent_size`.
//! The file and its overrides are checked against the model's shape first
//! ([`crate::schema`]), so that every problem is reported at once with its
//! line and column, or the variable that caused it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{Config, Environment, File, FileFormat};

use crate::model::{Override, Topology};
use crate::schema::{Checker, SchemaProblem};
use crate::tree;

/// The prefix of environment variables that override topology values.
pub const ENV_PREFIX: &str = "PMEMFABRIC";
/// The separator between nesting levels in an override's name.
pub const ENV_SEPARATOR: &str = "__";

/// A topology file could not be read or does not have the expected shape.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file does not exist or cannot be read.
    #[error("{file}: cannot read topology file")]
    Read {
        /// The file that was asked for.
        file: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The text is not TOML, or its keys and values do not have the
    /// model's shape: every problem found.
    #[error("{file}: invalid topology, {} problem(s):{}", problems.len(), list(problems))]
    Schema {
        /// The file (or embedded source name).
        file: String,
        /// Each problem, with where it was written.
        problems: Vec<SchemaProblem>,
    },
    /// The values do not fit the model in a way the shape check missed.
    #[error("{file}: invalid topology")]
    Parse {
        /// The file (or embedded source name).
        file: String,
        /// What the parser or the model rejected, naming the key.
        #[source]
        source: Box<config::ConfigError>,
    },
}

fn list(problems: &[SchemaProblem]) -> String {
    problems.iter().map(|p| format!("\n  {p}")).collect()
}

/// Where environment overrides come from.
#[derive(Debug, Clone, Default)]
pub enum EnvOverrides {
    /// The process environment.
    #[default]
    Process,
    /// An explicit set of variables (for tests and embedding).
    Vars(HashMap<String, String>),
    /// No overrides at all.
    None,
}

impl EnvOverrides {
    /// The variables that override topology keys (`PMEMFABRIC_…`), sorted
    /// by name.
    fn variables(&self) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = match self {
            Self::Process => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            Self::Vars(vars) => vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Self::None => Vec::new(),
        };
        let prefix = format!("{ENV_PREFIX}_").to_lowercase();
        vars.retain(|(k, _)| k.to_lowercase().starts_with(&prefix));
        vars.sort();
        vars
    }
}

/// The dotted key an override variable names (`pool.extent_size`).
fn override_key(var: &str) -> Vec<String> {
    let lower = var.to_lowercase();
    let key = &lower[ENV_PREFIX.len() + 1..];
    key.split(ENV_SEPARATOR).map(str::to_owned).collect()
}

/// Checks `text` and the overrides `vars` against the model's shape;
/// returns the overrides that apply.
fn check_shape(
    name: &str,
    text: &str,
    vars: &[(String, String)],
) -> Result<Vec<Override>, LoadError> {
    let mut checker = Checker::new(name, text, vars);
    let mut root = match tree::parse(text) {
        Ok(root) => root,
        Err((span, message)) => {
            let at = tree::At::Span(span);
            checker.report(
                &at,
                "topology",
                format!("not valid TOML: {}", message.trim().replace('\n', "; ")),
            );
            return Err(LoadError::Schema {
                file: name.to_owned(),
                problems: checker.check(&tree::Node {
                    value: tree::Value::Table(tree::Table::default()),
                    at,
                }),
            });
        }
    };
    let mut overrides = Vec::new();
    for (index, (var, value)) in vars.iter().enumerate() {
        let path = override_key(var);
        match tree::apply_override(&mut root, &path, value, index) {
            Ok(()) => overrides.push(Override {
                var: var.clone(),
                value: value.clone(),
                key: path.join("."),
            }),
            Err(e) => {
                let at = tree::At::Env(index);
                checker.report(&at, &e.key, e.message);
            }
        }
    }
    let problems = checker.check(&root);
    if problems.is_empty() {
        Ok(overrides)
    } else {
        Err(LoadError::Schema {
            file: name.to_owned(),
            problems,
        })
    }
}

impl Topology {
    /// Reads a topology file, applying overrides from the process environment.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        Self::load_with(path, &EnvOverrides::Process)
    }

    /// Reads a topology file with the given environment overrides.
    pub fn load_with(path: impl AsRef<Path>, env: &EnvOverrides) -> Result<Self, LoadError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&path.display().to_string(), &text, env)
    }

    /// Parses topology TOML held in memory; `name` is used in error messages.
    pub fn from_toml_str(name: &str, text: &str, env: &EnvOverrides) -> Result<Self, LoadError> {
        let vars = env.variables();
        let overrides = check_shape(name, text, &vars)?;
        let parse_err = |source| LoadError::Parse {
            file: name.to_owned(),
            source: Box::new(source),
        };
        let mut builder = Config::builder().add_source(File::from_str(text, FileFormat::Toml));
        let environment = Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("_")
            .separator(ENV_SEPARATOR)
            .try_parsing(true);
        builder = builder.add_source(environment.source(Some(vars.into_iter().collect())));
        let mut topology: Topology = builder
            .build()
            .and_then(Config::try_deserialize)
            .map_err(parse_err)?;
        topology.source = name.to_owned();
        topology.overrides = overrides;
        Ok(topology)
    }
}
