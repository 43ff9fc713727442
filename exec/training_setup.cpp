// exec::Training set up from a plan: its chunks and their parameters (initialised, or loaded
// from weights), the gradient spans each collective reduces, and the checks that refuse a
// plan real math cannot run.
#include "exec/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "exec/param_load.hpp"
#include "exec/plan_tensors.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/expert_shard.hpp"

namespace hetflow::exec {


using partition::TaskKind;
using partition::TensorKind;
using Floats = std::vector<float>;

namespace {

// Tensors a HuggingFace checkpoint carries that are not parameters.
bool is_buffer(const std::string& name) {
  for (const char* tail : {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"}) {
    const std::string t(tail);
    if (name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0) return true;
  }
  return false;
}

}  // namespace


namespace {

std::unique_ptr<WeightSource> in_memory(const SafetensorsFile* init, const std::string& path) {
  if (init == nullptr) return nullptr;
  return std::make_unique<InMemoryWeights>(*init, path);
}

}  // namespace


Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, const SafetensorsFile* init, const std::string& init_path, const Ranks* ranks)
    // (The wrapper lives until the delegated constructor returns: the end of this full-expression.)
    : Training(plan, std::move(data), optimizer, seed, Init{in_memory(init, init_path).get()}, ranks) {}

Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, const WeightSource& init, const Ranks* ranks)
    : Training(plan, std::move(data), optimizer, seed, Init{&init}, ranks) {}

Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, const ResumeFrom& resume, const Ranks* ranks)
    : Training(plan, std::move(data), optimizer, seed, Init{&resume.weights, &resume}, ranks) {}

Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, Init init_weights, const Ranks* ranks)
    : plan_(plan),
      ranks_(ranks != nullptr && !ranks->alone() ? ranks : nullptr),
      ops_of_([this](int device) -> const DecoderOps& { return *home_.at(static_cast<size_t>(device)); }),
      data_(std::move(data)),
      optimizer_options_(optimizer) {
  read_layout();
  make_chunks(seed);
  check_sequence_shards();
  find_send_slices();
  const WeightSource* init = init_weights.source;
  if (init != nullptr) load_weights(*init);
  if (init_weights.resume != nullptr) resume(*init_weights.resume);
  find_last_backwards();
  if (parameter_server_) {
    servers_.emplace(plan_, shape_, params_at_, [this](int d) { return local(d); }, seed, init, init_weights.resume);
  }
  if (parameter_server_ && optimizer_options_.loss_scale.loss_scale <= 0 && optimizer_options_.loss_scale.dynamic) {
    // A worker running ahead (WSP) would scale its gradients before the verdict that sets
    // the scale is known; a constant scale works.
    throw PlanError("dynamic loss scaling with parameter servers is not supported: give a constant --loss-scale");
  }
  map_norms();
  const int ep = plan_.layout.experts.parallel, context = std::max(1, plan_.layout.size(partition::Axis::context));
  weights_.emplace(shape_, ep, expert_placement_,
                   ep > 1 ? partition::expert_group(0, static_cast<int>(plan_.layout.workers.size()) / context, context, ep)
                          : std::vector<int>{});
  sync_.emplace(plan_, shape_, chunk_of_tensor_, tp_position_, [this](int d) { return local(d); }, zero_stage_);
  // A replica keeps the moments of its shard alone, from stage 2 its gradients too (the passes
  // add into transient whole buffers), from stage 3 its parameters (no pass reads the chunk's
  // own, only the all-gathers' copies).
  for (auto& c : chunks_) c->keep_owned_state(zero_stage_ >= 2, zero_stage_ >= 3);
}

// The plan's network and layout as real math needs them: the decoder's shape, each device's
// tensor-parallel position, each worker's first sample, the learning-rate schedule.
void Training::read_layout() {
  const partition::Plan& plan = plan_;
  if (!plan.network.architecture) {
    throw PlanError("the network '" + plan.network.name + "' has no transformer architecture: real math covers "
                    "GPT-2 and LLaMA style decoders (use --compute proxy)");
  }
  shape_ = decoder_shape(*plan.network.architecture);
  if (const int ep = plan.layout.experts.parallel; ep > 1) {
    const auto refuse = [&](const std::string& what) {
      throw PlanError("the plan splits its experts over expert groups of " + std::to_string(ep) +
                      " workers (layout.experts.parallel " + std::to_string(ep) + ") " + what +
                      ", which the real layers do not run yet: run it with --compute proxy, simulate it, or plan it "
                      "without --expert-parallel");
    };
    // (Every ZeRO stage runs: its pieces are runs of a chunk, GradientSync::map_zero.)
    if (plan.layout.folded) refuse("in a folded plan");
    expert_placement_ = partition::expert_split(plan.network, plan.layout).placement.rank_of;
  }
  for (int d = 0; d < plan.device_count(); ++d) home_.push_back(std::make_unique<CpuDecoderOps>());
  const partition::Layout& layout = plan.layout;
  parameter_server_ = layout.sync.kind != partition::SyncKind::allreduce;
  zero_stage_ = !parameter_server_ && layout.workers.size() > 1 ? layout.sync.zero.stage : 0;
  const int staleness = layout.sync.staleness;
  for (const partition::VirtualWorker& vw : layout.workers) {
    for (const auto& rank : vw.ranks) {
      for (size_t j = 0; j < rank.size(); ++j) tp_position_[rank[j]] = {static_cast<int>(j), static_cast<int>(rank.size())};
    }
  }
  if (static_cast<int>(plan_.network.layers.size()) != shape_.layers + 2) {
    throw PlanError("the plan's network has " + std::to_string(plan_.network.layers.size()) +
                    " layers where its architecture gives " + std::to_string(shape_.layers + 2));
  }
  // A context group's workers take the same samples (each its rows of them), and each adds
  // its tokens' losses. Forwards trail their loads by the prefetch and a step, WSP's
  // staleness more.
  feed_.emplace(layout, std::move(data_), shape_.S, 2 + staleness);
  std::vector<int> microbatches;
  for (const partition::VirtualWorker& vw : layout.workers) microbatches.push_back(vw.microbatches);
  log_.emplace(microbatches);
  step_.emplace(optimizer_options_, feed_->global_batch(), staleness);
  // A token file too short for one step is the input's fault (InputError): said now, not
  // by the first forward task.
  feed_->check();

}

// One chunk per (device, stage) that computes here, its parameters initialised from `seed`;
// and which chunk each weight and gradient tensor belongs to.
void Training::make_chunks(std::uint64_t seed) {
  const partition::Plan& plan = plan_;
  const partition::Layout& layout = plan.layout;
  // One chunk per (device, stage) that computes, found from the forward tasks' weights.
  std::set<int> norm_ranks;  // the ranks that hold optimizer tasks
  int optimizer_tasks = 0, local_optimizer_tasks = 0;
  // ZeRO 3: passes read gathered copies, of the whole chunk or under expert parallelism of its
  // pieces (one communicator each), which add up to the chunk.
  std::map<int, std::map<int, double>> pieces;  // weight -> communicator -> parameters gathered
  for (const partition::Collective& c : plan.collectives) {
    for (const int t : c.tasks) {
      const auto reads = plan.reads(t), writes = plan.writes(t);
      if (!reads.empty() && !writes.empty() && plan.tensor(writes[0]).kind == TensorKind::gathered_weight) {
        weight_of_gathered_[writes[0]] = reads[0];
        pieces[reads[0]][c.communicator] = c.bytes / model::element_bytes(plan.layout.precision);
      }
    }
  }
  for (const auto& [weight, of] : pieces) {
    for (const auto& [communicator, params] : of) piece_of_weight_[weight] += params;
  }
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind == TaskKind::optimizer || task.kind == TaskKind::host_optimizer) {
      ++optimizer_tasks;
      if (local(task.device)) ++local_optimizer_tasks;
      if (ranks_ != nullptr) norm_ranks.insert(ranks_->owner(task.device, plan.device_count()));
    }
    if (task.kind != TaskKind::forward) continue;
    const int weight = weight_read_by(static_cast<int>(t));
    if (weight < 0) throw PlanError("forward task " + std::to_string(t) + " reads no weight tensor");
    const auto [tp_rank, tp] = tp_position_.count(task.device) ? tp_position_.at(task.device) : std::pair{0, 1};
    // Context parallelism: worker w is rank w % C of its group (partition::Layout::axes).
    const int context = layout.size(partition::Axis::context);
    // Expert parallelism: worker w is rank w % EP of its expert group (partition/expert_shard.hpp).
    ExpertGroup experts;
    if (const int ep = layout.experts.parallel; ep > 1) {
      experts = {ep, partition::expert_rank(task.worker, context, ep), expert_placement_};
    }
    if (!local(task.device)) {  // another rank's: its parameters' layout (a server adds its pushes)
      if (parameter_server_ && !params_at_.count({task.device, task.worker, task.stage})) {
        params_at_.emplace(std::tuple{task.device, task.worker, task.stage},
                           chunk_params(shape_, task.layer_begin, task.layer_end, tp_rank, tp,
                                        experts.size > 1 ? experts.held(shape_.moe.E) : std::vector<int>{}));
      }
      continue;
    }
    if (chunk_of_tensor_.count(weight)) continue;
    const bool ring = layout.context_comm == partition::ContextComm::ring;
    auto c = std::make_unique<Chunk>(shape_, task.layer_begin, task.layer_end, layout.recompute, tp_rank, tp,
                                     ops_of_(task.device), layout.sequence_parallel,
                                     ContextSplit{context, task.worker % context, ring}, std::move(experts));
    c->device = task.device;
    c->worker = task.worker;
    c->stage = task.stage;
    c->tp_rank = tp_rank;
    c->tp = tp;
    if (tp > 1) {
      const auto& group = layout.workers[static_cast<size_t>(task.worker)]
                              .ranks[static_cast<size_t>(layout.workers[static_cast<size_t>(task.worker)].stages[static_cast<size_t>(task.stage)].rank)];
      for (size_t id = 0; id < plan.communicators.size(); ++id) {
        if (plan.communicators[id].role == partition::CommRole::tensor && plan.communicators[id].devices == group) {
          c->communicator = static_cast<int>(id);
        }
      }
      if (c->communicator < 0) throw PlanError("no tensor-parallel communicator holds the devices of worker " +
                                               std::to_string(task.worker) + " stage " + std::to_string(task.stage));
    }
    chunk_at_[{task.device, task.worker, task.stage}] = c.get();
    const ChunkParams& p = c->math.params();
    params_at_.emplace(std::tuple{task.device, task.worker, task.stage}, p);
    // (ZeRO 3: the tensor is the shard; the piece is what its all-gathers gather.)
    const auto piece = piece_of_weight_.find(weight);
    double expected = piece != piece_of_weight_.end() ? std::round(piece->second)
                      : plan.tensor(weight).shape.empty() ? -1
                                                          : static_cast<double>(plan.tensor(weight).shape[0]);
    // (Experts one replica holds alone are in no piece: the pass reads them from its own weights.)
    if (piece != piece_of_weight_.end() && layout.experts.parallel > 1 && pieces.at(weight).size() == 1 &&
        has_routed_experts(p, p.layer_begin, p.layer_end)) {
      expected += static_cast<double>(floats_of(expert_piece_runs(p, p.layer_begin, p.layer_end, true)));
    }
    // The plan counts this rank's shard as the real split lays it out (partition/shard.hpp).
    if (expected != static_cast<double>(p.count)) {
      throw PlanError("the weight tensor " + std::to_string(weight) + " of layers " + std::to_string(task.layer_begin) +
                      "-" + std::to_string(task.layer_end - 1) + " holds " + std::to_string(expected) +
                      " parameters; the real layers have " + std::to_string(p.count) +
                      (tp > 1 ? " on tensor-parallel rank " + std::to_string(tp_rank) + " of " + std::to_string(tp) : ""));
    }
    for (const ParamSlot& slot : p.slots) {
      if (!slot.split) c->replicated.push_back({slot.offset, slot.count, 0});
    }
    std::vector<float> initial(p.count);
    init_params(p, shape_, seed, initial.data());
    c->params = c->ops().floats(p.count);
    c->ops().upload(c->params.data(), initial.data(), p.count);
    c->grads = c->ops().zeros(p.count);
    c->m = c->ops().zeros(p.count);
    c->v = c->ops().zeros(p.count);
    chunk_of_tensor_[weight] = c.get();
    chunks_.push_back(std::move(c));
  }
  norm_.emplace(optimizer_tasks, local_optimizer_tasks, ranks_, std::vector<int>(norm_ranks.begin(), norm_ranks.end()));
  for (size_t t = 0; t < plan.tasks.size(); ++t) {  // a split backward's chunks
    const partition::Task& task = plan.tasks[t];
    if (task.kind != TaskKind::backward_weight) continue;
    if (const auto c = chunk_at_.find({task.device, task.worker, task.stage}); c != chunk_at_.end()) c->second->split = true;
  }
  // Gradient tensors: what B or W of the same (device, stage) writes (from ZeRO stage 2 its
  // reduce-scatters, of the whole buffers the passes wrote).
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    const bool scatter = task.kind == TaskKind::collective && zero_stage_ >= 2 &&
                         plan.collective(task.collective).kind == partition::CollectiveKind::reduce_scatter;
    if (task.kind != TaskKind::backward && task.kind != TaskKind::backward_weight && !scatter) continue;
    const int grad = tensor_of_kind(plan, plan.writes(static_cast<int>(t)), TensorKind::weight_grad);
    if (grad < 0 || chunk_of_tensor_.count(grad)) continue;
    for (auto& c : chunks_) {
      if (c->device == task.device && c->stage == task.stage && c->worker == task.worker) chunk_of_tensor_[grad] = c.get();
    }
  }
}

// The parameters of every local chunk from `init`, each tensor read once; refuses a file of
// another model (a missing, extra or misshapen tensor, an untied head that differs).
void Training::load_weights(const WeightSource& source, OpsFloats ChunkState::*into) {
  const WeightSource* init = &source;
  const std::string& init_path = init->path();
  const std::map<std::string, size_t> by_name = tensor_index(*init);
  std::set<std::string> model_names;  // the whole model's, wherever its chunks run
  for (const ParamSlot& slot : chunk_params(shape_, 0, shape_.layers + 2).slots) {
    for (const std::string& name : hf_file_names(slot.name)) model_names.insert(name);
  }
  // A tied model's file may also hold the head as its own tensor (HuggingFace writes one
  // when it saves tied weights unshared): taken when it is the embedding, bit for bit. A
  // rank whose chunks hold neither (and no server) leaves the check to those that do.
  const bool holds_table = parameter_server_ || std::any_of(chunks_.begin(), chunks_.end(), [](const auto& c) {
                             return c->math.params().has_embedding || c->math.params().has_head;
                           });
  if (const auto head = by_name.find("lm_head.weight"); shape_.tied && head != by_name.end()) {
    const char* table = shape_.family == DecoderFamily::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
    const size_t embedding = find_param_tensor(by_name, table);
    if (embedding == static_cast<size_t>(-1)) throw InputError(init_path, 0, table, "missing: the model needs this parameter");
    if (holds_table) {
      const std::vector<float> embedding_data = init->read(embedding), head_data = init->read(head->second);
      if (init->tensors()[embedding].shape != init->tensors()[head->second].shape ||
          !std::equal(embedding_data.begin(), embedding_data.end(), head_data.begin(), head_data.end(),
                      [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; })) {
        throw InputError(init_path, 0, "lm_head.weight",
                         std::string("differs from ") + table + ", and this model ties the LM head to the embedding");
      }
    }
    model_names.insert("lm_head.weight");
  }
  for (const TensorInfo& t : init->tensors()) {
    // Parameters the model lacks are refused too: a file for another model.
    if (!model_names.count(t.name) && !is_buffer(t.name)) {
      throw InputError(init_path, 0, t.name, "not a parameter of this model (" + describe() + ")");
    }
  }
  // Each tensor is read once, then each local chunk holding a share of it (replicas,
  // tensor-parallel ranks, a tied copy) takes its share: what is held at once is one
  // tensor and one share, whatever the model's size.
  std::map<size_t, std::vector<std::pair<Chunk*, const ParamSlot*>>> holders;  // tensor -> its slots here
  for (auto& c : chunks_) {
    for (const ParamSlot& slot : c->math.params().slots) {
      const size_t found = find_param_tensor(by_name, slot.name);
      if (found == static_cast<size_t>(-1)) throw InputError(init_path, 0, slot.name, "missing: the model needs this parameter");
      check_param_shape(slot, *init, found);
      holders[found].emplace_back(c.get(), &slot);
    }
  }
  for (const auto& [index, slots] : holders) {
    const std::vector<float> tensor = init->read(index);
    for (const auto& [c, slot] : slots) {
      const std::vector<float> share = shard_of(*slot, tensor.data());
      c->ops().upload(((*c).*into).data() + slot->offset, share.data(), share.size());
    }
  }

}

// A checkpoint's moments and counters (its weights are loaded as a file's): the run goes on
// from the step after its last, with the data, AdamW's step count and the loss scaler where
// it left them. The global batch must be its own (its data position and the schedule count
// in it); the moments must cover the model as its weights do.
void Training::resume(const ResumeFrom& from) {
  const std::string state = from.path + "/trainer_state.json";
  const TrainingProgress& p = from.progress;
  if (p.global_batch != feed_->global_batch()) {
    throw InputError(state, 0, "global_batch",
                     "the checkpoint's run took " + std::to_string(p.global_batch) + " samples a step and this plan takes " +
                         std::to_string(feed_->global_batch()) +
                         ": its data position and learning-rate schedule count in its steps (plan the same global batch)");
  }
  if (p.seq_len != shape_.S) {
    throw InputError(state, 0, "seq_len", "the checkpoint's samples are " + std::to_string(p.seq_len) +
                                               " tokens and this model's " + std::to_string(shape_.S));
  }
  if (!parameter_server_) {  // (servers keep the moments: ParameterServers loads them)
    load_weights(from.exp_avg, &ChunkState::m);
    load_weights(from.exp_avg_sq, &ChunkState::v);
  }
  for (auto& c : chunks_) c->steps = static_cast<int>(p.optimizer_steps);
  feed_->start_at(p.iterations);
  step_->resume(p.loss_scaler, p.optimizer_steps);
  start_ = p;
}

void Training::find_last_backwards() {
  // Each chunk's last backward of an iteration into each gradient buffer, in program order
  // (the same micro-batch on every tensor-parallel rank: they run one schedule): its own
  // gradients', or under ZeRO each whole buffer a reduce-scatter takes (one a pass, or one a
  // chunk and iteration: the plan's unsharded_grad tensors), whose gains must be whole
  // before it leaves. Its backwards must share one stream, or "last" has no meaning.
  last_backward_.assign(plan_.tasks.size(), 0);
  std::map<std::pair<const Chunk*, int>, std::pair<int, int>> last;  // (chunk, buffer) -> (stream, task)
  for (const auto& device : plan_.programs) {
    for (const partition::StreamProgram& program : device) {
      for (const int task : program.tasks) {
        if (plan_.task(task).kind != TaskKind::backward) continue;
        const auto c = chunk_of_tensor_.find(weight_read_by(task));
        if (c == chunk_of_tensor_.end()) continue;
        int buffer = tensor_of_kind(plan_, plan_.writes(task), TensorKind::unsharded_grad);
        if (buffer < 0) buffer = tensor_of_kind(plan_, plan_.reads(task), TensorKind::unsharded_grad);
        const auto [at, fresh] = last.try_emplace({c->second, buffer}, program.stream, task);
        if (!fresh && at->second.first != program.stream) {
          throw PlanError("the backward tasks of worker " + std::to_string(c->second->worker) + " stage " +
                          std::to_string(c->second->stage) + " on device " + std::to_string(c->second->device) +
                          " run on two streams; a chunk's backwards must follow one another");
        }
        at->second.second = task;
      }
    }
  }
  for (const auto& [chunk, where] : last) last_backward_[static_cast<size_t>(where.second)] = 1;
}

// The gradient-norm all-reduce of each device (Purpose::gradient_norm): the float it reduces.
int Training::weight_read_by(int task) const {
  const auto reads = plan_.reads(task);
  const int weight = tensor_of_kind(plan_, reads, TensorKind::weight);
  if (weight >= 0) return weight;
  const int gathered = tensor_of_kind(plan_, reads, TensorKind::gathered_weight);
  const auto found = weight_of_gathered_.find(gathered);
  return found == weight_of_gathered_.end() ? -1 : found->second;
}

void Training::map_norms() {
  const partition::Plan& plan = plan_;
  norm_task_.assign(plan.tasks.size(), 0);
  has_norm_.assign(static_cast<size_t>(plan.device_count()), 0);
  norm_square_.assign(static_cast<size_t>(plan.device_count()), {});
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind == TaskKind::collective && task.purpose == partition::Purpose::gradient_norm) {
      norm_task_[t] = 1;
      has_norm_[static_cast<size_t>(task.device)] = 1;
      plan_has_norm_ = true;
      if (local(task.device)) norm_square_[static_cast<size_t>(task.device)] = ops_of_(task.device).floats(1);
    }
  }
}

void Training::place(OpsOfDevice ops_of_device) {
  ops_of_ = std::move(ops_of_device);
  for (auto& c : chunks_) c->move_to(ops_of_(c->device));
  for (size_t d = 0; d < norm_square_.size(); ++d) {
    if (!norm_square_[d].empty()) norm_square_[d] = ops_of_(static_cast<int>(d)).floats(1);
  }
}

void Training::place_home() {
  place([this](int device) -> const DecoderOps& { return *home_.at(static_cast<size_t>(device)); });
}

// Under sequence parallelism a chunk's boundaries are its rank's rows of the micro-batch's N
// tokens (exec/decoder.hpp), and the plan's shards 1/t of the whole: the same when t divides
// N (as Megatron requires of the sequence). The compute reads and writes the shards (a plan
// from before hetflow planned it so gathered and reduce-scattered whole tensors: refused).
void Training::check_sequence_shards() const {
  if (!plan_.layout.sequence_parallel) return;
  const auto rows = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S);
  const size_t whole = rows * static_cast<size_t>(shape_.C);
  for (const auto& c : chunks_) {
    if (c->tp < 2) continue;
    if (rows % static_cast<size_t>(c->tp) != 0) {
      throw PlanError("sequence parallelism over " + std::to_string(c->tp) + " ranks (worker " + std::to_string(c->worker) +
                      " stage " + std::to_string(c->stage) + ") splits a micro-batch's " + std::to_string(rows) +
                      " tokens (micro_batch_size x seq_len) into equal shards: " + std::to_string(c->tp) +
                      " does not divide them");
    }
  }
  for (size_t t = 0; t < plan_.tasks.size(); ++t) {
    const partition::Task& task = plan_.tasks[t];
    if (task.kind != TaskKind::forward && task.kind != TaskKind::backward) continue;
    const auto found = chunk_at_.find({task.device, task.worker, task.stage});
    if (found == chunk_at_.end() || found->second->tp < 2) continue;
    const int id = static_cast<int>(t);
    const TensorKind kind = task.kind == TaskKind::forward ? TensorKind::activation : TensorKind::activation_grad;
    const int read = tensor_of_kind(plan_, plan_.reads(id), kind);
    const auto writes = plan_.writes(id);
    const bool partial = tensor_of_kind(plan_, writes, TensorKind::partial_sum) >= 0;
    const int written = tensor_of_kind(plan_, writes, kind);  // (a forward's output when not partial)
    std::string fault;
    if (read >= 0 && buffer_bytes(read) == whole * sizeof(float)) fault = "reads a whole boundary tensor";
    if (task.kind == TaskKind::backward && partial) fault = "writes a partial sum of its input gradient";
    if (!partial && written >= 0 && buffer_bytes(written) == whole * sizeof(float)) fault = "writes a whole boundary tensor";
    if (!fault.empty()) {
      throw PlanError("task " + std::to_string(t) + " of a sequence-parallel chunk " + fault +
                      ", not its rank's shard: a plan of an earlier hetflow; plan it again");
    }
  }
}

}  // namespace hetflow::exec
