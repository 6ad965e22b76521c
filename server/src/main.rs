//! `longhaul-server`: the same as `longhaul serve`.

use clap::Parser;

fn main() {
    longhaul::alloc::keep_freed_buffers();
    let args = match longhaul_server::args::server_args(std::env::args().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let cli = longhaul_server::args::Cli::parse_from(args);
    if let Err(e) = longhaul_server::run(cli.serve) {
        eprintln!("error: {}", longhaul::errors::message(e.as_ref()));
        std::process::exit(1);
    }
}
