#!/usr/bin/env python3
"""Time to first token of a long conversation resumed from the context cache
against the same conversation re-prefilled, and slot save/restore throughput.

For each model, in interleaved rounds, two `longhaul serve` processes (one
slot, -c 4096) run the same three requests, each with n_predict 1:
  A (a ~4000-token conversation), B (another one, which takes A's slot), A again.
The first server has no context cache, so the second A is prefilled again;
the second has --context-cache-path, so B spills A to disk and the second A
restores it. TTFT is the client's wall clock of the one-token request
(prefill + one sampled token); the server's own `timings.prompt_ms` and
`prompt_n` are printed beside it.
Then on the cached server: POST /slots/0?action=save and ?action=restore of
the slot holding A, with `n_written` / `n_read` over `save_ms` / `restore_ms`
in GB/s (the restore reads a file just written, so from the page cache unless
the page cache is dropped between; the script drops it when it may).

Usage:
  tools/bench-resume.py [--bin target/release/longhaul] [--rounds 3] [--threads 2]
                        [--tokens 4000] [--models smollm2,demo]
The demo MoE runs under --longhaul with a cache of a quarter of its experts;
its hit rate (from /metrics) is printed beside its times.
Only the Python standard library is used.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HOME = os.path.expanduser("~")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("LONGHAUL_CACHE", os.path.join(HOME, ".cache/longhaul"))
MODELS = {
    "smollm2": (os.path.join(CACHE, "models/smollm2-135m-instruct-q4_1.gguf"), []),
    # A quarter of the demo's 64 experts per layer (27.0 MiB of 108.0 MiB, as `longhaul demo`).
    "demo": (os.path.join(CACHE, "demo-qwen3moe-q4_K-seed65642-v2.gguf"),
             ["--longhaul", "--longhaul-cache", "0.0264"]),
}


def request(method, url, body=None, timeout=1200):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.startswith(b"{") or raw.startswith(b"[") else raw.decode()


def start(cmd, port):
    log = open(f"/tmp/bench-resume-{port}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return p
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if p.poll() is not None:
            sys.exit(f"{cmd} exited; see /tmp/bench-resume-{port}.log")
        time.sleep(0.1)
    p.kill()
    sys.exit("server did not become ready")


def stop(p):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()


def conversation(base, seed, n):
    """A deterministic ~n-token prompt (token ids, via the server's tokenizer)."""
    words = ["river", "engine", "copper", "lantern", "harbour", "signal", "meadow", "ledger",
             "orbit", "granite", "whistle", "canvas", "furnace", "compass", "pepper", "cinder"]
    parts, i = [], 0
    while len(parts) < n:  # about one token per word, checked below
        w = words[(seed * 7 + i * 5 + i // 3) % len(words)]
        parts.append(f"{w} {i % 97}," if i % 11 == 0 else w)
        i += 1
    toks = request("POST", f"{base}/tokenize", {"content": " ".join(parts)})["tokens"]
    if len(toks) < n:
        sys.exit(f"prompt has only {len(toks)} tokens")
    return toks[:n]


def one_token(base, prompt):
    t0 = time.perf_counter()
    r = request("POST", f"{base}/completion",
                {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True})
    wall = time.perf_counter() - t0
    t = r.get("timings", {})
    return wall, t.get("prompt_n"), t.get("prompt_ms")


def metric(base, name):
    for line in request("GET", f"{base}/metrics").splitlines():
        if line.startswith(f"longhaul:{name} "):
            return float(line.split()[1])
    return None


def drop_page_cache():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/longhaul"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--models", default="smollm2,demo")
    ap.add_argument("--port", type=int, default=8931)
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    work = tempfile.mkdtemp(prefix="bench-resume-")
    try:
        for name in a.models.split(","):
            path, extra = MODELS[name]
            if not os.path.exists(path):
                sys.exit(f"{path} is missing (tools/fetch-models.sh, or `longhaul demo` once)")
            print(f"\n## {name}: {os.path.basename(path)} {' '.join(extra)}, -t {a.threads}, "
                  f"-np 1 -c 4096, {a.tokens}-token conversations, n_predict 1")
            rows = {"re-prefilled": [], "resumed": []}
            saves = []
            for rnd in range(a.rounds):
                for mode in ("re-prefilled", "resumed"):
                    cc = os.path.join(work, f"cc-{name}-{rnd}")
                    ss = os.path.join(work, f"ss-{name}-{rnd}")
                    os.makedirs(ss, exist_ok=True)
                    cmd = [a.bin, "serve", "-m", path, "-np", "1", "-c", "4096", "-t",
                           str(a.threads), "--port", str(a.port), "--slot-save-path", ss] + extra
                    if mode == "resumed":
                        cmd += ["--context-cache-path", cc]
                    p = start(cmd, a.port)
                    try:
                        conv_a = conversation(base, 1, a.tokens)
                        conv_b = conversation(base, 2, a.tokens)
                        one_token(base, conversation(base, 3, 32))  # warm-up, sharing no prefix with A or B
                        first = one_token(base, conv_a)
                        one_token(base, conv_b)
                        again = one_token(base, conv_a)
                        hit = metric(base, "longhaul_hit_rate") if extra else None
                        rows[mode].append((first, again, hit))
                        if mode == "resumed":
                            s = request("POST", f"{base}/slots/0?action=save", {"filename": "a.bin"})
                            dropped = drop_page_cache()
                            r = request("POST", f"{base}/slots/0?action=restore", {"filename": "a.bin"})
                            saves.append((s["n_written"], s["timings"]["save_ms"],
                                          r["n_read"], r["timings"]["restore_ms"], dropped))
                    finally:
                        stop(p)
            print("| round | mode | first A: TTFT s (prompt_n, prompt_ms) | A again: TTFT s (prompt_n, prompt_ms) | hit rate |")
            print("|---|---|---|---|---|")
            for rnd in range(a.rounds):
                for mode in ("re-prefilled", "resumed"):
                    (w1, n1, m1), (w2, n2, m2), hit = rows[mode][rnd]
                    h = f"{hit:.3f}" if hit is not None else "resident"
                    print(f"| {rnd + 1} | {mode} | {w1:.3f} ({n1}, {m1:.0f}) | {w2:.3f} ({n2}, {m2:.0f}) | {h} |")
            med = lambda xs: sorted(xs)[len(xs) // 2]
            re = med([r[1][0] for r in rows["re-prefilled"]])
            rs = med([r[1][0] for r in rows["resumed"]])
            print(f"median TTFT of A again: re-prefilled {re:.3f} s, resumed {rs:.3f} s ({re / rs:.1f}x)")
            for n_w, ms_w, n_r, ms_r, dropped in saves:
                print(f"save {n_w / 1e6:.1f} MB in {ms_w:.1f} ms = {n_w / ms_w / 1e6:.2f} GB/s; "
                      f"restore {n_r / 1e6:.1f} MB in {ms_r:.1f} ms = {n_r / ms_r / 1e6:.2f} GB/s "
                      f"({'page cache dropped first' if dropped else 'from the page cache'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
