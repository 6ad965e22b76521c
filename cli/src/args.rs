//! Command-line flags shared by subcommands, named as llama.cpp names them.

/// llama.cpp spells some short flags with several letters (`-ngl`, `-ub`,
/// `-ctk`); clap takes one-letter shorts, so those are rewritten to their long
/// forms before parsing: the server's (shared model flags), then bench's.
pub fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    longhaul_server::args::rewrite_short_flags(
        longhaul_server::args::normalize_args(args).into_iter(),
        &[
            ("-nr", "--no-repack"),
            ("-pg", "--pg"),
            ("-mmp", "--mmap"),
        ],
    )
}

// The model, longhaul and sampling flags are shared with `longhaul serve`;
// they live in the server crate, which the CLI depends on.
pub use longhaul_server::args::{LonghaulArgs, ModelArgs, PlacementArgs, SampleArgs};
