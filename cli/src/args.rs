//! Command-line flags shared by subcommands, named as llama.cpp names them.

use longhaul_server::flags::{self, FlagError};

/// The command line (`args`, the program name first) with llama.cpp's
/// spellings rewritten by the spelling table ([`longhaul_server::flags`])
/// for the subcommand it names. `run`, `chat` and `serve` also read
/// llama.cpp's `LLAMA_ARG_*` variables through `env`. A line without a
/// known subcommand is left to clap (help, version, its error).
pub fn normalize_args(
    cli: &clap::Command,
    args: Vec<String>,
    env: &flags::Env<'_>,
) -> Result<Vec<String>, FlagError> {
    let (Some(name), Some(sub)) = (
        args.get(1),
        args.get(1).and_then(|n| cli.find_subcommand(n)),
    ) else {
        return Ok(args);
    };
    let reads_env = matches!(name.as_str(), "run" | "chat" | "serve");
    let rest = flags::rewrite(sub, name, &args[2..], reads_env.then_some(env))?;
    Ok(args[..2].iter().cloned().chain(rest).collect())
}

/// llama.cpp's escape processing of a prompt (`-e`, its default): `\n`,
/// `\r`, `\t`, `\'`, `\"`, `\\` and `\xHH`; any other backslash stays as
/// written. Refuses a `\xHH` sequence that leaves invalid UTF-8.
pub fn process_escapes(s: &str) -> anyhow::Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' if b
                .get(i..i + 2)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
            {
                let hex = std::str::from_utf8(&b[i..i + 2]).unwrap_or("0");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 2;
            }
            _ => out.extend([b'\\', c]),
        }
    }
    String::from_utf8(out).map_err(|_| {
        anyhow::anyhow!("the prompt's \\x escapes do not make UTF-8 text; write the characters themselves or pass --no-escape")
    })
}

// The model, longhaul and sampling flags are shared with `longhaul serve`;
// they live in the server crate, which the CLI depends on.
pub use longhaul_server::args::{LonghaulArgs, ModelArgs, PlacementArgs, SampleArgs};

#[cfg(test)]
mod tests {
    use super::process_escapes;

    #[test]
    fn escapes_follow_llama_cpp() {
        // common.cpp's string_process_escapes: the six escapes and \xHH;
        // anything else keeps its backslash.
        assert_eq!(
            process_escapes(r"a\nb\tc\\d\'\x41").unwrap(),
            "a\nb\tc\\d'A"
        );
        assert_eq!(process_escapes(r#"\"q\""#).unwrap(), "\"q\"");
        assert_eq!(process_escapes(r"\q \x4 end\").unwrap(), r"\q \x4 end\");
        assert_eq!(process_escapes(r"\xzz").unwrap(), r"\xzz");
        assert!(process_escapes(r"\xff").is_err());
    }
}
