#!/usr/bin/env bash
# Walks the README's quick start as a new user would, on a fresh build, with a model folder
# as HuggingFace releases it (config.json and tokenizer files, no weights): each of the five
# commands must exit 0 and print the figures the README shows. Registered with CTest
# (newcomer.quickstart); by hand:
#
#   bash tests/newcomer/quickstart.sh [path/to/hetflow]     (default build/tools/hetflow)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
hetflow="$(realpath "${1:-$root/build/tools/hetflow}")"
[ -x "$hetflow" ] || { echo "quickstart: $hetflow not built" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

# Llama 3.2 1B as downloaded from the Hub, less its weights (config.json as released).
mkdir Llama-3.2-1B
cat > Llama-3.2-1B/config.json <<'JSON'
{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
}
JSON
echo '{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}' > Llama-3.2-1B/tokenizer.json
echo '{"bos_token": "<|begin_of_text|>", "model_max_length": 131072}' > Llama-3.2-1B/tokenizer_config.json
echo '{"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}' > Llama-3.2-1B/special_tokens_map.json
echo '{"bos_token_id": 128000, "eos_token_id": 128001}' > Llama-3.2-1B/generation_config.json

failures=0
# step NAME EXPECTED-TEXT... : the last command's output must hold each text.
expect() {
  local name="$1" out="$2"
  shift 2
  for text in "$@"; do
    if ! grep -qF -- "$text" "$out"; then
      echo "quickstart: $name: expected '$text' in its output:" >&2
      sed 's/^/    /' "$out" >&2
      failures=$((failures + 1))
    fi
  done
}
run() {
  local name="$1"
  shift
  if ! "$hetflow" "$@" > "$name.out" 2>&1; then
    echo "quickstart: $name failed (exit $?): hetflow $*" >&2
    sed 's/^/    /' "$name.out" >&2
    exit 1
  fi
}

# 1. describe: the cluster and the network as hetflow reads them.
run describe describe --cluster mixed-academic --model Llama-3.2-1B --seq-length 2048
expect describe describe.out "20 GPUs in 4 nodes, 1 region" \
  "network llama(Llama-3.2-1B) (seq 2048): decoder L=16 h=2048 heads=32 s=2048 vocab=128256" \
  "parameters            1.24 B (1235814400)" "FLOPs per sample      forward 5.61 TFLOP, backward 11.2 TFLOP, training 16.8 TFLOP"
# Without --seq-length the config's 131,072 positions are said to be the longest context.
run describe_default_seq describe --cluster mixed-academic --model Llama-3.2-1B
expect describe_default_seq describe_default_seq.out "131072 tokens per sample, the config's max_position_embeddings" \
  "--seq-length sets the length you train at"

# 2. search: the best plan for a global batch of 64 sequences, beside the baselines.
run search search --cluster mixed-academic --model Llama-3.2-1B --seq-length 2048 --global-batch 64 --out plan.json
expect search search.out \
  "best: balanced t2 p10 d1, mb 1, gpipe, recompute selective, allreduce, 1.27 s per iteration; 2.37x as fast as uniform (Megatron)" \
  "wrote plan.json"

# 3. simulate the plan it wrote, keeping the trace.
run simulate simulate --plan plan.json --trace trace.csv
expect simulate simulate.out "  iteration time     1.27 s   (analytic critical path 995 ms)" \
  "  MFU                30.2 % of the cluster's peak" "wrote trace.csv (18220 events)"

# 4. timeline: the trace as a picture.
run timeline timeline trace.csv -o timeline.svg
expect timeline timeline.out "wrote timeline.svg (timeline of 20 of 20 devices, iteration 0 of 1, 18220 events, 1.27 s)"
grep -q "<svg" timeline.svg || { echo "quickstart: timeline.svg is not an SVG picture" >&2; failures=$((failures + 1)); }

# 5. run a small decoder of the same family for real on two CPU devices (losses are bitwise
#    reproducible on the CPU back end; times are not, and are not checked).
run run run --cluster cpu-2 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,seq=64,vocab=256 --pipeline 2 --steps 3
expect run run.out "step   0" "loss 5.582211   (warm-up)" "loss 5.539441" "loss 5.539215"

if [ "$failures" -gt 0 ]; then
  echo "quickstart: $failures figure(s) differ from the README's quick start" >&2
  exit 1
fi
echo "quickstart: the README's five commands ran and printed the README's figures"
