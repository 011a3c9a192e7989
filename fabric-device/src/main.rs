//! `fabric-device`: the daemon; everything lives in [`fabric_device::cli`].

fn main() -> std::process::ExitCode {
    fabric_device::cli::main_with_args(std::env::args_os())
}
