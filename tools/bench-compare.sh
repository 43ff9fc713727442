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
# in a few minutes. Two times are compared: the benchmark's real (or manual) time, and its
# CPU time: the counter cpu_s where the benchmark reports one (its process's threads and its
# children's, tests/bench/bench_usage.hpp), else Google Benchmark's CPU time. On a machine
# shared with other work the real time follows the load: compare the CPU time. The load
# (uptime) is printed before and after. Environment variables reach both builds alike:
# MALLOC_CONF=dirty_decay_ms:-1 takes jemalloc's returning of freed pages out of the times.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
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
  benches=("plan_bench:BM_Gpt3_175b_1024Gpus_(Build|Validate|Estimate)/|BM_ReadPlanFile/32/"
           "sim_bench:BM_SimulateGpt3_175b/(64|1024)/|BM_MegatronTable1/(1|8)/"
           "search_bench:BM_FullSearch"
           "training_bench:BM_Train(OneDevice|Pipeline2)/")
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(uptime)"
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
echo "load after:  $(uptime)"
/usr/bin/python3 - "$out" "$rounds" <<'EOF'
import glob, json, statistics, sys, collections
scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
real, cpu, faults = (collections.defaultdict(lambda: collections.defaultdict(list)) for _ in range(3))
units = {}
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    side = path.rsplit("/", 1)[1].split("-", 1)[0]
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        name, unit = b["name"], b["time_unit"]
        units[name] = unit
        real[name][side].append(b["real_time"])
        # cpu_s is seconds per iteration; Google Benchmark's times are in the benchmark's unit.
        cpu[name][side].append(b["cpu_s"] / scale[unit] if "cpu_s" in b else b["cpu_time"])
        if "faults" in b:
            faults[name][side].append(b["faults"])
med = statistics.median
print(f"{sys.argv[2]} rounds, medians over the rounds; ratio new/old (above 1: the new build is slower)")
print(f"{'benchmark':52} {'real old':>11} {'real new':>11} {'ratio':>6}  {'cpu old':>11} {'cpu new':>11} {'ratio':>6}"
      f"  {'faults old':>10} {'new':>10}")
for name in real:
    if not real[name]["old"] or not real[name]["new"]:
        print(f"{name:52} only in the {'old' if real[name]['old'] else 'new'} build")
        continue
    u = units[name]
    ro, rn = med(real[name]["old"]), med(real[name]["new"])
    co, cn = med(cpu[name]["old"]), med(cpu[name]["new"])
    fo, fn = (f"{med(faults[name][side]):10.0f}" if faults[name][side] else f"{'-':>10}" for side in ("old", "new"))
    print(f"{name:52} {ro:9.3f}{u:>2} {rn:9.3f}{u:>2} {rn / ro:6.3f}  {co:9.3f}{u:>2} {cn:9.3f}{u:>2} {cn / co:6.3f}"
          f"  {fo} {fn}")
EOF
