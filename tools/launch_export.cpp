// tools/launch_export.hpp: each framework's launch from a plan's grid.
#include "tools/launch_export.hpp"

#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "model/error.hpp"
#include "model/units.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

namespace {

using Grid = LaunchGrid;


int transformer_layers(const model::Network& network, int begin, int end) {
  int n = 0;
  for (int i = begin; i < end; ++i) n += network.layers[static_cast<size_t>(i)].kind == "transformer";
  return n;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

Grid grid_of(const partition::Plan& plan) {
  const partition::Layout& l = plan.layout;
  Grid g;
  const partition::VirtualWorker& first = l.workers.front();
  g.context = l.size(partition::Axis::context);
  g.data = static_cast<int>(l.workers.size()) / g.context;
  g.pipeline = static_cast<int>(first.ranks.size());
  g.tensor = l.size(partition::Axis::tensor);
  g.virtual_stages = l.virtual_stages;
  g.micro_batch = l.micro_batch_size;
  g.microbatches = first.microbatches;
  g.global_batch = l.samples_per_iteration();
  for (const partition::Stage& s : first.stages) g.chunk_layers.push_back(transformer_layers(plan.network, s.layer_begin, s.layer_end));
  std::set<int> depths, batches;
  bool same_cuts = true;
  std::map<std::string, int> types;
  std::map<int, int> per_node;
  for (const partition::VirtualWorker& w : l.workers) {
    depths.insert(static_cast<int>(w.ranks.size()));
    batches.insert(w.microbatches);
    same_cuts = same_cuts && w.stages == first.stages;
    for (const auto& rank : w.ranks) {
      for (int d : rank) {
        const model::Device& device = plan.cluster.devices()[static_cast<size_t>(d)];
        ++types[plan.cluster.device_gpu(device).name];
        ++per_node[device.node];
      }
    }
  }
  g.nodes = static_cast<int>(per_node.size());
  std::set<int> counts;
  for (const auto& [node, n] : per_node) counts.insert(n);
  g.gpus_per_node = *counts.rbegin();
  if (depths.size() > 1) g.cannot.push_back("virtual workers of different pipeline depths (one pipeline size for all)");
  if (batches.size() > 1) g.cannot.push_back("different micro-batch counts per virtual worker (every data-parallel rank takes the same)");
  if (!same_cuts) g.cannot.push_back("different layer splits per virtual worker (one split for all replicas)");
  if (!l.uniform_tensor()) g.cannot.push_back("pipeline ranks of different tensor-parallel sizes (one size for all)");
  // Megatron deals tensor, context, data, pipeline (its --order tp-cp-ep-dp-pp), innermost first.
  if (partition::axis_order_text(l.axes) != "tensor,context,data,pipeline" &&
      partition::axis_order_text(l.axes) != partition::axis_order_text(partition::default_axes())) {
    g.cannot.push_back("devices placed " + partition::axis_order_text(l.axes) +
                       " (Megatron deals its ranks tensor, context, data, pipeline, innermost first)");
  }
  if (types.size() > 1) {
    std::string mix;
    for (const auto& [type, n] : types) mix += (mix.empty() ? "" : ", ") + std::to_string(n) + " x " + type;
    g.cannot.push_back("devices of different types (" + mix +
                       "): the framework treats them as equal; which rank runs where is the launcher's rank order");
  }
  if (counts.size() > 1) g.cannot.push_back("nodes with different numbers of GPUs used (one --nproc-per-node for all)");
  if (l.sync.zero.stage > 0 && l.sync.zero.shares == partition::ZeroShares::memory && types.size() > 1) {
    g.cannot.push_back("ZeRO shards in proportion to device memory (the frameworks shard every replica equally)");
  }
  if (l.sync.kind == partition::SyncKind::ps) g.cannot.push_back("parameter servers (sync ps): only all-reduce data parallelism");
  if (l.sync.kind == partition::SyncKind::wsp) {
    g.cannot.push_back("wave-synchronous parallelism (WSP, staleness " + std::to_string(l.sync.staleness) + "): only synchronous steps");
  }
  return g;
}

// Megatron-LM and DeepSpeed count gradient buckets in elements, not bytes.
long long bucket_elements(const partition::Layout& l) {
  const double element = l.fp32_grad_accumulation ? 4.0 : model::element_bytes(l.precision);
  return static_cast<long long>(l.sync.bucket_bytes / element);
}

bool equal_chunks(const Grid& g) {
  for (int n : g.chunk_layers) {
    if (n != g.chunk_layers.front()) return false;
  }
  return true;
}

// Megatron-Core's flags for a mixture of experts (tokens dispatched all-to-all, experts as
// grouped GEMMs) and for multi-head latent attention.
// Whether every multi-token prediction module runs in the chunk of the head, where
// Megatron-Core builds them (the last pipeline stage); true without modules.
bool mtp_with_the_head(const partition::Plan& plan) {
  const auto& layers = plan.network.layers;
  const int head = static_cast<int>(layers.size()) - 1;
  for (const partition::Stage& s : plan.layout.workers.front().stages) {
    if (s.layer_begin <= head && head < s.layer_end) {
      for (int i = 0; i < s.layer_begin; ++i) {
        if (layers[static_cast<size_t>(i)].kind == "mtp") return false;
      }
    }
  }
  return true;
}

void megatron_moe_and_mla(const model::TransformerConfig& a, std::vector<std::string>& args) {
  if (const model::MoeConfig& m = a.moe; m.experts > 0) {
    args.push_back("--num-experts " + std::to_string(m.experts) + " --moe-router-topk " +
                   std::to_string(m.experts_per_token) + " --moe-ffn-hidden-size " + std::to_string(m.expert_ffn) +
                   " --moe-grouped-gemm --moe-token-dispatcher-type alltoall");
    if (m.first_dense_layers > 0 || m.every > 1) {
      std::string pattern;  // one 0 (dense) or 1 (MoE) a layer, a Python list Megatron evaluates
      for (int i = 0; i < a.layers; ++i) pattern += std::string(i ? "," : "") + (m.is_moe_layer(i) ? "1" : "0");
      args.push_back("--moe-layer-freq \"[" + pattern + "]\"");
    }
    if (m.shared_experts > 0) {
      args.push_back("--moe-shared-expert-intermediate-size " + std::to_string(m.shared_experts * m.shared_width()));
    }
    if (m.router == model::MoeConfig::Router::sigmoid) {
      args.push_back("--moe-router-score-function sigmoid --moe-router-enable-expert-bias");
    } else if (!m.normalize_top_k) {
      args.push_back("--moe-router-pre-softmax");  // a softmax over every expert, the top-k's weights kept
    }
    if (m.routed_scale != 1) args.push_back("--moe-router-topk-scaling-factor " + model::units::format_number(m.routed_scale));
    args.push_back("--moe-aux-loss-coeff " + model::units::format_number(m.aux_loss_coef));
    if (m.capacity_factor > 0) args.push_back("--moe-expert-capacity-factor " + model::units::format_number(m.capacity_factor));
  }
  if (const model::MlaConfig& m = a.mla; m.enabled()) {
    args.push_back("--multi-latent-attention --kv-lora-rank " + std::to_string(m.kv_lora_rank) + " --qk-head-dim " +
                   std::to_string(m.qk_nope_head_dim) + " --qk-pos-emb-head-dim " + std::to_string(m.qk_rope_head_dim) +
                   " --v-head-dim " + std::to_string(m.v_head_dim));
    if (m.q_lora_rank > 0) args.push_back("--q-lora-rank " + std::to_string(m.q_lora_rank));
  }
  // Multi-token prediction: Megatron-Core places its modules on the last pipeline stage, as
  // the plan's uniform stages do.
  if (a.mtp_layers > 0) args.push_back("--mtp-num-layers " + std::to_string(a.mtp_layers));
}

void megatron(std::ostream& out, const partition::Plan& plan, Grid& g) {
  const partition::Layout& l = plan.layout;
  const model::TransformerConfig& a = *plan.network.architecture;
  std::vector<std::string> args = {
      "--tensor-model-parallel-size " + std::to_string(g.tensor), "--pipeline-model-parallel-size " + std::to_string(g.pipeline),
      "--micro-batch-size " + std::to_string(g.micro_batch), "--global-batch-size " + std::to_string(g.global_batch),
      "--num-layers " + std::to_string(a.layers), "--hidden-size " + std::to_string(a.hidden),
      "--num-attention-heads " + std::to_string(a.heads), "--seq-length " + std::to_string(a.seq),
      "--max-position-embeddings " + std::to_string(a.positions > 0 ? a.positions : a.seq)};
  if (a.ffn > 0) args.push_back("--ffn-hidden-size " + std::to_string(a.ffn));
  if (a.kv_heads > 0 && a.kv_heads != a.heads) args.push_back("--group-query-attention --num-query-groups " + std::to_string(a.kv_heads));
  if (a.gated_mlp) args.push_back("--swiglu");
  if (a.rms_norm) args.push_back("--normalization RMSNorm");
  if (!a.learned_positions) args.push_back("--position-embedding-type rope");
  if (!a.tied_embeddings) args.push_back("--untie-embeddings-and-output-weights");
  if (!a.biases) args.push_back("--disable-bias-linear");
  megatron_moe_and_mla(a, args);
  if (!mtp_with_the_head(plan)) {
    g.cannot.push_back("a multi-token prediction module off the head's pipeline stage (Megatron-Core builds them on the "
                       "last one)");
  }
  if (l.precision == model::Precision::fp16) args.push_back("--fp16");
  if (l.precision == model::Precision::bf16) args.push_back("--bf16");
  if (l.schedule == "interleaved" && g.virtual_stages > 1) {
    if (equal_chunks(g)) args.push_back("--num-layers-per-virtual-pipeline-stage " + std::to_string(g.chunk_layers.front()));
    else g.cannot.push_back("interleaved chunks of unequal sizes (" + joined(g.chunk_layers) + " layers)");
  } else if (!equal_chunks(g)) {
    // Megatron sets the first and the last stage apart; the others share the rest equally.
    const std::vector<int> middle(g.chunk_layers.begin() + 1, g.chunk_layers.end() - 1);
    bool even_middle = true;
    for (int n : middle) even_middle = even_middle && n == middle.front();
    if (even_middle) {
      args.push_back("--decoder-first-pipeline-num-layers " + std::to_string(g.chunk_layers.front()));
      args.push_back("--decoder-last-pipeline-num-layers " + std::to_string(g.chunk_layers.back()));
    } else {
      g.cannot.push_back("stages of unequal sizes (" + joined(g.chunk_layers) +
                         " layers): only the first and the last stage may differ from the others");
    }
  }
  if (l.schedule == "gpipe") g.cannot.push_back("the GPipe schedule (Megatron runs 1F1B or interleaved 1F1B)");
  if (l.schedule == "1f1b-split-w") g.cannot.push_back("the zero-bubble schedule 1f1b-split-w (Megatron runs 1F1B or interleaved 1F1B)");
  if (l.recompute == partition::Recompute::full) {
    args.push_back("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  }
  if (l.recompute == partition::Recompute::selective) args.push_back("--recompute-granularity selective");
  if (l.sequence_parallel) args.push_back("--sequence-parallel");
  if (g.context > 1) {
    // Megatron's p2p is the ring of send/recv overlapped with attention; all_gather Llama 3's.
    const bool ring = l.context_comm == partition::ContextComm::ring;
    args.push_back("--context-parallel-size " + std::to_string(g.context) + " --cp-comm-type " + (ring ? "p2p" : "all_gather"));
  }
  if (l.experts.parallel > 1) {
    // Megatron-Core's expert groups are consecutive data-parallel ranks too (--order tp-cp-ep-dp-pp).
    args.push_back("--expert-model-parallel-size " + std::to_string(l.experts.parallel));
  }
  if (!l.experts.placement.empty()) {
    g.cannot.push_back("an expert placement other than contiguous (Megatron gives each expert rank experts / EP "
                       "consecutive experts)");
  }
  if (l.sync.overlap_grad_reduce) args.push_back("--overlap-grad-reduce");
  if (l.sync.zero.stage == 1) args.push_back("--use-distributed-optimizer");
  if (l.sync.zero.stage > 1) {
    g.cannot.push_back("ZeRO stage " + std::to_string(l.sync.zero.stage) +
                       " (Megatron's distributed optimizer shards the optimizer state alone: stage 1)");
  }
  if (l.offload.optimizer) {
    // Megatron-Core's HybridDeviceOptimizer, which offloads the distributed optimizer's state.
    args.push_back("--optimizer-cpu-offload --optimizer-offload-fraction 1.0");
    if (l.sync.zero.stage != 1) args.push_back("--use-distributed-optimizer");
    if (l.sync.zero.stage == 0 && g.data > 1) {
      g.cannot.push_back("optimizer offload with every replica's state whole (Megatron offloads the distributed "
                         "optimizer's shards: --use-distributed-optimizer written)");
    }
  }
  if (l.offload.activations) {
    g.cannot.push_back("activation offload (Megatron-Core's TransformerConfig cpu_offloading and "
                       "cpu_offloading_activations, set in the model's config, not written here)");
  }
  if (g.data > 1) args.push_back("--ddp-bucket-size " + std::to_string(bucket_elements(l)));
  if (l.fp32_grad_accumulation) args.push_back("--accumulate-allreduce-grads-in-fp32");
  if (l.kernels.flash_attention) args.push_back("--use-flash-attn");
  if (!l.kernels.fused_softmax) args.push_back("--no-masked-softmax-fusion");
  if (!l.kernels.fused_bias_gelu) args.push_back("--no-bias-gelu-fusion");
  if (!l.kernels.fused_bias_dropout_add) args.push_back("--no-bias-dropout-fusion");
  out << "torchrun --nnodes " << g.nodes << " --nproc-per-node " << g.gpus_per_node << " pretrain_gpt.py \\\n";
  for (size_t i = 0; i < args.size(); ++i) out << "    " << args[i] << (i + 1 < args.size() ? " \\\n" : "\n");
}

void deepspeed(std::ostream& out, const partition::Plan& plan, Grid& g) {
  const partition::Layout& l = plan.layout;
  Json config;
  config["train_batch_size"] = g.global_batch;
  config["train_micro_batch_size_per_gpu"] = g.micro_batch;
  // DeepSpeed requires train_batch_size = micro-batch x accumulation steps x data-parallel size.
  const bool even = g.global_batch % (g.micro_batch * g.data) == 0;
  config["gradient_accumulation_steps"] = even ? g.global_batch / (g.micro_batch * g.data) : g.microbatches;
  if (l.precision == model::Precision::fp16) config["fp16"] = {{"enabled", true}};
  if (l.precision == model::Precision::bf16) config["bf16"] = {{"enabled", true}};
  if (l.experts.parallel > 1) {
    g.cannot.push_back("expert parallelism " + std::to_string(l.experts.parallel) +
                       " (DeepSpeed-MoE takes ep_size in the model's MoE layers, not in this config)");
  }
  if (plan.network.architecture && plan.network.architecture->mtp_layers > 0) {
    g.cannot.push_back("multi-token prediction (mtp_layers " + std::to_string(plan.network.architecture->mtp_layers) +
                       "): DeepSpeed's config has no module for it");
  }
  config["zero_optimization"] = {
      {"stage", l.sync.zero.stage}, {"reduce_bucket_size", bucket_elements(l)}, {"overlap_comm", l.sync.overlap_grad_reduce}};
  if (l.offload.optimizer) {
    config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (l.sync.zero.stage == 0) {  // ZeRO-Offload runs under ZeRO
      config["zero_optimization"]["stage"] = 1;
      if (g.data > 1) {
        g.cannot.push_back("optimizer offload with every replica's state whole (ZeRO-Offload offloads each "
                           "replica's shard: stage 1 written)");
      }
    }
  }
  if (l.offload.activations) {
    // DeepSpeed offloads the checkpoints activation checkpointing keeps: full recomputation's
    // layer inputs, which are then the whole stash, as here.
    if (l.recompute == partition::Recompute::full) {
      config["activation_checkpointing"] = {{"partition_activations", true}, {"cpu_checkpointing", true}};
    } else {
      g.cannot.push_back("activation offload without full recomputation (DeepSpeed's cpu_checkpointing offloads "
                         "the checkpoints of activation checkpointing)");
    }
  }
  if (l.sync.zero.stage > 1 && g.pipeline > 1) {
    g.cannot.push_back("ZeRO stage " + std::to_string(l.sync.zero.stage) +
                       " under a pipeline (DeepSpeed's pipeline engine takes stage 1 at most)");
  }
  if (l.sync.zero.stage == 3 && !l.sync.zero.reshard_after_forward) {
    g.cannot.push_back("parameters kept gathered from the forward to the backward (FSDP's reshard_after_forward=False)");
  }
  out << "# ds_config.json\n" << config.dump(2) << "\n\n";
  out << "deepspeed --num_nodes " << g.nodes << " --num_gpus " << g.gpus_per_node
      << " train.py --deepspeed --deepspeed_config ds_config.json\n";
  if (g.pipeline > 1) {
    out << "\n# in train.py: the model as a pipeline of " << g.pipeline << " stages\n"
        << "model = deepspeed.pipe.PipelineModule(layers=..., num_stages=" << g.pipeline << ", partition_method=\"uniform\")\n";
    if (!equal_chunks(g)) g.cannot.push_back("stages of given sizes (" + joined(g.chunk_layers) + " layers): PipelineModule balances by its partition_method");
  }
  if (l.recompute != partition::Recompute::none) {
    out << "# recomputation: wrap each transformer layer in deepspeed.checkpointing.checkpoint\n";
  }
  if (l.recompute == partition::Recompute::selective) g.cannot.push_back("selective recomputation (attention only): DeepSpeed recomputes whole layers");
  if (g.tensor > 1) g.cannot.push_back("tensor parallelism (" + std::to_string(g.tensor) + "-way): DeepSpeed's config has no tensor-parallel size; Megatron-DeepSpeed's --tensor-model-parallel-size does it");
  if (l.sequence_parallel) g.cannot.push_back("sequence parallelism");
  if (g.context > 1) {
    g.cannot.push_back("context parallelism (" + std::to_string(g.context) +
                       "-way, keys and values all-gathered): DeepSpeed-Ulysses splits the sequence by attention heads "
                       "with all-to-alls, another exchange");
  }
  if (g.pipeline > 1 && l.schedule != "1f1b") g.cannot.push_back("the " + l.schedule + " schedule (DeepSpeed's pipeline engine runs its own 1F1B)");
}

void torchtitan(std::ostream& out, const partition::Plan& plan, Grid& g) {
  const partition::Layout& l = plan.layout;
  const model::TransformerConfig& a = *plan.network.architecture;
  out << "# hetflow.toml\n[training]\nlocal_batch_size = " << g.micro_batch * g.microbatches
      << "\nglobal_batch_size = " << g.global_batch << "\nseq_len = " << a.seq << "\n";
  if (l.precision == model::Precision::bf16) out << "mixed_precision_param = \"bfloat16\"\n";
  if (l.precision == model::Precision::fp32) out << "mixed_precision_param = \"float32\"\n";
  if (l.precision == model::Precision::fp16) g.cannot.push_back("fp16 (torchtitan's mixed precision is bfloat16 or float32)");
  if (a.mtp_layers > 0) {
    g.cannot.push_back("multi-token prediction (mtp_layers " + std::to_string(a.mtp_layers) +
                       "): torchtitan's config has no module for it");
  }
  out << "\n[parallelism]\ndata_parallel_replicate_degree = " << g.data << "\ndata_parallel_shard_degree = 1\n"
      << "tensor_parallel_degree = " << g.tensor << "\npipeline_parallel_degree = " << g.pipeline << "\n";
  if (g.context > 1) {
    // torchtitan rotates a ring's blocks with its "alltoall" method (a send to the next rank).
    const bool ring = l.context_comm == partition::ContextComm::ring;
    out << "context_parallel_degree = " << g.context << "\ncontext_parallel_rotate_method = \""
        << (ring ? "alltoall" : "allgather") << "\"\n";
  }
  if (l.experts.parallel > 1) out << "expert_parallel_degree = " << l.experts.parallel << "\n";
  if (g.pipeline > 1) {
    const std::map<std::string, std::string> schedules = {{"1f1b", "1F1B"}, {"gpipe", "GPipe"}, {"interleaved", "Interleaved1F1B"}};
    const auto s = schedules.find(l.schedule);
    if (s != schedules.end()) out << "pipeline_parallel_schedule = \"" << s->second << "\"\n";
    else g.cannot.push_back("the " + l.schedule + " schedule");
    out << "pipeline_parallel_microbatch_size = " << g.micro_batch << "\n";
    // The first transformer layer of every chunk but the first: torchtitan's split points.
    std::string points;
    int layer = 0;
    for (size_t k = 0; k + 1 < g.chunk_layers.size(); ++k) {
      layer += g.chunk_layers[k];
      points += std::string(points.empty() ? "" : ", ") + "\"layers." + std::to_string(layer) + "\"";
    }
    out << "pipeline_parallel_split_points = [" << points << "]\n";
  }
  const char* mode = l.recompute == partition::Recompute::full ? "full" : l.recompute == partition::Recompute::selective ? "selective" : "none";
  out << "\n[activation_checkpoint]\nmode = \"" << mode << "\"\n";
  if (l.recompute == partition::Recompute::selective) out << "selective_ac_option = \"op\"\n";
  out << "\ntorchrun --nnodes " << g.nodes << " --nproc_per_node " << g.gpus_per_node
      << " -m torchtitan.train --job.config_file hetflow.toml\n";
  if (g.tensor > 1 && !l.sequence_parallel) g.cannot.push_back("tensor parallelism without sequence parallelism (torchtitan's shards the norms' sequence)");
  if (l.offload.activations) g.cannot.push_back("activation offload");
  if (g.data > 1 && l.sync.bucket_bytes != 25.0 * 1024 * 1024) g.cannot.push_back("the all-reduce bucket size (torchtitan's data parallelism sets its own)");
}

}  // namespace

const std::vector<std::string>& launch_frameworks() {
  static const std::vector<std::string> frameworks = {"megatron", "deepspeed", "torchtitan"};
  return frameworks;
}

Launch export_launch(const partition::Plan& plan, const std::string& framework) {
  const auto& known = launch_frameworks();
  if (std::find(known.begin(), known.end(), framework) == known.end()) {
    throw Error("no launcher for the framework '" + framework + "'; known: megatron, deepspeed, torchtitan");
  }
  if (!plan.network.architecture || plan.network.architecture->encoder) {
    throw Error("the network '" + plan.network.name +
                "' is not a decoder built from its architecture; the frameworks' launchers train decoders");
  }
  Launch launch{grid_of(plan), {}};
  std::ostringstream body;
  if (framework == "megatron") megatron(body, plan, launch.grid);
  if (framework == "deepspeed") deepspeed(body, plan, launch.grid);
  if (framework == "torchtitan") torchtitan(body, plan, launch.grid);
  launch.text = body.str();
  return launch;
}

}  // namespace hetflow::tools
