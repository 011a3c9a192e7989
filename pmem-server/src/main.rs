//! `pmem-server`: the daemon; everything lives in [`pmem_server::cli`].

fn main() -> std::process::ExitCode {
    pmem_server::cli::main_with_args(std::env::args_os())
}
