#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz long, with AddressSanitizer and
# UndefinedBehaviorSanitizer: configures and builds the `fuzz` preset (clang), then runs each
# target on its seed corpus, one after another, and prints per target the executions, the
# time, the coverage and what it found.
#
#   bash tools/fuzz.sh [options] [READER...]
#     READERs: cluster network hf_config calibration plan trace chakra cli safetensors safetensors_index token_file
#     --runs N        stop a target after N executions (default 1000000)
#     --time S        ... or after S seconds (default 1800)
#     --max-len B     longest input libFuzzer makes (default: libFuzzer's, from the corpus)
#     --jobs N        build jobs (default 2)
#
# New inputs libFuzzer keeps go to build-fuzz/tests/fuzz/work/<reader>/ (the seeds in
# tests/fuzz/corpus/ stay as they are); a crash, timeout or out-of-memory input is written to
# build-fuzz/tests/fuzz/findings/<reader>/ and named in the summary. Rerun one input with
# `build-fuzz/tests/fuzz/fuzz_<reader> FILE`; see tests/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=1000000
seconds=1800
max_len=""
jobs=2
readers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --time) seconds="$2"; shift 2 ;;
    --max-len) max_len="-max_len=$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) readers+=("$1"); shift ;;
  esac
done
all=(cluster network hf_config calibration plan trace chakra cli safetensors safetensors_index token_file)
[ ${#readers[@]} -eq 0 ] && readers=("${all[@]}")
for r in "${readers[@]}"; do
  case " ${all[*]} " in *" $r "*) ;; *) echo "fuzz.sh: no fuzz target '$r' (${all[*]})" >&2; exit 2 ;; esac
done

command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ is needed (Debian: apt-get install clang)" >&2; exit 2; }
mkdir -p build-fuzz
if ! cmake --preset fuzz > build-fuzz/configure.log 2>&1; then
  cat build-fuzz/configure.log >&2
  exit 1
fi
targets=()
for r in "${readers[@]}"; do targets+=("fuzz_$r"); done
cmake --build build-fuzz -j "$jobs" --target "${targets[@]}" || exit 1

dict_of() {
  case "$1" in
    cluster|network|calibration) echo tests/fuzz/yaml.dict ;;
    *) echo "tests/fuzz/$1.dict" ;;
  esac
}

dir=build-fuzz/tests/fuzz
summary=()
status=0
for r in "${readers[@]}"; do
  work="$dir/work/$r"
  findings="$dir/findings/$r"
  log="$dir/fuzz-$r.log"
  mkdir -p "$work" "$findings"
  echo "== fuzz_$r: up to $runs executions or $seconds s (log: $log)"
  start=$(date +%s)
  "$dir/fuzz_$r" -runs="$runs" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -seed=1 \
    -print_final_stats=1 -dict="$(dict_of "$r")" $max_len -artifact_prefix="$findings/" \
    "$work" "tests/fuzz/corpus/$r" > "$log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -oE '(cov|ft): [0-9]+' "$log" | tail -2 | tr '\n' ' ')
  found=$(ls "$findings" 2>/dev/null | tr '\n' ' ')
  line=$(printf '%-12s execs %-9s time %5ss  exec/s %-6s %s findings: %s' "$r" "${execs:-?}" "$elapsed" \
    "$(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))" "$cov" "${found:-none}")
  if [ $rc -ne 0 ]; then
    status=1
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*fuzz check failed|refusal)' "$log" | head -5
  fi
  echo "$line"
  summary+=("$line")
done
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
