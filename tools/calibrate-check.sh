#!/usr/bin/env bash
# Synthetic ground truth for `hetflow calibrate --measured`: on each cluster, 48 plans are
# simulated under a hidden calibration (per GPU type efficiencies, the task overhead, link
# bandwidth factors); `calibrate --measured --design 8` chooses, before anything is
# "measured", the 8 of the 48 whose step times best determine the parameters (at the prior);
# calibrate sees only those 8 plans' step times, and the fitted calibration must give back the
# hidden parameters and predict the other 40 plans' times. Prints the plans chosen, every
# hidden parameter against the fitted one, the fit's warnings (parameters it cannot tell
# apart), and MAPE and Spearman over the 40.
#
#   bash tools/calibrate-check.sh [--clusters hetpipe-testbed,tools/examples/v100-t4.yaml] [--starts 3]
#
# Exit 0 when every fitted parameter is within 5 % and the 40 are ranked with Spearman >= 0.9
# and MAPE <= 5 % on every cluster; 1 otherwise.
set -euo pipefail
HETFLOW=${HETFLOW:-build/tools/hetflow}
clusters=hetpipe-testbed,tools/examples/v100-t4.yaml
starts=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clusters) clusters=$2; shift 2 ;;
    --starts) starts=$2; shift 2 ;;
    *) echo "calibrate-check: unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
exec /usr/bin/python3 - "$HETFLOW" "$clusters" "$work" "$starts" <<'PY'
import itertools, json, subprocess, sys
hetflow, clusters, work, starts = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
model = "gpt:layers=8,hidden=512,heads=8,seq=256,vocab=8192"
# Hidden truths: efficiencies well below the prior's 0.6, an overhead 3x the prior's, slower links.
hidden = {
    "hetpipe-testbed": {"gpus": {"TITAN-V": 0.45, "TITAN-RTX": 0.5, "RTX-2060": 0.4, "Quadro-P4000": 0.35},
                        "overhead_us": 60, "links": {"pcie": 0.7, "nic": 0.5}},
    "v100-t4": {"gpus": {"V100-16": 0.45, "T4": 0.35}, "overhead_us": 60, "links": {"nvlink": 0.8, "pcie": 0.7, "nic": 0.5}},
}

def yaml_of(h):
    gpus = "".join(f"  {g}: {{max_efficiency: {e}, overhead: {h['overhead_us']} us}}\n" for g, e in h["gpus"].items())
    links = "".join(f"  {l}: {{bandwidth_factor: {f}, latency_factor: 1}}\n" for l, f in h["links"].items())
    return f"default_gpu: {{overhead: {h['overhead_us']} us}}\ngpus:\n{gpus}links:\n{links}"

# 48 layouts per cluster: pipeline depth x micro-batch size x micro-batches x schedule (32),
# and 4 stages (one node each) with one stage given 6 of the 10 layers (the 8 blocks, the
# embedding, the head). Uniform stages leave the slowest GPU type the bottleneck; the uneven
# ones make each type the bottleneck in turn, which is what lets step times tell the types
# apart. On v100-t4 half of the uneven ones give way to tensor parallelism inside a node: the
# only plans whose times depend much on NVLink (the V100 nodes) and PCIe (the T4 node), whose
# factors data-parallel rings across the NICs leave undetermined.
base = [f"--pipeline {p} --micro-batch {b} --microbatches {m} --schedule {s}"
        for p, b, m, s in itertools.product([1, 2, 4, 8], [1, 2], [2, 8], ["1f1b", "gpipe"])]
uneven = lambda mbs, ms: [f"--pipeline 4 --stage-layers {c} --micro-batch {b} --microbatches {m}"
                          for c, b, m in itertools.product(["6,2,1,1", "1,6,2,1", "1,2,6,1", "1,1,2,6"], mbs, ms)]
tensor = [f"--pipeline {p} --tensor {t} --micro-batch {b} --microbatches 8"
          for (p, t), b in itertools.product([(4, 4), (4, 2), (2, 2), (1, 4)], [1, 4])]
pools = {"hetpipe-testbed": base + uneven([1, 4], [2, 8]), "v100-t4": base + uneven([1, 4], [8]) + tensor}
def step_s(cluster, layout, calibration):
    out = subprocess.run([hetflow, "simulate", "--cluster", cluster, "--model", model, *layout.split(),
                          "--iterations", "2", "--calibration", calibration, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["iteration_time_s"]

def ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0] * len(x)
    for k, i in enumerate(order):
        r[i] = k
    return r

def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))

ok = True
for cluster in clusters:
    name = cluster.rsplit("/", 1)[-1].removesuffix(".yaml")
    h = hidden[name]
    layouts = pools[name]
    with open(f"{work}/{name}-candidates.csv", "w") as f:
        f.write("cluster,model,options\n")
        for l in layouts:
            f.write(f'{cluster},"{model}","{l}"\n')
    design = json.loads(subprocess.run([hetflow, "calibrate", "--measured", f"{work}/{name}-candidates.csv", "--design", "8",
                                        "--fit", "efficiency,overhead,bandwidth", "-o", f"{work}/{name}-chosen.csv", "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    train_index = [c["index"] for c in design["chosen"]]
    truth = f"{work}/{name}-hidden.yaml"
    open(truth, "w").write(yaml_of(h))
    times = [step_s(cluster, l, truth) for l in layouts]
    table = f"{work}/{name}-runs.csv"
    with open(table, "w") as f:
        f.write("cluster,model,options,step_s\n")
        for i in train_index:
            f.write(f'{cluster},"{model}","{layouts[i]}",{times[i]!r}\n')
    fitted = f"{work}/{name}-fitted.yaml"
    fit = json.loads(subprocess.run([hetflow, "calibrate", "--measured", table, "--fit", "efficiency,overhead,bandwidth",
                                     "--folds", "0", "--starts", starts, "-o", fitted, "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    print(f"{cluster}: {len(train_index)} measured plans, chosen by calibrate --design ({design['evaluations']} simulations):")
    for i in train_index:
        print(f"  {layouts[i]}")
    print(f"  fitted from {fit['starts']} starts, {fit['evaluations']} simulations")
    want = {f"{g}.max_efficiency": e for g, e in h["gpus"].items()}
    want["overhead"] = h["overhead_us"] * 1e-6
    want.update({f"{l}.bandwidth_factor": f for l, f in h["links"].items()})
    got = {p["name"]: p for p in fit["parameters"]}
    for n, w in want.items():
        if n in got:
            err = got[n]["value"] / w - 1
            ok &= abs(err) <= 0.05
            print(f"  {n:28s} hidden {w:10.4g}  fitted {got[n]['value']:10.4g}  {100 * err:+7.2f} %")
        else:
            ok = False
            print(f"  {n:28s} hidden {w:10.4g}  not fitted (the 8 runs do not determine it)")
    for wmsg in fit["warnings"]:
        print(f"  warning: {wmsg}")
    others = [i for i in range(len(layouts)) if i not in train_index]
    predicted = [step_s(cluster, layouts[i], fitted) for i in others]
    measured = [times[i] for i in others]
    mape = sum(abs(p / m - 1) for p, m in zip(predicted, measured)) / len(others)
    rho = spearman(predicted, measured)
    ok &= mape <= 0.05 and rho >= 0.9
    print(f"  {len(others)} other plans: MAPE {100 * mape:.2f} %, Spearman {rho:.3f}")
print("all within the goals" if ok else "NOT within the goals (5 % per parameter, MAPE <= 5 %, Spearman >= 0.9)")
sys.exit(0 if ok else 1)
PY
