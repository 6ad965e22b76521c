#!/usr/bin/env python3
"""Goldens of llama.cpp's MTP drafter (`--spec-type draft-mtp`) on a model with
a NextN layer, for tests/mtp.rs.

For each prompt, llama-server (tools/build-llamacpp.sh) runs one greedy
/completion with its MTP drafter at the exact path (-fa off -ctk f32 -ctv f32)
and at llama.cpp's defaults; its debug log (-v) names every drafted token and
its probability (softmax over the drafter's top 10), and the reply the
generated tokens and the draft counts. Written as JSON:

  {"model": ..., "runs": [{"path": "exact"|"default"|"default-cached", "prompt": ...,
    "tokens": [...], "draft_n": N, "draft_n_accepted": N,
    "drafts": [[[id, p], ...], ...]}]}

`default-cached` is two requests on one slot with cache_prompt, the second
prompt extending the first (the slot keeps the shared prefix).
`drafts` holds each step's whole draft as the drafter made it; near the end
of a request the server keeps only what fits n_predict (`draft_n` counts what
was kept).

ggml's AVX2 and AVX-512 builds round differently (at the defaults a drafted
token's probability moves by up to 0.003 between them), so the goldens are
per instruction set: `mtp-NAME.json` made on an AVX2 machine,
`mtp-NAME.avx512.json` on an AVX-512 VNNI one (the doc's "isa"); tests/mtp.rs
compares with the one of the kernels it runs.

usage: tools/mtp_goldens.py LLAMA_BIN_DIR MODEL.gguf OUT.json
"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPTS = [
    "Hello world, this is a test of the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]
# Tried in turn where a prompt's reply fails: llama-server answers 500 when
# a random model's reply is not valid UTF-8 (it cannot write the JSON).
SPARE = ["Once upon a time there was", "1, 2, 3, 4, 5, 6, 7,", "Paris is the capital of"]
PATHS = {"exact": ["-fa", "off", "-ctk", "f32", "-ctv", "f32"], "default": []}
N_PREDICT = 32
# `draft candidate   0, pos   1:    283 (   0.315) 'ke'`
CAND = re.compile(rb"draft candidate +(\d+), pos +(\d+): +(\d+) \( *([0-9.]+)\)")
STEP_END = re.compile(rb"accepted +\d+/ *\d+ draft tokens")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def parse(log: bytes, t: dict) -> list:
    """Each step's drafted tokens and their probabilities, from the debug log."""
    drafts, cur = [], []
    for line in log.splitlines():
        m = CAND.search(line)
        if m and m.group(1) == b"0":
            assert int(m.group(2)) == len(cur), line
            cur.append([int(m.group(3)), float(m.group(4))])
        elif STEP_END.search(line):
            drafts.append(cur)
            cur = []
    if cur:
        drafts.append(cur)
    # The drafter drafts --spec-draft-n-max tokens and the server keeps what
    # fits the request (n_predict): the last steps' drafts are cut after the
    # log, so `drafts` holds each step's whole draft and draft_n what was kept.
    assert sum(len(d) for d in drafts) >= t["draft_n"], (drafts, t)
    return drafts


def serve(bin_dir: str, model: str, flags: list[str], prompts: list[str], cache: bool) -> list[dict]:
    """One llama-server, the prompts one after another on its one slot."""
    port = free_port()
    log = f"/tmp/mtp-goldens-{port}.log"
    out = []
    with open(log, "wb") as f:
        srv = subprocess.Popen([f"{bin_dir}/llama-server", "-m", model, "--spec-type", "draft-mtp",
                                "-t", "2", "-c", "512", "-np", "1", "--port", str(port), "-v",
                                *flags], stdout=f, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        for prompt in prompts:
            at = os.path.getsize(log)
            r = post(port, "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                                           "return_tokens": True, "cache_prompt": cache})
            time.sleep(0.5)  # the log is written by a thread of its own
            with open(log, "rb") as f:
                f.seek(at)
                text = f.read()
            toks = post(port, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
            t = r["timings"]
            out.append({"prompt": prompt, "prompt_tokens": toks, "tokens": r["tokens"],
                        "cache_n": t["cache_n"], "draft_n": t["draft_n"],
                        "draft_n_accepted": t["draft_n_accepted"], "drafts": parse(text, t)})
    finally:
        srv.terminate()
        srv.wait()
    return out


def isa():
    """The x86 kernels ggml's native build takes here: "avx512" with
    AVX-512 F, BW, VL and VNNI (as longhaul's CpuCaps), else "avx2"."""
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    need = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # /proc/cpuinfo names
    return "avx512" if need <= set(flags) else "avx2"


def main():
    bin_dir, model, out = sys.argv[1:4]
    runs = []
    for name, flags in PATHS.items():
        todo, done = PROMPTS + SPARE, 0
        for p in todo:
            if done == len(PROMPTS):
                break
            try:
                runs += [{"path": name, **r} for r in serve(bin_dir, model, flags, [p], False)]
                done += 1
            except urllib.error.HTTPError as e:
                print(f"{name} {p!r}: llama-server answered {e.code}; next prompt", file=sys.stderr)
    # A cached prompt: the second request shares the first one's prompt (not
    # its reply), so the slot keeps that prefix and evaluates the rest.
    first = PROMPTS[2]
    try:
        runs += [{"path": "default-cached", **r}
                 for r in serve(bin_dir, model, [], [first, first + " jumps again"], True)]
    except urllib.error.HTTPError as e:
        print(f"cached: llama-server answered {e.code}; no cached runs", file=sys.stderr)
    for r in runs:
        print(f"{r['path']}: {len(r['tokens'])} tokens, {r['draft_n']} drafted, "
              f"{r['draft_n_accepted']} accepted, {r['cache_n']} cached", file=sys.stderr)
    doc = {"model": model.rsplit("/", 1)[-1], "n_predict": N_PREDICT,
           "made_by": "tools/mtp_goldens.py (llama-server --spec-type draft-mtp, llama-cpp-python 0.3.36)",
           "isa": isa(), "runs": runs}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
