//! Reading a topology from TOML, with environment overrides.
//!
//! Values come from the file first, then from environment variables named
//! `PMEMFABRIC_<KEY>` with `__` between nesting levels, e.g.
//! `PMEMFABRIC_POOL__EXTENT_SIZE=4MiB` overrides `[pool] extent_size`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{Config, Environment, File, FileFormat};

use crate::model::Topology;

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
    /// The text is not TOML, or its values do not fit the model.
    #[error("{file}: invalid topology")]
    Parse {
        /// The file (or embedded source name).
        file: String,
        /// What the parser or the model rejected, naming the key.
        #[source]
        source: Box<config::ConfigError>,
    },
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
        let parse_err = |source| LoadError::Parse {
            file: name.to_owned(),
            source: Box::new(source),
        };
        let mut builder = Config::builder().add_source(File::from_str(text, FileFormat::Toml));
        let environment = Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("_")
            .separator(ENV_SEPARATOR)
            .try_parsing(true);
        builder = match env {
            EnvOverrides::Process => builder.add_source(environment),
            EnvOverrides::Vars(vars) => {
                builder.add_source(environment.source(Some(vars.clone().into_iter().collect())))
            }
            EnvOverrides::None => builder,
        };
        let mut topology: Topology = builder
            .build()
            .and_then(Config::try_deserialize)
            .map_err(parse_err)?;
        topology.source = name.to_owned();
        Ok(topology)
    }
}
