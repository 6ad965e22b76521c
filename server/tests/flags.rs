//! The standalone `longhaul-server` binary reads llama-server's spellings
//! through the same table as `longhaul serve` (`longhaul_server::flags`).

use std::process::{Command, Output, Stdio};

fn server(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_longhaul-server"))
        .args(args)
        .env_remove("LLAMA_ARG_N_PARALLEL")
        .stdin(Stdio::null())
        .output()
        .expect("spawn longhaul-server")
}

#[test]
fn llama_server_spellings_are_taken_or_refused_with_exit_1() {
    // Taken: the error is the missing model, not a flag.
    let out = server(&[
        "-m",
        "/nonexistent/m.gguf",
        "-cb",
        "-np",
        "2",
        "-to",
        "5",
        "--metrics",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/nonexistent/m.gguf") && !err.contains("unexpected"),
        "{err}"
    );
    // Refused, naming the flag and what to do instead.
    let out = server(&["-hf", "user/repo"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("-hf") && err.contains("-m FILE"), "{err}");
    let out = server(&["-m", "m.gguf", "--n-cpu-moe", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--longhaul --longhaul-cache GIB"), "{err}");
}
