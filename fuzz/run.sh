#!/usr/bin/env bash
# Runs every fuzz target (or those named) for a fixed number of executions and prints, per
# target, the executions done, the crashes found and the wall time. See fuzz/README.md.
#
#   fuzz/run.sh [--smoke] [RUNS] [TARGET...]
#
# RUNS defaults to 200000 (--smoke: 3000, for CI). Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz --locked`) and python3 (for the corpus). Builds into
# $CARGO_TARGET_DIR (default /var/tmp/fuzz-target). Exits 1 when any target crashed; the
# crashing inputs are in fuzz/artifacts/TARGET/.
set -euo pipefail

cd "$(dirname "$0")/.."
ALL_TARGETS=(diff_reader log_parsers jsonl_rows parquet_rows sweep_toml)
runs=200000
targets=()
for arg in "$@"; do
    case "$arg" in
        --smoke) runs=3000 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        ''|*[!0-9]*) targets+=("$arg") ;;
        *) runs="$arg" ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

max_len() {
    case "$1" in
        parquet_rows) echo 8192 ;;
        sweep_toml) echo 4096 ;;
        *) echo 16384 ;;
    esac
}

target_dir="${CARGO_TARGET_DIR:-/var/tmp/fuzz-target}"
# No sanitizer (the code under test is safe Rust; -rss_limit_mb catches runaway allocation),
# release with debug assertions and overflow checks.
build_flags=(-s none --codegen-units 16 --target-dir "$target_dir")
nice=()
command -v nice >/dev/null && nice=(nice -n 19)

"${nice[@]}" cargo +nightly fuzz build "${build_flags[@]}"
bin_dir="$target_dir/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
python3 fuzz/make_corpus.py >/dev/null

logs="$(mktemp -d)"
# parquet_rows leaves its input file (one per process) behind.
trap 'rm -rf "$logs" /dev/shm/reprobench-fuzz-*.parquet "${TMPDIR:-/tmp}"/reprobench-fuzz-*.parquet' EXIT
failed=0
summary=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/artifacts/$t"
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    start=$(date +%s.%N)
    status=0
    dict=()
    [ -f "fuzz/dicts/$t.dict" ] && dict=(-dict="fuzz/dicts/$t.dict")
    # The binary `cargo fuzz run` would start, run directly so the time is the fuzzing alone.
    "${nice[@]}" "$bin_dir/$t" -runs="$runs" -max_len="$(max_len "$t")" -timeout=10 \
        -rss_limit_mb=2048 "${dict[@]}" -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" "fuzz/corpus/$t" >"$logs/$t" 2>&1 || status=$?
    end=$(date +%s.%N)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t" | tail -1)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$logs/$t" | tail -1 | tr -d '#')
    crashes=$(( $(ls "fuzz/artifacts/$t" | wc -l) - before ))
    if [ "$status" -ne 0 ]; then
        failed=1
        [ "$crashes" -gt 0 ] || crashes="? (exit $status)"
        echo "---- $t failed; the end of its log:" >&2
        tail -n 40 "$logs/$t" >&2
    fi
    line=$(printf '%-14s executions %10s   crashes %s   time %6.1fs' \
        "$t" "${execs:-?}" "$crashes" "$(awk "BEGIN { print $end - $start }")")
    echo "$line"
    summary+=("$line")
done
echo "== fuzz summary (runs=$runs per target)"
printf '%s\n' "${summary[@]}"
exit "$failed"
