//! The `testbed` command line: its types ([`args`]) and one function per
//! command, grouped by what the commands do; `main.rs` only parses and
//! dispatches.
//!
//! - [`args`]: the commands and their options (clap).
//! - [`fabric`]: `validate`, `up`, `restart`, `status`, `keygen`, `down`, `map-follow`.
//! - [`run`](mod@run): `run`, `chaos`, `demo`, `check-linearizable`.
//! - [`bench`](mod@bench): `bench`, `bench-roce`, `bench-verbs`, `bench-persist`, `power-cut`.
//! - [`worker`]: `worker`, one client process of a run.

pub mod args;
pub mod bench;
pub mod fabric;
pub mod run;
pub mod worker;

use std::process::ExitCode;

pub use args::{Cli, Command, log_id};

/// Prints an error with its whole cause chain.
pub fn print_chain(err: &dyn std::error::Error) {
    eprintln!("error: {}", telemetry::logging::error_chain(err));
}

/// The exit code of a command that answers whether it passed.
pub fn outcome(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("testbed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
