//! `pmemctl`: read, write and run atomics on a pmem-fabric pool from the
//! command line, and show the client's address map, paths and counters.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use client_vmm::Pool;
use topology::Topology;

use crate::ctl::{CliError, Ctl, Output, payload};

#[path = "pmemctl/ctl.rs"]
mod ctl;
#[path = "pmemctl/num.rs"]
mod num;
#[path = "pmemctl/show.rs"]
mod show;

const AFTER_HELP: &str = "\
Addresses and numbers are decimal (4096), hex (0x1000) or sizes (64MiB, 1TiB),
and may be summed: 1TiB+4MiB-100KiB. Addresses are virtual and absolute: the
pool's virtual space starts at 1TiB (0x10000000000), so `pmemctl read 1TiB 16`
reads the first 16 bytes of the pool; `pmemctl map` shows where every region
lies.

Example:
  pmemctl --config configs/default.toml --client c1 write 1TiB+64 hello --persist
  pmemctl --config configs/default.toml --client c1 read 1TiB 128";

/// Reads, writes and runs atomics on a pmem-fabric pool as one client of it.
#[derive(Debug, Parser)]
#[command(name = "pmemctl", version, after_help = AFTER_HELP)]
struct Cli {
    /// The topology file (the same one the daemons read).
    #[arg(long, value_name = "TOPOLOGY")]
    config: PathBuf,
    /// The client id to connect as (one of the topology's clients).
    #[arg(long, value_name = "ID")]
    client: String,
    /// How long one attempt on one path may take before it is re-sent on
    /// another path.
    #[arg(long, value_name = "MS")]
    attempt_timeout_ms: Option<u64>,
    /// How long a whole operation may take, retries included.
    #[arg(long, value_name = "MS")]
    op_timeout_ms: Option<u64>,
    /// How long connecting to one fabric device may take.
    #[arg(long, value_name = "MS")]
    connect_timeout_ms: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reads LEN bytes at ADDR: a hex dump on stdout (the offset column is
    /// the virtual address), or the raw bytes into a file.
    Read {
        /// Virtual address (1TiB is the first byte of the pool).
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// Bytes to read (4096, 0x1000, 4KiB).
        #[arg(value_parser = num::parse_number)]
        len: u64,
        /// Write the raw bytes to this file instead of dumping them.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Writes DATA (a UTF-8 string) or the bytes of FILE (`@FILE`) at ADDR.
    Write {
        /// Virtual address (1TiB is the first byte of the pool).
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// The text to write, `@FILE` for a file's bytes, or `@@…` for text
        /// that starts with `@`.
        #[arg(value_name = "DATA|@FILE")]
        data: String,
        /// Return only once the data is durable (WRITE_PERSIST).
        #[arg(long)]
        persist: bool,
    },
    /// Compare-and-swap of the 8-byte word at ADDR: sets it to NEW if it
    /// holds OLD; prints the old value and whether it swapped.
    Cas {
        /// Virtual address, 8-byte aligned.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// The value expected.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        old: u64,
        /// The value to store.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        new: u64,
    },
    /// Fetch-and-add on the 8-byte word at ADDR (wrapping; a negative DELTA
    /// subtracts); prints the old value.
    Faa {
        /// Virtual address, 8-byte aligned.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// What to add.
        #[arg(value_parser = num::parse_operand, allow_hyphen_values = true)]
        delta: u64,
    },
    /// Makes LEN bytes at ADDR durable.
    Flush {
        /// Virtual address.
        #[arg(value_parser = num::parse_number)]
        addr: u64,
        /// Bytes to flush.
        #[arg(value_parser = num::parse_number)]
        len: u64,
    },
    /// Shows the address map (every region's virtual and PMEM range) and
    /// each path's health.
    Map,
    /// Shows this client's counters (for this pmemctl's own connection) and
    /// a summary of its paths.
    Stat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // `pmemctl read … | head`: the reader left; nothing to report.
        Err(CliError::Stdout(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pmemctl: error: {}", e.message());
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), CliError> {
    // Read the input before connecting, so a bad file fails fast.
    let payload = match &cli.command {
        Command::Write { data, .. } => Some(payload(data)?),
        _ => None,
    };
    let topology = Topology::load(&cli.config)?;
    let mut builder = Pool::builder(topology, cli.client.as_str());
    if let Some(ms) = cli.attempt_timeout_ms {
        builder = builder.attempt_timeout(Duration::from_millis(ms));
    }
    if let Some(ms) = cli.op_timeout_ms {
        builder = builder.op_timeout(Duration::from_millis(ms));
    }
    if let Some(ms) = cli.connect_timeout_ms {
        builder = builder.connect_timeout(Duration::from_millis(ms));
    }
    let pool = builder.connect()?;
    let ctl = Ctl {
        pool: &pool,
        client: &cli.client,
    };
    let output = match cli.command {
        Command::Read { addr, len, out } => ctl.read(addr, len, out)?,
        Command::Write { addr, persist, .. } => {
            Output::Text(ctl.write(addr, &payload.unwrap_or_default(), persist)?)
        }
        Command::Cas { addr, old, new } => Output::Text(ctl.cas(addr, old, new)?),
        Command::Faa { addr, delta } => Output::Text(ctl.faa(addr, delta)?),
        Command::Flush { addr, len } => Output::Text(ctl.flush(addr, len)?),
        Command::Map => Output::Text(ctl.map()),
        Command::Stat => Output::Text(ctl.stat()),
    };
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    output
        .write_to(&mut stdout)
        .and_then(|()| stdout.flush())
        .map_err(CliError::Stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_the_start_of_the_virtual_space() {
        assert_eq!(client_vmm::VIRT_BASE, 1 << 40, "the help says 1TiB");
        assert!(AFTER_HELP.contains(&format!("({:#x})", client_vmm::VIRT_BASE)));
        assert_eq!(num::parse_number("1TiB"), Ok(client_vmm::VIRT_BASE));
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
