//! The `longhaul` binary: flag errors with their messages, the placement
//! (`-ngl`, `--device`, `longhaul devices`) on Mesa's lavapipe, and a
//! longhaul run on a fixture that streams experts and reports it.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_longhaul"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn run_err(args: &[&str]) -> String {
    let out = bin().args(args).output().expect("spawn");
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn longhaul_flag_errors_say_what_to_do() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let m = m.to_str().expect("path");
    let e = run_err(&["run", "-m", m, "-p", "hi", "-n", "1", "--longhaul"]);
    assert!(e.contains("--longhaul needs --longhaul-cache"), "{e}");
    for bad in ["0", "-1", "lots"] {
        let e = run_err(&[
            "run",
            "-m",
            m,
            "-p",
            "hi",
            "-n",
            "1",
            "--longhaul",
            "--longhaul-cache",
            bad,
        ]);
        assert!(e.contains("give a positive number of GiB"), "{bad}: {e}");
    }
    let e = run_err(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "1",
        "--longhaul",
        "--longhaul-cache",
        "0.000001",
    ]);
    assert!(
        e.contains("holds no expert per layer") && e.contains("raise --longhaul-cache to at least"),
        "{e}"
    );
    let e = run_err(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "1",
        "--longhaul",
        "--longhaul-cache",
        "1",
        "--longhaul-policy",
        "fifo",
    ]);
    assert!(
        e.contains("unknown cache policy `fifo`; use lru, lfu or auto"),
        "{e}"
    );
}

/// The model, placement and sampling flags are shared by these subcommands;
/// each takes `-m MODEL` and fails on a bad placement before loading.
const MODEL_COMMANDS: [&str; 4] = ["run", "chat", "bench", "serve"];

/// Runs `longhaul CMD -m model ARGS` for a model-taking subcommand, with
/// `WGPU_BACKEND=vulkan` so that a missing Vulkan driver fails loudly.
fn model_cmd(cmd: &str, model: &str, args: &[&str]) -> std::process::Output {
    let mut c = bin();
    c.env("WGPU_BACKEND", "vulkan")
        .env_remove("LONGHAUL_DEVICE")
        .args([cmd, "-m", model]);
    match cmd {
        "run" => c.args(["-p", "hi", "-n", "1"]),
        "bench" => c.args(["-p", "4", "-n", "1", "-r", "1"]),
        "serve" => c.args(["--port", "0"]),
        _ => &mut c,
    };
    c.args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawn")
}

fn cmd_err(cmd: &str, model: &str, args: &[&str]) -> String {
    let out = model_cmd(cmd, model, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{cmd} {args:?} should fail: {err}");
    err
}

/// A copy of a fixture whose metadata claims `n_layer` repeating layers (the
/// tensors are still those of the two real ones: loading it would fail).
fn fixture_with_layers(name: &str, n_layer: u32) -> PathBuf {
    let src = longhaul::gguf::Model::open(fixture(name)).expect("open");
    let mut w = longhaul::gguf::Writer::new();
    for (k, v) in src.metadata().iter() {
        w.set(k, v.clone());
    }
    w.set(
        "qwen3moe.block_count",
        longhaul::gguf::MetaValue::U32(n_layer),
    );
    for t in src.tensors() {
        w.add_tensor(
            &t.name,
            &t.dims,
            t.ty,
            src.tensor_data(t).expect("data").to_vec(),
        )
        .expect("add");
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{n_layer}-layers-{name}"));
    w.write(&path).expect("write");
    path
}

#[test]
fn partial_gpu_offload_is_refused_before_loading() {
    // The file says 24 layers but holds tensors for 2: any attempt to load
    // weights would fail on a missing tensor, so the message proves the
    // refusal comes first.
    let m = fixture_with_layers("qwen3moe-q4_k_m.gguf", 24);
    let m = m.to_str().expect("path");
    for cmd in MODEL_COMMANDS {
        for ngl in [["-ngl", "5"], ["--n-gpu-layers", "5"], ["-ngl=5", ""]] {
            let args: Vec<&str> = ngl.into_iter().filter(|a| !a.is_empty()).collect();
            let e = cmd_err(cmd, m, &args);
            assert!(
                e.contains("-ngl 5: longhaul places all repeating layers on one device")
                    && e.contains("use -ngl 0 (CPU)")
                    && e.contains("-ngl all / 99")
                    && e.contains("this model has 24 layers"),
                "{cmd} {args:?}: {e}"
            );
            assert!(
                !e.contains("not in the model") && !e.contains("listening"),
                "{cmd}: {e}"
            );
        }
    }
    // The two-layer fixture: 1 is partial, 2 and more mean every layer.
    let f = fixture("qwen3moe-q4_k_m.gguf");
    let e = cmd_err("run", f.to_str().expect("path"), &["-ngl", "1"]);
    assert!(e.contains("this model has 2 layers"), "{e}");
}

#[test]
fn bad_ngl_value_names_the_valid_ones() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let m = m.to_str().expect("path");
    for cmd in MODEL_COMMANDS {
        for bad in ["abc", "-2", "1.5"] {
            let e = cmd_err(cmd, m, &["-ngl", bad]);
            assert!(
                e.contains(&format!("-ngl {bad}: give auto"))
                    && e.contains("0 (every repeating layer on the CPU)")
                    && e.contains("all / 99"),
                "{cmd} -ngl {bad}: {e}"
            );
        }
    }
    // A bench list is checked value by value before anything runs.
    let e = cmd_err("bench", m, &["-ngl", "0,abc"]);
    assert!(e.contains("-ngl abc: give auto"), "{e}");
}

#[test]
fn unknown_device_fails_naming_the_adapters() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let m = m.to_str().expect("path");
    for cmd in MODEL_COMMANDS {
        for dev in ["--device", "-dev"] {
            let e = cmd_err(cmd, m, &[dev, "nosuchdevice", "-ngl", "99"]);
            assert!(
                e.contains("no adapter matches --device \"nosuchdevice\"")
                    && e.contains("available: ")
                    && e.to_lowercase().contains("llvmpipe"),
                "{cmd} {dev}: {e}"
            );
        }
    }
    // --device alone asks for the GPU too: no fall back to the CPU.
    let e = cmd_err("run", m, &["--device", "nosuchdevice"]);
    assert!(e.contains("no adapter matches"), "{e}");
    // So does -ngl 99 when the only adapter is a software one.
    let e = cmd_err("run", m, &["-ngl", "99"]);
    assert!(
        e.contains("-ngl 99 asks for the GPU") && e.contains("use -ngl 0"),
        "{e}"
    );
}

#[test]
fn devices_lists_lavapipe_with_its_limits() {
    // CI installs Mesa's lavapipe; no adapter here is a failure, not a skip.
    let out = bin()
        .arg("devices")
        .env("WGPU_BACKEND", "vulkan")
        .env_remove("LONGHAUL_DEVICE")
        .output()
        .expect("spawn");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("llvmpipe"))
        .unwrap_or_else(|| {
            panic!("no llvmpipe adapter listed (install mesa-vulkan-drivers):\n{text}")
        });
    let block = lines[at..(at + 4).min(lines.len())].join("\n");
    assert!(block.contains("#"), "{block}");
    assert!(
        block.contains("backend Vulkan") && block.contains("type Cpu"),
        "{block}"
    );
    assert!(block.contains("driver "), "{block}");
    assert!(block.contains("f16 yes"), "{block}");
    // Subgroups with their min..max sizes (8 lanes on a 256-bit llvmpipe).
    let sg = block
        .split("subgroups yes (")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no subgroup sizes: {block}"));
    let (lo, hi) = sg.split_once("..").expect("min..max");
    let (lo, hi): (u32, u32) = (lo.parse().expect("min"), hi.parse().expect("max"));
    assert!(lo >= 1 && lo <= hi, "{sg}");
    // lavapipe's storage binding limit (DESIGN.md: 128 MiB) and a buffer limit.
    assert!(block.contains("max storage binding 128 MiB"), "{block}");
    assert!(block.contains("max buffer "), "{block}");
    // A software adapter is never the default.
    assert!(
        text.contains("default placement (-ngl auto): CPU") && text.contains("--device llvmpipe"),
        "{text}"
    );
    // Named, it is.
    let out = bin()
        .args(["devices", "-dev", "LLVMPIPE"])
        .env("WGPU_BACKEND", "vulkan")
        .output()
        .expect("spawn");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("default placement (--device LLVMPIPE): every repeating layer on GPU #"),
        "{text}"
    );
}

#[test]
fn ngl_0_output_equals_the_default_cpu_output() {
    let m = fixture("qwen3moe-f32.gguf");
    let m = m.to_str().expect("path");
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "hello world",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let run = |extra: &[&str], wgpu: &str| {
        let out = bin()
            .args(base)
            .args(extra)
            .env("WGPU_BACKEND", wgpu)
            .env_remove("LONGHAUL_DEVICE")
            .output()
            .expect("spawn");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{extra:?}: {err}");
        (out.stdout, err)
    };
    // GL is not compiled in, so wgpu sees no adapter on any machine and the
    // default (-ngl auto) runs on the CPU, saying so.
    let (default, err) = run(&[], "gl");
    assert!(
        err.contains("placement: CPU (no GPU adapter found)"),
        "{err}"
    );
    let (zero, err) = run(&["-ngl", "0"], "vulkan");
    assert!(err.contains("placement: CPU (-ngl 0)"), "{err}");
    assert_eq!(zero, default, "-ngl 0 differs from the default CPU run");
    let (none, _) = run(&["--device", "none"], "vulkan");
    assert_eq!(
        none, default,
        "--device none differs from the default CPU run"
    );
}

#[test]
fn named_software_adapter_runs_every_layer_on_the_gpu() {
    let m = fixture("qwen3moe-f32.gguf");
    let m = m.to_str().expect("path");
    let out = model_cmd("run", m, &["--device", "llvmpipe", "-ngl", "all"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("placement: 2 repeating layers on GPU llvmpipe") && err.contains("(Vulkan)"),
        "{err}"
    );
}

#[test]
fn bench_gives_one_row_per_ngl_value() {
    let m = fixture("qwen3moe-f32.gguf");
    let m = m.to_str().expect("path");
    let out = model_cmd(
        "bench",
        m,
        &["-ngl", "0,99", "-dev", "llvmpipe", "-t", "2", "-o", "jsonl"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json row"))
        .collect();
    // -p 4 -n 1: two tests per placement.
    assert_eq!(rows.len(), 4, "{rows:?}");
    for (r, (backend, ngl)) in
        rows.iter()
            .zip([("CPU", 0), ("CPU", 0), ("Vulkan", 99), ("Vulkan", 99)])
    {
        assert_eq!(r["backends"], backend, "{r}");
        assert_eq!(r["n_gpu_layers"], ngl, "{r}");
        let gpu = r["gpu_info"].as_str().expect("gpu_info");
        assert_eq!(gpu.contains("llvmpipe"), ngl == 99, "{r}");
    }
    assert!(
        err.contains("placement (-ngl 0): CPU (-ngl 0)")
            && err.contains("placement (-ngl 99): 2 repeating layers on GPU llvmpipe"),
        "{err}"
    );
    // The markdown table shows llama-bench's `ngl` column once a row ran on a GPU.
    let out = model_cmd("bench", m, &["-ngl", "0,99", "-dev", "llvmpipe", "-t", "2"]);
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = md.lines().next().expect("header");
    assert!(
        header.contains("| backend ") && header.contains("| ngl "),
        "{md}"
    );
    assert!(
        md.lines()
            .any(|l| l.contains("| Vulkan ") && l.contains("|  99 |")),
        "{md}"
    );
    assert!(
        md.lines()
            .any(|l| l.contains("| CPU ") && l.contains("|   0 |")),
        "{md}"
    );
}

#[test]
fn unsupported_architecture_names_the_supported_ones() {
    // A file whose architecture is unknown: rewrite the metadata of a fixture.
    let src = longhaul::gguf::Model::open(fixture("qwen3moe-q4_k_m.gguf")).expect("open");
    let mut w = longhaul::gguf::Writer::new();
    for (k, v) in src.metadata().iter() {
        w.set(k, v.clone());
    }
    w.set(
        "general.architecture",
        longhaul::gguf::MetaValue::String("mamba".into()),
    );
    for t in src.tensors() {
        w.add_tensor(
            &t.name,
            &t.dims,
            t.ty,
            src.tensor_data(t).expect("data").to_vec(),
        )
        .expect("add");
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mamba.gguf");
    w.write(&path).expect("write");
    let e = run_err(&[
        "run",
        "-m",
        path.to_str().expect("path"),
        "-p",
        "hi",
        "-n",
        "1",
    ]);
    assert!(
        e.contains("unsupported architecture `mamba`")
            && e.contains("qwen3moe")
            && e.contains("gpt-oss"),
        "{e}"
    );
}

#[test]
fn longhaul_run_streams_experts_and_matches_resident_text() {
    let m = fixture("qwen3moe-f32.gguf");
    let m = m.to_str().expect("path");
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "hello world",
        "-n",
        "16",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let resident = bin().args(base).output().expect("spawn");
    assert!(
        resident.status.success(),
        "{}",
        String::from_utf8_lossy(&resident.stderr)
    );
    let lh = bin()
        .args(base)
        .args(["--longhaul", "--longhaul-cache", "0.001"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&lh.stderr);
    assert!(lh.status.success(), "{err}");
    assert_eq!(
        lh.stdout, resident.stdout,
        "longhaul text differs from resident"
    );
    assert!(
        err.contains("MoE layers x") && err.contains("outside the budget"),
        "{err}"
    );
    assert!(
        err.contains("hit rate") && err.contains("expert bytes read"),
        "{err}"
    );
}

/// `struct rlimit` and `RLIMIT_AS` of 64-bit Linux, for [`limited`].
#[cfg(target_os = "linux")]
#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}
#[cfg(target_os = "linux")]
const RLIMIT_AS: i32 = 9;
#[cfg(target_os = "linux")]
extern "C" {
    fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
}

/// Runs `longhaul ARGS` under an 8 GiB address-space limit, so that an
/// allocation sized from a hostile value fails at once instead of taking
/// the machine, and kills it if it still runs after 20 s. Returns the exit
/// code (`None`: killed by a signal) and stderr.
#[cfg(target_os = "linux")]
fn limited(args: &[&str]) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let err_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("limited-{}-{n}.stderr", std::process::id()));
    let err_file = std::fs::File::create(&err_path).expect("stderr file");
    let mut c = bin();
    c.args(args)
        .env("WGPU_BACKEND", "vulkan")
        .env_remove("LONGHAUL_DEVICE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err_file);
    // SAFETY: the hook only calls setrlimit, which is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            let lim = RLimit {
                cur: 8 << 30,
                max: 8 << 30,
            };
            if setrlimit(RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().expect("spawn");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still ran after 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    (status.code(), err)
}

/// The tiny synthetic model with metadata keys overridden.
#[cfg(target_os = "linux")]
fn hostile_file(name: &str, keys: &[(&str, longhaul::gguf::MetaValue)]) -> PathBuf {
    let mut w = longhaul::synth::build(&longhaul::synth::SynthSpec::tiny()).expect("build");
    for (k, v) in keys {
        w.set(k, v.clone());
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}.gguf"));
    w.write(&path).expect("write");
    path
}

/// The tiny model with a Q4_K expert tensor retyped as F32 in its tensor
/// table, so that its bytes run into the next tensor's.
#[cfg(target_os = "linux")]
fn overlapping_file() -> PathBuf {
    let path = hostile_file("overlap", &[]);
    let mut b = std::fs::read(&path).expect("read");
    let name = "blk.0.ffn_gate_exps.weight";
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend(name.as_bytes());
    let at = b
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("entry")
        + needle.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().expect("4")) as usize;
    let ty = at + 4 + 8 * n_dims;
    assert_eq!(b[ty], longhaul::tensor::GgmlType::Q4_K as u8);
    b[ty..ty + 4].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&path, b).expect("write");
    path
}

#[cfg(target_os = "linux")]
#[test]
fn hostile_files_fail_with_exit_1_under_a_memory_limit() {
    use longhaul::gguf::MetaValue;
    let layers = hostile_file(
        "layers",
        &[("qwen3moe.block_count", MetaValue::U64(1 << 32))],
    );
    let nan = hostile_file(
        "nan-eps",
        &[(
            "qwen3moe.attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::NAN),
        )],
    );
    let ctx = hostile_file(
        "ctx",
        &[("qwen3moe.context_length", MetaValue::U32(u32::MAX))],
    );
    let overlap = overlapping_file();
    let p = |p: &PathBuf| p.to_str().expect("path").to_string();
    let run = |m: &str, extra: &[&str]| {
        let mut a = vec!["run", "-m", m, "-p", "hi", "-n", "1", "-t", "1"];
        a.extend(extra);
        limited(&a)
    };
    exits_1_saying(
        "run huge block_count",
        run(&p(&layers), &[]),
        &["qwen3moe.block_count", "4294967296"],
    );
    exits_1_saying(
        "inspect huge block_count",
        limited(&["inspect", &p(&layers)]),
        &["qwen3moe.block_count", "4294967296"],
    );
    exits_1_saying(
        "run NaN eps",
        run(&p(&nan), &[]),
        &["layer_norm_rms_epsilon", "NaN"],
    );
    exits_1_saying(
        "run -c 0 on a 2^32-1 context",
        run(&p(&ctx), &["-c", "0"]),
        &["-c 0", "4294967295", "KV cache"],
    );
    exits_1_saying(
        "run overlapping tensors",
        run(&p(&overlap), &[]),
        &["blk.0.ffn_gate_exps.weight", "overlap"],
    );
    exits_1_saying(
        "inspect overlapping tensors",
        limited(&["inspect", &p(&overlap)]),
        &["blk.0.ffn_gate_exps.weight", "overlap"],
    );
}

/// A prompt file that cannot fit the context by its length alone fails
/// before it is encoded (1 MiB would take about 150 MB to encode); one
/// that is a little too long fails with its exact count.
#[cfg(target_os = "linux")]
#[test]
fn a_prompt_longer_than_the_context_fails_with_exit_1() {
    let m = hostile_file("plain", &[]);
    let m = m.to_str().expect("path");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (words, bound) in [(8, false), (1 << 18, true)] {
        let f = dir.join(format!("long-prompt-{}-{words}.txt", std::process::id()));
        std::fs::write(&f, "word ".repeat(words)).expect("write");
        let f_arg = f.to_str().expect("path");
        let got = limited(&["run", "-m", m, "-f", f_arg, "-n", "1", "-c", "32"]);
        let _ = std::fs::remove_file(&f);
        assert_eq!(got.1.contains("has at least"), bound, "{}", got.1);
        exits_1_saying("long prompt", got, &["the prompt has", "context holds 32"]);
    }
}

/// Asserts exit code 1 (an error, not an abort's 134) and `words` in stderr.
#[cfg(target_os = "linux")]
fn exits_1_saying(what: &str, (code, err): (Option<i32>, String), words: &[&str]) {
    assert_eq!(code, Some(1), "{what}: {err}");
    for w in words {
        assert!(err.contains(w), "{what}: `{w}` not in: {err}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn ctx_99999999_fails_with_exit_1_in_run_and_before_serve_is_ready() {
    let m = hostile_file("plain", &[]);
    let m = m.to_str().expect("path");
    let (code, err) = limited(&["run", "-m", m, "-p", "hi", "-n", "1", "-c", "99999999"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("-c 99999999 needs") && err.contains("lower -c/--ctx-size"),
        "{err}"
    );
    // The GPU placement sizes its KV cache through the same check.
    let (code, err) = limited(&[
        "run", "-m", m, "-p", "hi", "-n", "1", "-c", "99999999", "--device", "llvmpipe", "-ngl",
        "all",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("on GPU llvmpipe") && err.contains("-c 99999999 needs"),
        "{err}"
    );
    let (code, err) = limited(&[
        "serve", "-m", m, "--port", "0", "-c", "99999999", "-np", "2",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("-c 99999999 with -np 2 needs"), "{err}");
    assert!(!err.contains("ready"), "{err}");
}

/// `inspect` on a file whose layers keep their experts in different low-bit
/// types: bytes per type, and each layer's expert types and slot size.
#[test]
fn inspect_reports_mixed_low_bit_expert_types_per_layer() {
    let out = bin()
        .args(["inspect", fixture("iqmoe-mix.gguf").to_str().unwrap()])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for ty in ["iq1_m", "iq2_xxs", "iq3_s", "nvfp4", "q4_K", "q8_0"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(ty) && l.contains("tensors")),
            "no bytes line for {ty}:\n{text}"
        );
    }
    let layer = |il: usize| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("blk.{il} ")))
            .unwrap_or_else(|| panic!("no line for blk.{il}:\n{text}"))
            .to_string()
    };
    assert!(
        layer(0).contains("ffn_gate_exps.weight iq2_xxs")
            && layer(0).contains("ffn_down_exps.weight iq3_s")
    );
    assert!(
        layer(1).contains("ffn_up_exps.weight iq1_m")
            && layer(1).contains("ffn_down_exps.weight nvfp4")
    );
}
