//! What each command does with a connected pool, and how it fails.

use std::io;
use std::path::PathBuf;

use pmem_client::{AllocError, OpenError, Pool, PoolError, ServerCache, VIRT_BASE, error_chain};
use topology::{ByteSize, LoadError, RegionId, VirtAddr};

use crate::show;

/// Why pmemctl failed; printed as one line with its causes.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("{what}")]
    Pool {
        /// What was being done.
        what: String,
        #[source]
        source: PoolError,
        /// Advice appended after the causes.
        hint: Option<String>,
    },
    #[error("{what}")]
    Alloc {
        /// What was being done.
        what: String,
        #[source]
        source: AllocError,
        /// Advice appended after the causes.
        hint: Option<String>,
    },
    #[error("{}: cannot read the data file", path.display())]
    ReadData {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot write the output file", path.display())]
    WriteOut {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An allocation that found no room, in the units it was asked in.
    #[error("{0}; `pmemctl df` shows what is free where")]
    NoRoom(String),
    /// A compare-and-swap whose word did not hold the expected value.
    #[error(
        "compare-and-swap at {addr:#x} did not swap: the word holds {}, not the expected {}",
        show::value(*found),
        show::value(*expected)
    )]
    NotSwapped {
        addr: u64,
        found: u64,
        expected: u64,
    },
    #[error("cannot write to stdout")]
    Stdout(#[source] io::Error),
    #[error(transparent)]
    Operator(#[from] pmem_client::operator::OperatorError),
    #[error(
        "{blocks} block(s) in {regions} region(s) no longer match their checksums: changed \
         without a write the server executed"
    )]
    Damaged { blocks: usize, regions: usize },
    /// `scrub --replicas --region R` for a region with one copy.
    #[error("region {0} is not replicated in the map (or not in it): it has no copies to compare")]
    NotReplicated(String),
    /// Copies differ and were not repaired.
    #[error(
        "{blocks} block(s) differ between copies{}; {}",
        if *undecided > 0 { format!(", {undecided} with no way to decide which copy is damaged") } else { String::new() },
        if *undecided > 0 {
            "those were not repaired, nothing of them overwritten"
        } else if *repair {
            "nothing was repaired"
        } else {
            "--repair (with --etcd) marks the damaged copies syncing"
        }
    )]
    CopiesDiffer {
        blocks: usize,
        undecided: usize,
        repair: bool,
    },
    /// `--repair` with a topology file.
    #[error(
        "--repair needs the map in etcd (--etcd URLS): a repair marks the damaged copy \
         syncing there; nothing was repaired"
    )]
    RepairNeedsEtcd,
    #[error("--client ID is needed for this command (one of the topology's clients)")]
    NoClient,
    #[error(
        "--config TOPOLOGY is needed for this command (the file the daemons read), or --etcd \
         URLS (or $PMEM_FABRIC_ETCD) to take the pool's map from etcd"
    )]
    NoConfig,
    #[error(transparent)]
    Map(#[from] control::MapSourceError),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
}

impl CliError {
    /// The exit status: 3 for a compare-and-swap that did not swap (the
    /// operation ran; its condition failed), 1 for every other failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotSwapped { .. } => 3,
            _ => 1,
        }
    }

    /// The whole message: causes, then any hint.
    pub fn message(&self) -> String {
        let mut text = error_chain(self);
        if let Self::Pool {
            hint: Some(hint), ..
        }
        | Self::Alloc {
            hint: Some(hint), ..
        } = self
        {
            text.push_str("; ");
            text.push_str(hint);
        }
        text
    }
}

/// The bytes `DATA|@FILE|@@TEXT` stands for.
pub fn payload(data: &str) -> Result<Vec<u8>, CliError> {
    if let Some(text) = data.strip_prefix("@@") {
        return Ok(format!("@{text}").into_bytes());
    }
    match data.strip_prefix('@') {
        Some(file) => {
            let path = PathBuf::from(file);
            std::fs::read(&path).map_err(|source| CliError::ReadData { path, source })
        }
        None => Ok(data.as_bytes().to_vec()),
    }
}

/// What a command prints on stdout.
#[derive(Debug)]
pub enum Output {
    /// Text as it is.
    Text(String),
    /// A hex dump of `data`, read at `base`, written line by line.
    Dump {
        /// The virtual address of the first byte.
        base: u64,
        /// The bytes.
        data: Vec<u8>,
    },
}

impl Output {
    /// Writes the output to `out`.
    pub fn write_to(&self, out: &mut impl io::Write) -> io::Result<()> {
        match self {
            Self::Text(text) => out.write_all(text.as_bytes()),
            Self::Dump { base, data } => show::write_hex_dump(out, *base, data),
        }
    }
}

/// A connected pool and what the commands do with it; each returns what to
/// print.
#[derive(Debug)]
pub struct Ctl<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// The client id, for headings.
    pub client: &'a str,
    /// Every client id of the topology, in order (an allocation's owner is
    /// an index into it).
    pub clients: &'a [String],
    /// Every server's id and admin address (for `stat`).
    pub servers: &'a [(String, Option<String>)],
}

impl Ctl<'_> {
    /// A failed operation, with a hint when the address is outside the pool.
    fn failed(&self, what: String, source: PoolError) -> CliError {
        let hint = matches!(source, PoolError::Unmapped { .. }).then(|| {
            let (start, len) = self.span();
            format!(
                "the pool's virtual space is {} ({}); `pmemctl map` shows every region",
                show::range(start, len),
                ByteSize(len)
            )
        });
        CliError::Pool { what, source, hint }
    }

    /// The start and length of the whole virtual space.
    fn span(&self) -> (u64, u64) {
        let regions = self.pool.regions();
        let start = regions
            .iter()
            .map(|(_, at, _)| at.get())
            .min()
            .unwrap_or(VIRT_BASE);
        let end = regions
            .iter()
            .map(|(_, at, len)| at.get().saturating_add(*len))
            .max()
            .unwrap_or(VIRT_BASE);
        (start, end.saturating_sub(start))
    }

    /// `read ADDR LEN [--out FILE]`.
    pub fn read(&self, addr: u64, len: u64, out: Option<PathBuf>) -> Result<Output, CliError> {
        let data = self
            .pool
            .read(VirtAddr(addr), len)
            .map_err(|e| self.failed(format!("read {len} bytes at {addr:#x}"), e))?;
        match out {
            None => Ok(Output::Dump { base: addr, data }),
            Some(path) => {
                std::fs::write(&path, &data).map_err(|source| CliError::WriteOut {
                    path: path.clone(),
                    source,
                })?;
                Ok(Output::Text(format!(
                    "read {} bytes at {} into {}\n",
                    data.len(),
                    show::range(addr, data.len() as u64),
                    path.display()
                )))
            }
        }
    }

    /// `write ADDR DATA [--persist] [--non-temporal]`, with the bytes DATA
    /// stands for and the server cache policy the flags ask for.
    pub fn write(
        &self,
        addr: u64,
        data: &[u8],
        persist: bool,
        cache: ServerCache,
    ) -> Result<String, CliError> {
        let len = data.len() as u64;
        let result = if persist {
            self.pool
                .write_persist_with_cache(VirtAddr(addr), data, cache)
        } else {
            self.pool.write_with_cache(VirtAddr(addr), data, cache)
        };
        result.map_err(|e| self.failed(format!("write {len} bytes at {addr:#x}"), e))?;
        Ok(format!(
            "wrote {len} bytes at {}{}\n",
            show::range(addr, len),
            if persist { ", persisted" } else { "" }
        ))
    }

    /// `cas ADDR OLD NEW`.
    pub fn cas(&self, addr: u64, old: u64, new: u64) -> Result<String, CliError> {
        let was = self
            .pool
            .compare_and_swap(VirtAddr(addr), old, new)
            .map(|swap| swap.unwrap_or_else(|actual| actual))
            .map_err(|e| self.failed(format!("compare-and-swap at {addr:#x}"), e))?;
        // It swapped exactly when the word held the expected value.
        if was != old {
            return Err(CliError::NotSwapped {
                addr,
                found: was,
                expected: old,
            });
        }
        Ok(format!(
            "swapped: old value {}, now {}\n",
            show::value(was),
            show::value(new)
        ))
    }

    /// `faa ADDR DELTA`.
    pub fn faa(&self, addr: u64, delta: u64) -> Result<String, CliError> {
        let was = self
            .pool
            .fetch_add(VirtAddr(addr), delta)
            .map_err(|e| self.failed(format!("fetch-and-add at {addr:#x}"), e))?;
        Ok(format!(
            "old value {}, new value {}\n",
            show::value(was),
            show::value(was.wrapping_add(delta))
        ))
    }

    /// `flush ADDR LEN`.
    pub fn flush(&self, addr: u64, len: u64) -> Result<String, CliError> {
        self.pool
            .flush(VirtAddr(addr), len)
            .map_err(|e| self.failed(format!("flush {len} bytes at {addr:#x}"), e))?;
        Ok(format!(
            "flushed {len} bytes at {}\n",
            show::range(addr, len)
        ))
    }

    /// `map`: regions, then paths.
    pub fn map(&self) -> String {
        let layout = self.pool.layout();
        let regions = self.pool.regions();
        let rows: Vec<Vec<String>> = regions
            .iter()
            .map(|(id, vstart, len)| {
                let entry = layout.entry_by_id(&RegionId::new(id.as_str()));
                let (server, socket, pmem) = entry.map_or_else(
                    || ("?".to_owned(), "?".to_owned(), "?".to_owned()),
                    |e| {
                        (
                            e.server.to_string(),
                            e.socket.to_string(),
                            show::range(e.start.get(), e.len),
                        )
                    },
                );
                vec![
                    id.clone(),
                    server,
                    socket,
                    show::range(vstart.get(), *len),
                    pmem,
                    ByteSize(*len).to_string(),
                ]
            })
            .collect();
        let (start, len) = self.span();
        let mut text = format!(
            "client {}: {} region{}, virtual space {} ({}), extent size {}\nlayout digest {}\n\n",
            self.client,
            regions.len(),
            if regions.len() == 1 { "" } else { "s" },
            show::range(start, len),
            ByteSize(len),
            ByteSize(layout.extent_size()),
            layout.digest_hex()
        );
        if self.pool.map_epoch() > 0 {
            text.insert_str(
                text.len() - 1,
                &format!("map epoch {} from etcd\n", self.pool.map_epoch()),
            );
        }
        text.push_str(&show::table(
            &["REGION", "SERVER", "SOCKET", "VIRTUAL", "PMEM", "SIZE"],
            &rows,
        ));
        text.push('\n');
        text.push_str(&self.path_table());
        text
    }

    /// Every path and its health, as a table.
    fn path_table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .pool
            .paths()
            .into_iter()
            .map(|p| {
                vec![
                    p.rnic,
                    p.transport.to_owned(),
                    p.device,
                    p.device_addr,
                    if p.up { "up" } else { "down" }.to_owned(),
                    p.outstanding.to_string(),
                ]
            })
            .collect();
        show::table(
            &[
                "RNIC",
                "TRANSPORT",
                "DEVICE",
                "ADDRESS",
                "STATE",
                "OUTSTANDING",
            ],
            &rows,
        )
    }

    /// `stat`: counters, then paths.
    pub fn stat(&self) -> String {
        let stats = self.pool.stats();
        let paths = self.pool.paths();
        let up = paths.iter().filter(|p| p.up).count();
        let mut text = format!(
            "client {} (counters of this pmemctl's connection)\n",
            self.client
        );
        text.push_str(&show::table(
            &["COUNTER", "VALUE"],
            &[
                vec!["requests".into(), stats.requests.to_string()],
                vec!["retries".into(), stats.retries.to_string()],
                vec!["failovers".into(), stats.failovers.to_string()],
                vec!["reconnects".into(), stats.reconnects.to_string()],
            ],
        ));
        text.push_str(&format!("\npaths: {up} of {} up\n", paths.len()));
        text.push_str(&self.path_table());
        text.push_str("\nservers (from their /metrics)\n");
        text.push_str(&self.server_table());
        text
    }

    /// Each server's persistence: the mechanism of its mappings, and for
    /// NICs on verbs how RDMA writes become durable, with its open queue
    /// pairs; read from the server's admin endpoint.
    fn server_table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .servers
            .iter()
            .map(|(id, admin)| {
                let Some(admin) = admin else {
                    return vec![id.clone(), "-".into(), "no admin address".into()];
                };
                let scraped = admin.parse().map_err(|e| format!("{e}")).and_then(|addr| {
                    telemetry::http_get(addr, "/metrics", std::time::Duration::from_secs(2))
                        .map_err(|e| format!("unreachable: {e}"))
                });
                let text = match scraped {
                    Ok((_, text)) => text,
                    Err(why) => return vec![id.clone(), admin.clone(), why],
                };
                vec![id.clone(), admin.clone(), persistence_summary(&text)]
            })
            .collect();
        show::table(&["SERVER", "ADMIN", "PERSISTENCE"], &rows)
    }
}

/// What a server's `/metrics` says of its persistence: the mechanism of its
/// mappings, how RDMA writes become durable on each NIC on verbs, and the
/// queue pairs open.
fn persistence_summary(metrics: &str) -> String {
    // The values of `label` on the samples of `name` set to 1.
    let labels = |name: &str, label: &str| -> Vec<String> {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.ends_with(" 1"))
            .filter_map(|l| l.split_once(&format!("{label}=\"")))
            .filter_map(|(_, rest)| rest.split_once('"').map(|(v, _)| v.to_owned()))
            .collect()
    };
    let mode = labels("pmem_server_persistence_mode{", "mode").join(",");
    let rdma: Vec<String> = labels("pmem_server_rdma_persistence{", "nic")
        .iter()
        .zip(labels("pmem_server_rdma_persistence{", "mode"))
        .map(|(nic, mode)| format!("{nic}: {mode}"))
        .collect();
    let qps = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pmem_server_queue_pairs "))
        .unwrap_or("-");
    format!(
        "mappings {}, RDMA {}, queue pairs {qps}",
        if mode.is_empty() { "-" } else { &mode },
        if rdma.is_empty() {
            "none (TCP only)".to_owned()
        } else {
            rdma.join(" ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::persistence_summary;

    #[test]
    fn a_servers_persistence_is_read_from_its_metrics() {
        let verbs = "pmem_server_persistence_mode{mode=\"dax\"} 1\n\
            pmem_server_persistence_mode{mode=\"devdax\"} 1\n\
            pmem_server_queue_pairs 4\n\
            pmem_server_rdma_persistence{nic=\"n1\",mode=\"flush\"} 1\n\
            pmem_server_rdma_persistence{nic=\"n2\",mode=\"apm\"} 1\n";
        assert_eq!(
            persistence_summary(verbs),
            "mappings dax,devdax, RDMA n1: flush n2: apm, queue pairs 4"
        );
        let tcp = "pmem_server_persistence_mode{mode=\"msync\"} 1\npmem_server_queue_pairs 0\n";
        assert_eq!(
            persistence_summary(tcp),
            "mappings msync, RDMA none (TCP only), queue pairs 0"
        );
        assert_eq!(
            persistence_summary(""),
            "mappings -, RDMA none (TCP only), queue pairs -"
        );
    }
}
