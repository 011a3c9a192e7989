//! `testbed`: command-line entry point.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use testbed::{DEFAULT_TOPOLOGY, DEFAULT_TOPOLOGY_NAME, summary};
use topology::{EnvOverrides, Layout, Topology};

/// Brings pmem-fabric topologies up on one machine, drives and checks them.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a topology file and print a summary with its address map.
    Validate {
        /// The topology file; the embedded default topology when absent.
        file: Option<PathBuf>,
    },
}

fn load(file: Option<&PathBuf>) -> Result<Topology, topology::LoadError> {
    match file {
        Some(path) => Topology::load(path),
        None => Topology::from_toml_str(
            DEFAULT_TOPOLOGY_NAME,
            DEFAULT_TOPOLOGY,
            &EnvOverrides::Process,
        ),
    }
}

/// Prints an error with its whole cause chain.
fn print_chain(err: &dyn std::error::Error) {
    eprint!("error: {err}");
    let mut source = err.source();
    while let Some(cause) = source {
        eprint!(": {cause}");
        source = cause.source();
    }
    eprintln!();
}

fn validate(file: Option<&PathBuf>) -> ExitCode {
    let topology = match load(file) {
        Ok(t) => t,
        Err(err) => {
            print_chain(&err);
            return ExitCode::FAILURE;
        }
    };
    if let Err(errors) = topology.validate() {
        eprintln!(
            "{}: invalid topology, {} problem(s):",
            topology.source,
            errors.problems.len()
        );
        for problem in &errors.problems {
            eprintln!("  {problem}");
        }
        return ExitCode::FAILURE;
    }
    match Layout::new(&topology) {
        Ok(layout) => {
            print!("{}", summary::render(&topology, &layout));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{}: invalid layout: {err}", topology.source);
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { file } => validate(file.as_ref()),
    }
}
