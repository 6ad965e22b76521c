#!/usr/bin/env python3
"""Compare `longhaul serve` with llama-server on the same GGUF file.

1. Equality: the same greedy chat completion (and /apply-template rendering)
   from both servers must have the same text and token counts.
2. Throughput: aggregate generated tokens/s with 1, 4 and 8 concurrent
   streams (each server started with -np 8), llama-bench style.

Usage:
  tools/compare-llama-server.py [--model PATH] [--longhaul BIN] [--llama BIN]
                                [--threads 2] [--tokens 64] [--streams 1,4,8] [--reps 3]
Defaults: SmolLM2-135M-Instruct Q4_1 from ~/.cache/longhaul/models,
target/release/longhaul (run as `longhaul serve`), ~/.cache/longhaul/llama.cpp/build/bin/llama-server.
Only the Python standard library is used.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HOME = os.path.expanduser("~")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(url, body, timeout=600):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def post_stream(url, body):
    """Streams a chat completion; returns (text, n_chunks_with_content)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    text, n = [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                c = ch.get("delta", {}).get("content")
                if c:
                    text.append(c)
                    n += 1
    return "".join(text), n


def start(cmd, port, env=None):
    log = open(f"/tmp/compare-{port}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return p
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if p.poll() is not None:
            sys.exit(f"{cmd[0]} exited; see /tmp/compare-{port}.log")
        time.sleep(0.1)
    p.kill()
    sys.exit(f"{cmd[0]} did not become ready")


def throughput(base, n_streams, n_tokens):
    """Aggregate generated tokens/s of n_streams concurrent greedy requests."""
    results = [None] * n_streams
    prompts = [f"Write a long story about a robot number {i}." for i in range(n_streams)]

    def one(i):
        body = {
            "messages": [{"role": "user", "content": prompts[i]}],
            "max_tokens": n_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        results[i] = post(f"{base}/v1/chat/completions", body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_streams)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.time() - t0
    n = sum(r["usage"]["completion_tokens"] for r in results)
    return n / dt, n, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=f"{HOME}/.cache/longhaul/models/smollm2-135m-instruct-q4_1.gguf")
    ap.add_argument("--longhaul", default=f"{ROOT}/target/release/longhaul",
                    help="the longhaul binary (run as `longhaul serve`)")
    ap.add_argument("--llama", default=f"{HOME}/.cache/longhaul/llama.cpp/build/bin/llama-server")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--ctx", type=int, default=4096, help="total context (llama-server splits it over -np slots)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="runs per stream count; the median is shown")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]

    servers = {
        # llama-server's -c is the total over all slots; ours is per slot.
        "llama-server": [args.llama, "-m", args.model, "--port", "18181", "-t", args.threads,
                         "-c", str(args.ctx), "-np", str(args.np)],
        "longhaul-server": [args.longhaul, "serve", "-m", args.model, "--port", "18182", "-t", args.threads,
                            "-c", str(args.ctx // args.np), "-np", str(args.np), "--quiet"],
    }
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(args.llama) + ":" + env.get("LD_LIBRARY_PATH", "")
    question = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 40, "temperature": 0}
    out = {}
    for name, cmd in servers.items():
        port = int(cmd[cmd.index("--port") + 1])
        base = f"http://127.0.0.1:{port}"
        p = start(cmd, port, env)
        try:
            r = post(f"{base}/v1/chat/completions", question)
            tmpl = post(f"{base}/apply-template", {"messages": question["messages"]})["prompt"]
            s_text, _ = post_stream(f"{base}/v1/chat/completions", dict(question, stream=True))
            post(f"{base}/v1/chat/completions", dict(question, max_tokens=8))  # warm-up
            # Rounds over all stream counts, so drift on a shared machine
            # touches every count alike; the median round per count is kept.
            runs = {n: [] for n in streams}
            for _ in range(args.reps):
                for n in streams:
                    runs[n].append(throughput(base, n, args.tokens))
            tps = {n: sorted(r)[len(r) // 2] for n, r in runs.items()}
        finally:
            p.terminate()
            p.wait(timeout=30)
        out[name] = {"text": r["choices"][0]["message"]["content"], "streamed": s_text,
                     "usage": r["usage"], "finish": r["choices"][0]["finish_reason"],
                     "template": tmpl, "tps": tps}

    a, b = out["llama-server"], out["longhaul-server"]
    print(f"llama-server   : {a['text']!r} ({a['finish']}, {a['usage']['prompt_tokens']}+{a['usage']['completion_tokens']} tokens)")
    print(f"longhaul-server: {b['text']!r} ({b['finish']}, {b['usage']['prompt_tokens']}+{b['usage']['completion_tokens']} tokens)")
    same = (a["text"] == b["text"] and a["template"] == b["template"] and b["streamed"] == b["text"]
            and a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
            and a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"])
    print("template, tokens and greedy text equal:", same)
    print(f"\naggregate generated tokens/s (median of {args.reps}), {args.tokens} tokens per stream, -np {args.np}, -t {args.threads}")
    print(f"{'streams':>8} {'llama-server':>14} {'x 1 stream':>11} {'longhaul-server':>16} {'x 1 stream':>11}")
    for n in streams:
        ra = a['tps'][n][0] / a['tps'][streams[0]][0]
        rb = b['tps'][n][0] / b['tps'][streams[0]][0]
        print(f"{n:>8} {a['tps'][n][0]:>14.1f} {ra:>10.2f}x {b['tps'][n][0]:>16.1f} {rb:>10.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
