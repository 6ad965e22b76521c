#!/usr/bin/env bash
# Regenerate tests/goldens/tokenize/<model>.json and fuzz-<model>.json from llama.cpp's llama-tokenize.
#   Inputs : tests/goldens/tokenize/texts.json  ({"cases": [{name, text, parse_special, add_special}]})
#            and fuzz-texts.json (seeded random texts, from tools/tokenize_fuzz_texts.py)
#            and runs.json (long runs: text from "parts", ids written run-length encoded)
#   Models : $LONGHAUL_MODELS (default ~/.cache/longhaul/models), see tools/fetch-models.sh
#   Tools  : $LLAMACPP_BIN (default ~/.cache/longhaul/llama.cpp/build/bin), see tools/build-llamacpp.sh
# Each case is tokenized with `llama-tokenize -f <text file> --ids --log-disable --no-escape`,
# plus --no-bos unless add_special and --no-parse-special unless parse_special.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
models="${LONGHAUL_MODELS:-$HOME/.cache/longhaul/models}"
bin="${LLAMACPP_BIN:-$HOME/.cache/longhaul/llama.cpp/build/bin}"
tok="$bin/llama-tokenize"
[ -x "$tok" ] || { echo "missing $tok: run tools/build-llamacpp.sh" >&2; exit 1; }
dir="$root/tests/goldens/tokenize"

for model in smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m; do
for set in texts.json:"" fuzz-texts.json:fuzz- runs.json:runs-; do
  gguf="$models/$model.gguf"
  [ -f "$gguf" ] || { echo "missing $gguf: run tools/fetch-models.sh" >&2; exit 1; }
  python3 - "$tok" "$gguf" "$dir/${set%%:*}" "$dir/${set#*:}$model.json" "$model" <<'EOF'
import json, os, subprocess, sys, tempfile
tok, gguf, texts, out, model = sys.argv[1:]
cases = json.load(open(texts, encoding="utf-8"))["cases"]
version = subprocess.run([tok, "--version"], capture_output=True, text=True)
version = (version.stdout + version.stderr).strip().splitlines()
result = {"model": model + ".gguf",
          "tool": "llama-tokenize " + (version[0] if version else "?"),
          "cases": []}
for c in cases:
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".txt") as f:
        text = c["text"] if "text" in c else "".join(p * k for p, k in c["parts"])
        f.write(text.encode("utf-8"))
        path = f.name
    args = [tok, "-m", gguf, "-f", path, "--ids", "--log-disable", "--no-escape"]
    if not c["add_special"]:
        args.append("--no-bos")
    if not c["parse_special"]:
        args.append("--no-parse-special")
    p = subprocess.run(args, capture_output=True, text=True)
    os.unlink(path)
    if p.returncode != 0:
        sys.exit(f"llama-tokenize failed on {c['name']}: {p.stderr[-2000:]}")
    line = [l for l in p.stdout.splitlines() if l.startswith("[")][-1]
    ids = json.loads(line)
    if "parts" in c:  # long texts: ids run-length encoded, [id, repeats]
        rle = []
        for i in ids:
            if rle and rle[-1][0] == i:
                rle[-1][1] += 1
            else:
                rle.append([i, 1])
        result["cases"].append({**c, "ids_rle": rle})
    else:
        result["cases"].append({**c, "ids": ids})
with open(out, "w", encoding="utf-8") as f:  # one case per line keeps diffs readable
    head = json.dumps({k: result[k] for k in ("model", "tool")}, ensure_ascii=False)[:-1]
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in result["cases"])
    f.write(head + ', "cases": [\n' + body + "\n]}\n")
print(f"wrote {out} ({len(result['cases'])} cases)")
EOF
done
done
