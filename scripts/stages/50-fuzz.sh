# The libFuzzer targets (tests/fuzz/), built with clang, ASan and UBSan in
# their own build directory, each run for a bounded number of executions
# from the committed corpus (tests/fuzz/corpus/<target>/), which is only
# read: new inputs go to a scratch directory. A crash, a leak, a sanitizer
# report or a failed invariant stops the stage and leaves the input in
# $dir/artifacts. docs/reliability.md says how to run them longer.
#
#   DDHEAP_FUZZ_RUNS   executions per target (default: 100000 for fuzz_ops,
#                      500000 for fuzz_forge, which is about 30 times faster)
#   DDHEAP_FUZZ_SEED   libFuzzer's seed (default 1, so CI runs repeat)
#
# With the seed fixed, every CI run of unchanged code executes the same
# inputs: what the stage guards is the corpus (replayed in full each time)
# and a short, repeatable exploration from it. Searching for new inputs is
# done by running longer, by hand (docs/reliability.md, "Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${DDHEAP_BUILD_ROOT:-build-ci}
dir=$root/fuzz
seed=${DDHEAP_FUZZ_SEED:-1}

opts=(-Dbuildtype=debugoptimized -Dfuzzers=true -Db_sanitize=address,undefined -Db_lundef=false
      -Dbench=false -Dexamples=false)
CC=clang meson setup --wipe "$dir" "${opts[@]}" >/dev/null 2>&1 || CC=clang meson setup "$dir" "${opts[@]}"
meson compile -C "$dir" tests/fuzz/fuzz_ops tests/fuzz/fuzz_forge
# fuzz_ops once more over shadow marking (fuzz_forge attacks headers, which
# that scheme does not have).
shadow_dir=$root/fuzz-shadow
CC=clang meson setup --wipe "$shadow_dir" "${opts[@]}" -Dmarking=shadow >/dev/null 2>&1 ||
  CC=clang meson setup "$shadow_dir" "${opts[@]}" -Dmarking=shadow
meson compile -C "$shadow_dir" tests/fuzz/fuzz_ops

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# A small quarantine keeps the RSS (and the 2-core CI machine) comfortable.
export ASAN_OPTIONS=quarantine_size_mb=16:detect_leaks=1
fuzz() { # build dir, target, label
  local build=$1 target=$2 label=$3
  local default_runs=100000
  [ "$target" = forge ] && default_runs=500000
  local runs=${DDHEAP_FUZZ_RUNS:-$default_runs}
  mkdir -p "$build/artifacts"
  local scratch
  scratch=$(mktemp -d)
  local start=$SECONDS
  # The fuzzer's own status, whether or not grep finds a line to show (with
  # '|| true', PIPESTATUS would be true's whenever grep found none).
  local status=0
  "$build/tests/fuzz/fuzz_$target" -runs="$runs" -seed="$seed" -max_len=1024 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
    "$scratch" "tests/fuzz/corpus/$target" 2>&1 |
    grep -E '^(Done|stat::number_of_executed_units|INFO: seed|==|SUMMARY|fuzz_)' || status=${PIPESTATUS[0]}
  rm -rf "$scratch"
  if [ "$status" -ne 0 ]; then
    echo "50-fuzz: $label failed (status $status); input in $build/artifacts/" >&2
    exit 1
  fi
  echo "50-fuzz: $label: $runs executions in $((SECONDS - start)) s, no failure"
}
fuzz "$dir" ops fuzz_ops
fuzz "$dir" forge fuzz_forge
fuzz "$shadow_dir" ops "fuzz_ops (shadow marking)"
