//! The command-line flags by which a daemon says where its map comes from
//! (`--config` or `--etcd`, with `--etcd-credentials` and `--pool`), for a
//! daemon's clap parser to flatten (feature `clap`).

use std::path::PathBuf;

use crate::endpoints::Endpoints;
use crate::registration::{MapSource, MapSourceError};

/// Where a daemon takes its map from, as its command line says it.
#[derive(Debug, Clone, clap::Args)]
pub struct MapFlags {
    /// The topology file (or --etcd). A fabric device re-reads it on SIGHUP.
    #[arg(long, required_unless_present = "etcd", conflicts_with = "etcd")]
    pub config: Option<PathBuf>,
    /// Take the map from etcd instead of a file, and keep this daemon's
    /// liveness record there: etcd's client URLs, comma-separated
    /// (http://h1:2379,http://h2:2379). The map is read at start and
    /// followed while the daemon runs.
    #[arg(long, value_name = "URLS", env = "PMEM_FABRIC_ETCD")]
    pub etcd: Option<Endpoints>,
    /// The file of this daemon's etcd user, one line `user:password`, mode
    /// 600 (when etcd has authentication on; never the password itself on
    /// the command line).
    #[arg(
        long,
        value_name = "FILE",
        env = "PMEM_FABRIC_ETCD_CREDENTIALS",
        requires = "etcd"
    )]
    pub etcd_credentials: Option<PathBuf>,
    /// The pool whose map to take from etcd (its `[pool] name`).
    #[arg(
        long,
        value_name = "NAME",
        requires = "etcd",
        default_value = "default"
    )]
    pub pool: String,
}

impl MapFlags {
    /// The source these flags name, the credentials file read when given
    /// ([`MapSource::from_flags`]).
    ///
    /// # Errors
    ///
    /// When the credentials file cannot be read or is not
    /// `user:password` with mode 600.
    pub fn source(&self) -> Result<MapSource, MapSourceError> {
        MapSource::from_flags(
            self.config.clone(),
            self.etcd.clone(),
            &self.pool,
            self.etcd_credentials.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Daemon {
        #[command(flatten)]
        map: MapFlags,
    }

    fn parse(args: &[&str]) -> Result<MapFlags, clap::Error> {
        Daemon::try_parse_from(std::iter::once("daemon").chain(args.iter().copied())).map(|d| d.map)
    }

    #[test]
    fn a_file_or_etcd_is_required_and_not_both() {
        let file = parse(&["--config", "t.toml"]).expect("a file");
        assert!(matches!(file.source(), Ok(MapSource::File(p)) if p.as_os_str() == "t.toml"));
        let etcd = parse(&["--etcd", "http://h1:2379", "--pool", "p1"]).expect("etcd");
        assert!(matches!(etcd.source(), Ok(MapSource::Etcd { pool, .. }) if pool == "p1"));
        assert!(parse(&[]).is_err());
        assert!(parse(&["--config", "t.toml", "--etcd", "http://h1:2379"]).is_err());
    }

    #[test]
    fn the_pool_is_default_unless_named() {
        let etcd = parse(&["--etcd", "http://h1:2379"]).expect("etcd");
        assert_eq!(etcd.pool, "default");
    }
}
