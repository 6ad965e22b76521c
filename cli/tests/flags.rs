//! llama.cpp's spellings through the `longhaul` binary: every refused
//! spelling of the table (`longhaul_server::flags::SPELLINGS`) exits 1 with
//! its explanation, and the command lines a llama.cpp user types first
//! (issue 19's list) behave as llama.cpp's tools do. The parse of every taken
//! spelling against its long form is checked next to the table
//! (`cargo test -p longhaul-cli --bin longhaul spelling_table`).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use longhaul_server::flags::{Meaning, SPELLINGS};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    c.env_remove("LONGHAUL_DEVICE").stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMA_ARG_") || k == "LLAMA_API_KEY" {
            c.env_remove(k);
        }
    }
    c
}

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/qwen3moe-f32.gguf")
        .display()
        .to_string()
}

/// SmolLM2-135M-Instruct, which has a chat template (tools/fetch-models.sh).
fn smollm2() -> String {
    let dir = std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/longhaul/models")
        });
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh (CI does) or set LONGHAUL_MODELS",
        p.display()
    );
    p.display().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawn longhaul")
}

fn fails_with(out: &Output, what: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    for w in what {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
}

/// `run` on the fixture, greedy, one token, on the CPU, plus `args`.
fn run_fixture(args: &[&str]) -> Output {
    let m = fixture();
    let mut line = vec!["run", "-m", &m, "-ngl", "0", "-c", "64", "-n", "1"];
    line.extend_from_slice(args);
    run(&line)
}

#[test]
fn every_refused_spelling_exits_1_with_its_explanation() {
    let mut n = 0;
    for s in SPELLINGS {
        let Meaning::Refused(why) = s.meaning else {
            continue;
        };
        // `serve` defines no single-letter shorts that collide with the
        // table's (bench takes -r and -o itself).
        let out = run(&["serve", "-m", "m.gguf", s.flag, "x"]);
        fails_with(&out, &[s.flag, why]);
        n += 1;
    }
    assert!(n > 100, "only {n} refused spellings");
}

#[test]
fn issue_misparses_are_refused_as_llama_cpp_users_expect() {
    let m = fixture();
    // -ot: longhaul streams experts instead.
    for cmd in ["run", "chat", "serve", "bench"] {
        let out = run(&[cmd, "-m", &m, "-ot", "exps=CPU"]);
        fails_with(&out, &["-ot", "--longhaul --longhaul-cache GIB"]);
    }
    for flag in ["--cpu-moe", "--n-cpu-moe"] {
        fails_with(
            &run(&["run", "-m", &m, flag]),
            &[flag, "--longhaul --longhaul-cache GIB"],
        );
    }
    // -hf no longer prints the help and exits 0.
    let out = run(&["run", "-hf", "user/repo", "-p", "hi"]);
    fails_with(&out, &["-hf", "does not download", "-m FILE"]);
    // A multi-letter short flag nobody defines is refused as itself.
    fails_with(&run(&["run", "-m", &m, "-xyz"]), &["unknown flag -xyz"]);
    // -cnv is not a server flag: said so, instead of `-c nv`.
    fails_with(
        &run(&["serve", "-m", &m, "-cnv"]),
        &["-cnv", "--conversation", "longhaul serve"],
    );
    // -sys without a conversation would be ignored by llama.cpp: refused here.
    fails_with(
        &run_fixture(&["-p", "hi", "-sys", "be terse"]),
        &["add -cnv"],
    );
}

#[test]
fn serve_takes_cont_batching_and_metrics() {
    // Parsed and past the flags: the error is the missing model, not -c.
    let out = run(&[
        "serve",
        "-m",
        "/nonexistent/m.gguf",
        "-cb",
        "--metrics",
        "-nocb",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/nonexistent/m.gguf"), "{err}");
    assert!(!err.contains("ctx-size"), "{err}");
}

#[test]
fn run_takes_no_cnv_temp_minus_one_top_p_2_and_escapes() {
    let out = run_fixture(&["-no-cnv", "--temp", "-1", "--top-p", "2", "-p", "a\\tb"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // llama.cpp's default escape processing: the prompt printed has a tab.
    assert!(
        text(&out.stdout).starts_with("a\tb"),
        "{}",
        text(&out.stdout)
    );
    let out = run_fixture(&["--no-escape", "-p", "a\\tb", "--log-disable"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("a\\tb"),
        "{}",
        text(&out.stdout)
    );
    // --log-disable: no informational lines (placement, timings).
    let err = text(&out.stderr);
    assert!(
        !err.contains("placement") && !err.contains("eval time"),
        "{err}"
    );
}

#[test]
fn llama_arg_variables_set_absent_flags_only() {
    // A value the shared validator refuses proves the variable was read.
    let out = bin()
        .env("LLAMA_ARG_TOP_P", "nan")
        .args([
            "run",
            "-m",
            &fixture(),
            "-ngl",
            "0",
            "-c",
            "64",
            "-n",
            "1",
            "-p",
            "hi",
        ])
        .output()
        .expect("spawn");
    fails_with(&out, &["top_p"]);
    // The command line wins over the variable.
    let out = bin()
        .env("LLAMA_ARG_TOP_P", "nan")
        .args([
            "run",
            "-m",
            &fixture(),
            "-ngl",
            "0",
            "-c",
            "64",
            "-n",
            "1",
            "-p",
            "hi",
        ])
        .args(["--top-p", "0.9"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn bench_takes_fa_lists_with_llama_bench_fa_column() {
    let m = fixture();
    let out = run(&[
        "bench", "-m", &m, "-ngl", "0", "-p", "0", "-n", "1", "-r", "1", "-fa", "0,1", "-mmp", "1",
        "-nr", "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = text(&out.stdout);
    let lines: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    let header: Vec<&str> = lines[0].split('|').map(str::trim).collect();
    let fa = header
        .iter()
        .position(|h| *h == "fa")
        .expect("an fa column");
    let col: Vec<&str> = lines[2..]
        .iter()
        .map(|l| l.split('|').map(str::trim).nth(fa).unwrap_or(""))
        .collect();
    // llama-bench prints llama_flash_attn_type: 0 disabled, 1 enabled.
    assert_eq!(col, ["0", "1"], "{md}");
    // llama-bench's `repack` column, shown when repacking is off.
    let out = run(&[
        "bench", "-m", &m, "-p", "0", "-n", "1", "-r", "1", "-nr", "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let header = text(&out.stdout).lines().next().unwrap_or("").to_string();
    assert!(header.contains("| repack |"), "{header}");
    let out = run(&[
        "bench", "-m", &m, "-p", "0", "-n", "1", "-r", "1", "-nr", "1", "-o", "json",
    ]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(rows[0]["repack"], serde_json::json!(false), "{rows}");
    let out = run(&["bench", "-m", &m, "-nr", "2"]);
    fails_with(&out, &["-nr 2", "give 0 or 1"]);
    let out = run(&["bench", "-m", &m, "--repack", "1", "-nr", "1"]);
    fails_with(&out, &["contradict"]);
}

#[test]
fn run_cnv_is_the_chat_loop_with_the_prompt_as_first_message() {
    let m = smollm2();
    // -st: answer -p and exit, as llama.cpp's single turn.
    let out = run(&[
        "run", "-m", &m, "-ngl", "0", "-cnv", "-st", "-sys", "be terse", "-p", "Say hi.", "-n",
        "8", "--temp", "0",
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The prompt and the first message are on stdout, as llama-cli prints them.
    let stdout = text(&out.stdout);
    let reply = stdout
        .split("> Say hi.")
        .nth(1)
        .expect("the first message after the prompt");
    assert!(!reply.trim().is_empty(), "no reply: {stdout}");
    // -st: one reply, then the end (no second prompt).
    assert_eq!(err.matches("Generation:").count(), 1, "{err}");
    // Without -st the loop goes on reading stdin after the first reply.
    let (_, err) = run_with_stdin(
        &[
            "run", "-m", &m, "-ngl", "0", "-cnv", "-p", "Say hi.", "-n", "4", "--temp", "0",
        ],
        b"And again.\n",
    );
    // Two replies, each followed by its speed line.
    assert_eq!(err.matches("Generation:").count(), 2, "{err}");
    // chat -sys parses (and the conversation starts) instead of `-s ys`.
    let out = run(&["chat", "-m", &m, "-ngl", "0", "-sys", "be terse"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn mlock_locks_the_loaded_model_or_says_why_not() {
    use std::io::{BufRead, BufReader};
    let m = fixture();
    let size = std::fs::metadata(&m).expect("fixture").len();
    let mut child = bin()
        .args(["chat", "-m", &m, "-ngl", "0", "-c", "64", "--mlock"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut log = String::new();
    // The chat waits for its first line once the model is loaded and locked.
    while !log.contains("chatting with") {
        let mut line = String::new();
        if err.read_line(&mut line).expect("read stderr") == 0 {
            break;
        }
        log.push_str(&line);
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success(), "{log}");
    let locked_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmLck in /proc/PID/status");
    if log.contains("warning: --mlock") {
        assert!(log.contains("RLIMIT_MEMLOCK"), "{log}");
    } else {
        // Everything mapped is locked: at least the model file's mapping.
        assert!(
            locked_kb * 1024 >= size,
            "VmLck {locked_kb} kB < model {size} B\n{log}"
        );
    }
    for lock in [&["--mlock"][..], &["-lm", "mlock"], &["-lm", "mmap+mlock"]] {
        let mut args = lock.to_vec();
        args.extend(["--longhaul", "--longhaul-cache", "1", "-p", "hi"]);
        fails_with(&run_fixture(&args), &["--mlock", "--longhaul"]);
    }
}

/// `-lm dio` (llama.cpp's load mode: weights read into memory with direct
/// I/O) generates what the default mapped load does, and refuses
/// `--longhaul-io buffered`, which would read the resident weights through
/// the page cache.
#[test]
fn load_mode_dio_reads_the_same_weights() {
    let args = ["-p", "Once upon a time", "--temp", "0"];
    let mapped = run_fixture(&args);
    assert!(mapped.status.success(), "{}", text(&mapped.stderr));
    let mut dio = args.to_vec();
    dio.extend(["-lm", "dio"]);
    let out = run_fixture(&dio);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&mapped.stdout));
    dio.extend([
        "--longhaul",
        "--longhaul-cache",
        "1",
        "--longhaul-io",
        "buffered",
    ]);
    fails_with(&run_fixture(&dio), &["-lm dio", "--longhaul-io buffered"]);
}

/// `longhaul ARGS` with `input` on stdin: stdout and stderr of a
/// successful run.
fn run_with_stdin(args: &[&str], input: &[u8]) -> (String, String) {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    (text(&out.stdout), err)
}

/// `run -cnv` over two turns (the prompt, then one line on stdin), greedy.
fn converse(m: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec![
        "run",
        "-m",
        m,
        "-ngl",
        "0",
        "-cnv",
        "-n",
        "24",
        "--temp",
        "0",
        "-p",
        "Write the line 'the cat sat on the mat' three times.",
    ];
    args.extend_from_slice(extra);
    run_with_stdin(&args, b"Once more, please.\n")
}

#[test]
fn a_draft_model_speculates_in_run_and_chat_as_llama_cpp_spells_it() {
    let m = smollm2();
    // The model drafts for itself: every draft is accepted (its one-token
    // steps equal the verification rows), and the replies of both turns
    // are those without speculation. The second turn's drafter follows
    // the whole conversation, not only the new message.
    let (want, plain_err) = converse(&m, &[]);
    assert!(!plain_err.contains("Draft acceptance"), "{plain_err}");
    let (got, err) = converse(&m, &["-md", &m]);
    assert_eq!(got, want, "replies with -md differ: {err}");
    assert_eq!(err.matches("Draft acceptance: 100.0%").count(), 2, "{err}");
    assert!(err.contains("draft model: 30 layers"), "{err}");
    // run: llama.cpp's line, with --spec-draft-n-max and the env variable.
    let out = bin()
        .args([
            "run",
            "-m",
            &m,
            "-ngl",
            "0",
            "-p",
            "1, 2, 3, 4,",
            "-n",
            "12",
            "--temp",
            "0",
        ])
        .args(["--spec-type", "draft-simple", "--spec-draft-n-max", "5"])
        .env("LLAMA_ARG_SPEC_DRAFT_MODEL", &m)
        .output()
        .expect("spawn");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("speculative: draft-simple"), "{err}");
    assert!(err.contains("draft acceptance rate = 1.00000"), "{err}");
    // What is refused, and why.
    let out = run(&["run", "-m", &m, "-p", "x", "--spec-type", "draft-simple"]);
    fails_with(&out, &["draft-simple needs a draft model", "-md FILE"]);
    let out = run(&[
        "run",
        "-m",
        &m,
        "-p",
        "x",
        "-md",
        &m,
        "--spec-type",
        "ngram-simple",
    ]);
    fails_with(&out, &["one drafter at a time"]);
    let out = run(&["run", "-m", &m, "-p", "x", "-n", "1", "-md", &fixture()]);
    fails_with(&out, &["does not share the target's vocabulary"]);
}
