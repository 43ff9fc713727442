#!/bin/bash
# Speed side by side: the same benchmarks of two builds (say the previous main's and this
# one's), run one after the other in alternating rounds on one machine, so that a busy
# machine slows both alike. Prints each benchmark's median over the rounds for each build and
# their ratio (new / old: above 1 is slower).
#
#   tools/bench-compare.sh OLD_BUILD_DIR NEW_BUILD_DIR [--rounds N] [BENCH:FILTER ...]
#
# BENCH is a program under BUILD_DIR/tests (plan_bench, sim_bench, ...), FILTER a Google
# Benchmark filter. Without any, the four the plan-format issue names, filtered to what runs
# in a few minutes. The time compared is the benchmark's real (or manual) time.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
old=$1 new=$2
shift 2
rounds=3
if [[ ${1:-} == --rounds ]]; then
  rounds=$2
  shift 2
fi
benches=("$@")
if [[ ${#benches[@]} -eq 0 ]]; then
  benches=("plan_bench:BM_Gpt3_175b_1024Gpus_(Build|Validate|Estimate)$|BM_ReadPlanFile/32"
           "sim_bench:BM_SimulateGpt3_175b/(64|1024)/|BM_MegatronTable1/(1|8)/"
           "search_bench:BM_FullSearch"
           "training_bench:BM_Train(OneDevice|Pipeline2)/")
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((r = 0; r < rounds; ++r)); do
  for spec in "${benches[@]}"; do
    bench=${spec%%:*} filter=${spec#*:}
    for side in old new; do
      dir=$old
      [[ $side == new ]] && dir=$new
      "$dir/tests/$bench" --benchmark_filter="$filter" --benchmark_format=json >"$out/$side-$bench-$r.json" 2>/dev/null
    done
  done
done
/usr/bin/python3 - "$out" <<'EOF'
import glob, json, statistics, sys, collections
times = collections.defaultdict(lambda: collections.defaultdict(list))
units = {}
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    side = path.rsplit("/", 1)[1].split("-", 1)[0]
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        times[b["name"]][side].append(b["real_time"])
        units[b["name"]] = b["time_unit"]
print(f"{'benchmark':64} {'old':>12} {'new':>12}  new/old  (median of rounds, real time)")
for name, by in times.items():
    o, n = statistics.median(by["old"]), statistics.median(by["new"])
    print(f"{name:64} {o:10.3f}{units[name]:>2} {n:10.3f}{units[name]:>2}  {n / o:6.3f}")
EOF
