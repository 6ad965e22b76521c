//! `longhaul-server`: the same as `longhaul serve`.

use clap::Parser;

fn main() {
    longhaul::alloc::keep_freed_buffers();
    let cli = longhaul_server::args::Cli::parse_from(longhaul_server::args::normalize_args(
        std::env::args(),
    ));
    if let Err(e) = longhaul_server::run(cli.serve) {
        eprintln!("error: {}", longhaul::errors::message(e.as_ref()));
        std::process::exit(1);
    }
}
