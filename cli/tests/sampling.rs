//! One sampling validator behind two front ends: each row of a table of
//! sampling values goes through `longhaul run` (as a flag) and through
//! `longhaul serve` (as a request field), and is accepted by both or
//! refused by both, as the table says. A refusal is exit 1 naming the flag
//! and the field on the command line, and a 400 naming the field over
//! HTTP. Also: `-t` above the machine is capped with a warning.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/qwen3moe-f32.gguf")
        .display()
        .to_string()
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    c.env_remove("LONGHAUL_DEVICE").stdin(Stdio::null());
    c
}

/// `longhaul run` on the fixture, one token, on the CPU, plus `args`.
fn run(args: &[&str]) -> std::process::Output {
    let m = fixture();
    bin()
        .args([
            "run", "-m", &m, "-ngl", "0", "-c", "64", "-p", "hi", "-n", "1",
        ])
        .args(args)
        .output()
        .expect("spawn longhaul run")
}

/// `longhaul serve` on a free loopback port; killed when dropped.
struct Server {
    addr: String,
    child: Child,
    /// Its stderr up to the line saying the model is ready.
    log: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(args: &[&str]) -> Server {
    let m = fixture();
    let mut child = bin()
        .args(["serve", "-m", &m, "-ngl", "0", "-c", "64", "--port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn longhaul serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let mut addr = None;
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the server did not get ready: {log:#?}"));
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
        }
        let ready = line.contains(" ready in ");
        log.push(line);
        if ready {
            break;
        }
    }
    Server {
        addr: addr.expect("the server did not say where it listens"),
        child,
        log,
    }
}

/// POSTs `body` to `path` on one fresh connection; the status and JSON body.
fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("a response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let v = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, v)
}

/// One sampling value: the flag and its value on the command line, the
/// request field and its JSON value (`None` where JSON cannot carry it),
/// and whether it is accepted.
struct Row {
    flag: &'static str,
    value: &'static str,
    field: &'static str,
    json: Option<Value>,
    ok: bool,
}

fn row(flag: &'static str, value: &'static str, field: &'static str, ok: bool) -> Row {
    let json = value.parse::<i64>().map(Value::from).ok().or_else(|| {
        value
            .parse::<f64>()
            .ok()
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
    });
    Row {
        flag,
        value,
        field,
        json,
        ok,
    }
}

fn table() -> Vec<Row> {
    vec![
        // llama.cpp: a temperature of 0 or less is greedy.
        row("--temp", "0.7", "temperature", true),
        row("--temp", "0", "temperature", true),
        row("--temp", "-1", "temperature", true),
        row("--temp", "nan", "temperature", false),
        row("--temp", "inf", "temperature", false),
        // Out of f32's range: infinite once parsed, on both sides.
        row("--temp", "1e39", "temperature", false),
        // top_k 0 or less disables.
        row("--top-k", "40", "top_k", true),
        row("--top-k", "0", "top_k", true),
        row("--top-k", "-1", "top_k", true),
        // Outside [0, 1], top_p and min_p act as the nearest end (llama-server
        // clamps them).
        row("--top-p", "0.9", "top_p", true),
        row("--top-p", "1.5", "top_p", true),
        row("--top-p", "-0.5", "top_p", true),
        row("--top-p", "nan", "top_p", false),
        row("--top-p", "1e39", "top_p", false),
        row("--min-p", "0.1", "min_p", true),
        row("--min-p", "-1", "min_p", true),
        row("--min-p", "2", "min_p", true),
        row("--min-p", "nan", "min_p", false),
        row("--min-p", "-1e39", "min_p", false),
        // llama.cpp: finite, > 0, with a finite reciprocal.
        row("--repeat-penalty", "1.1", "repeat_penalty", true),
        row("--repeat-penalty", "0.5", "repeat_penalty", true),
        row("--repeat-penalty", "0", "repeat_penalty", false),
        row("--repeat-penalty", "-1", "repeat_penalty", false),
        row("--repeat-penalty", "1e-45", "repeat_penalty", false),
        row("--repeat-penalty", "nan", "repeat_penalty", false),
        row("--repeat-penalty", "1e39", "repeat_penalty", false),
        // -1 = the whole context, 0 = off.
        row("--repeat-last-n", "64", "repeat_last_n", true),
        row("--repeat-last-n", "0", "repeat_last_n", true),
        row("--repeat-last-n", "-1", "repeat_last_n", true),
        row("--repeat-last-n", "-2", "repeat_last_n", false),
        // -1 = random.
        row("--seed", "7", "seed", true),
        row("--seed", "-1", "seed", true),
        row("--seed", "-2", "seed", false),
    ]
}

#[test]
fn cli_and_server_accept_and_refuse_the_same_sampling_values() {
    let server = serve(&["-t", "2", "--quiet"]);
    let mut checked_http = 0;
    for r in table() {
        let what = format!("{} {}", r.flag, r.value);
        // The command line, the value as a separate argument.
        let out = run(&[r.flag, r.value]);
        let err = String::from_utf8_lossy(&out.stderr);
        if r.ok {
            assert!(out.status.success(), "{what} is refused: {err}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{what}: {err}");
            assert!(
                err.contains(&format!("{}:", r.flag)) && err.contains(r.field),
                "{what}: the message names neither {} nor {}: {err}",
                r.flag,
                r.field
            );
        }
        // The same value as a request field.
        let Some(v) = r.json else {
            continue;
        };
        let mut body = json!({"prompt": "hi", "n_predict": 1});
        body[r.field] = v;
        let (status, resp) = post(&server.addr, "/completion", &body);
        checked_http += 1;
        if r.ok {
            assert_eq!(status, 200, "{body}: {resp}");
        } else {
            assert_eq!(status, 400, "{body}: {resp}");
            assert_eq!(resp["error"]["param"], r.field, "{body}: {resp}");
        }
    }
    assert!(checked_http > 25, "{checked_http}");
}

#[test]
fn threads_above_the_machine_are_capped_with_a_warning() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let warning =
        format!("-t 1000 is more threads than this machine runs at once ({n}); using {n}");
    let out = run(&["-t", "1000"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&warning), "{err}");
    // The server uses the capped count, and says so when ready.
    let server = serve(&["-t", "1000", "--quiet"]);
    let log = server.log.join("\n");
    assert!(log.contains(&warning), "{log}");
    let ready = server
        .log
        .iter()
        .find(|l| l.contains(" ready in "))
        .expect("a ready line");
    assert!(ready.contains(&format!(", {n} threads)")), "{ready}");
}

/// `run --ignore-eos`, as llama.cpp's: every end-of-generation token is
/// banned (`common_init_from_params` appends a `-inf` logit bias for each),
/// so the output is the one those bans given by hand produce; without it,
/// a bias that makes EOS the greedy choice ends the generation at once.
#[test]
fn run_ignore_eos_bans_end_of_generation_tokens() {
    let file = longhaul::gguf::Model::open(fixture()).expect("open the fixture");
    let tok = longhaul::tokenizer::Tokenizer::from_metadata(file.metadata()).expect("tokenizer");
    let eos = tok.eos().expect("the fixture has an EOS");
    let push = format!("{eos}+1000");
    let gen = |extra: &[&str]| {
        let m = fixture();
        let out = bin()
            .args(["run", "-m", &m, "-ngl", "0", "-c", "64", "-p", "hi"])
            .args(["-n", "4", "--temp", "0", "--logit-bias", &push])
            .args(extra)
            .output()
            .expect("spawn longhaul run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let bans: Vec<String> = tok.eog_ids().iter().map(|id| format!("{id}-inf")).collect();
    let mut by_hand = Vec::new();
    for b in &bans {
        by_hand.extend(["--logit-bias", b.as_str()]);
    }
    let want = gen(&by_hand);
    assert!(want.len() > "hi\n".len(), "{want:?}");
    assert_eq!(gen(&["--ignore-eos"]), want);
    assert_eq!(gen(&[]), "hi\n", "the pushed EOS ends the generation");
}
