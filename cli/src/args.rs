//! Command-line flags shared by subcommands, named as llama.cpp names them.

/// llama.cpp spells some short flags with several letters (`-ngl`, `-ub`,
/// `-ctk`); clap takes one-letter shorts, so those are rewritten to their long
/// forms before parsing.
pub fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    const MULTI: [(&str, &str); 9] = [
        ("-ngl", "--n-gpu-layers"),
        ("-dev", "--device"),
        ("-ub", "--ubatch-size"),
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
        ("-fa", "--flash-attn"),
        ("-nr", "--no-repack"),
        ("-pg", "--pg"),
        ("-mmp", "--mmap"),
    ];
    args.map(|a| {
        for (short, long) in MULTI {
            if a == short {
                return long.to_string();
            }
            if let Some(rest) = a.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={rest}");
            }
        }
        a
    })
    .collect()
}

// The model, longhaul and sampling flags are shared with `longhaul serve`;
// they live in the server crate, which the CLI depends on.
pub use longhaul_server::args::{LonghaulArgs, ModelArgs, PlacementArgs, SampleArgs};
