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
#include "exec/training_chunk.hpp"
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

// Where a gradient collective's floats sit in a chunk's gradients, in `part`'s order: the tied
// embedding's table (the first chunk's, or the last chunk's copy), or layers [begin, end).
std::vector<FloatRun> runs_of_collective(const DecoderShape& shape, const ChunkParams& held, const SplitPart& part,
                                         bool embedding, int begin, int end) {
  const size_t tied = held.has_embedding ? 0 : held.head_slot;
  return runs_of_part(held, chunk_params_part(shape, held.layer_begin, held.layer_end, part), [&](size_t i) {
    return embedding ? i == tied : held.slots[i].layer >= begin && held.slots[i].layer < end;
  });
}

}  // namespace

namespace training_detail {

// (training_chunk.hpp) Whether the chunk holds routed experts of layers [begin, end).
bool has_routed_experts(const ChunkParams& p, int begin, int end) {
  for (const ParamSlot& slot : p.slots) {
    if (slot.expert >= 0 && slot.layer >= begin && slot.layer < end) return true;
  }
  return false;
}

// The floats of layers [begin, end) that are routed experts' (`routed`), or all the others, in
// array order, adjacent runs merged.
std::vector<FloatRun> expert_piece_runs(const ChunkParams& p, int begin, int end, bool routed) {
  std::vector<FloatRun> runs;
  for (const ParamSlot& slot : p.slots) {
    if (slot.layer < begin || slot.layer >= end || (slot.expert >= 0) != routed || slot.count == 0) continue;
    if (!runs.empty() && runs.back().at + runs.back().count == slot.offset) {
      runs.back().count += slot.count;
    } else {
      runs.push_back({slot.offset, slot.count, false});
    }
  }
  return runs;
}

int tensor_of_kind(const partition::Plan& plan, std::span<const int> ids, TensorKind kind) {
  for (const int t : ids) {
    if (plan.tensor(t).kind == kind) return t;
  }
  return -1;
}

}  // namespace training_detail

namespace {

std::unique_ptr<WeightSource> in_memory(const SafetensorsFile* init, const std::string& path) {
  if (init == nullptr) return nullptr;
  return std::make_unique<InMemoryWeights>(*init, path);
}

}  // namespace

using training_detail::tensor_of_kind;
using training_detail::expert_piece_runs;
using training_detail::has_routed_experts;

Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, const SafetensorsFile* init, const std::string& init_path, const Ranks* ranks)
    // (The wrapper lives until the delegated constructor returns: the end of this full-expression.)
    : Training(plan, std::move(data), optimizer, seed, Init{in_memory(init, init_path).get()}, ranks) {}

Training::Training(const partition::Plan& plan, std::unique_ptr<TokenSource> data, OptimizerOptions optimizer,
                   std::uint64_t seed, const WeightSource& init, const Ranks* ranks)
    : Training(plan, std::move(data), optimizer, seed, Init{&init}, ranks) {}

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
  find_last_backwards();
  if (parameter_server_) servers_.emplace(plan_, shape_, params_at_, [this](int d) { return local(d); }, seed, init);
  if (parameter_server_ && optimizer_options_.loss_scale.loss_scale <= 0 && optimizer_options_.loss_scale.dynamic) {
    // A worker running ahead (WSP) would scale its gradients before the verdict that sets
    // the scale is known; a constant scale works.
    throw PlanError("dynamic loss scaling with parameter servers is not supported: give a constant --loss-scale");
  }
  map_collectives();
  map_zero();
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
    // (Stages 1 and 2 run: their pieces are runs of a chunk, map_zero. The planner refuses 3.)
    if (plan.layout.sync.zero.stage > 2) refuse("with ZeRO stage " + std::to_string(plan.layout.sync.zero.stage));
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
  for (const partition::Collective& c : plan.collectives) {  // ZeRO 3: passes read gathered copies
    for (const int t : c.tasks) {
      const auto reads = plan.reads(t), writes = plan.writes(t);
      if (!reads.empty() && !writes.empty() && plan.tensor(writes[0]).kind == TensorKind::gathered_weight) {
        weight_of_gathered_[writes[0]] = reads[0];
        piece_of_weight_[reads[0]] = c.bytes / model::element_bytes(plan.layout.precision);
      }
    }
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
    if (!local(task.device)) {  // another rank's: its parameters' layout (a server adds its pushes)
      if (parameter_server_ && !params_at_.count({task.device, task.worker, task.stage})) {
        params_at_.emplace(std::tuple{task.device, task.worker, task.stage},
                           chunk_params(shape_, task.layer_begin, task.layer_end, tp_rank, tp));
      }
      continue;
    }
    if (chunk_of_tensor_.count(weight)) continue;
    // Context parallelism: worker w is rank w % C of its group (partition::Layout::axes).
    const int context = layout.size(partition::Axis::context);
    // Expert parallelism: worker w is rank w % EP of its expert group (partition/expert_shard.hpp).
    ExpertGroup experts;
    if (const int ep = layout.experts.parallel; ep > 1) {
      experts = {ep, partition::expert_rank(task.worker, context, ep), expert_placement_};
    }
    auto c = std::make_unique<Chunk>(shape_, task.layer_begin, task.layer_end, layout.recompute, tp_rank, tp,
                                     ops_of_(task.device), layout.sequence_parallel,
                                     ContextSplit{context, task.worker % context}, std::move(experts));
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
    const double expected = piece != piece_of_weight_.end() ? std::round(piece->second)
                            : plan.tensor(weight).shape.empty() ? -1
                                                                : static_cast<double>(plan.tensor(weight).shape[0]);
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
void Training::load_weights(const WeightSource& source) {
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
      c->ops().upload(c->params.data() + slot->offset, share.data(), share.size());
    }
  }

}

void Training::find_last_backwards() {
  // Each chunk's last backward of an iteration, in program order (the same micro-batch on
  // every tensor-parallel rank: they run one schedule). Its backwards must share one stream,
  // or "last" has no meaning.
  last_backward_.assign(plan_.tasks.size(), 0);
  std::map<const Chunk*, std::pair<int, int>> last;  // chunk -> (stream, task)
  for (const auto& device : plan_.programs) {
    for (const partition::StreamProgram& program : device) {
      for (const int task : program.tasks) {
        if (plan_.task(task).kind != TaskKind::backward) continue;
        const auto c = chunk_of_tensor_.find(weight_read_by(task));
        if (c == chunk_of_tensor_.end()) continue;
        const auto [at, fresh] = last.try_emplace(c->second, program.stream, task);
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

void Training::map_collectives() {
  const partition::Plan& plan = plan_;
  // Collectives: the gradient span each reduces, or the gradient norm.
  collective_span_.assign(plan.tasks.size(), {0, 0});
  collective_chunk_.assign(plan.tasks.size(), nullptr);
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
  // Each gradient collective reduces the part of Megatron's split its members hold in common
  // (all of a rank's when every worker has the same degree): a span of the chunk's
  // gradients, or runs gathered in the part's order. A bucketed piece splits its floats
  // evenly among its buckets, in task order.
  using PieceKey = std::tuple<int, int, int, long long, long long, long long>;  // grad, layers, part (lo, hi, denominator)
  std::map<PieceKey, std::vector<int>> buckets;  // -> its tasks, in order
  std::map<PieceKey, std::vector<FloatRun>> runs_of_piece;
  collective_runs_.assign(plan.tasks.size(), {});
  gathered_.assign(plan.tasks.size(), {});
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind != TaskKind::collective || !local(task.device)) continue;
    const auto& c = plan.collective(task.collective);
    if (c.purpose != partition::Purpose::data_parallel && c.purpose != partition::Purpose::embedding) continue;
    // From ZeRO stage 2 the sharded collectives move whole pieces (map_zero).
    if (zero_stage_ >= 2 && c.kind != partition::CollectiveKind::all_reduce) continue;
    const auto reads = plan.reads(static_cast<int>(t));
    const auto found = reads.empty() ? chunk_of_tensor_.end() : chunk_of_tensor_.find(reads[0]);
    if (found == chunk_of_tensor_.end()) {
      throw PlanError("collective task " + std::to_string(t) + " reduces no gradient tensor of a chunk");
    }
    Chunk& chunk = *found->second;
    collective_chunk_[t] = &chunk;
    const ChunkParams& p = chunk.math.params();
    const bool embedding = c.purpose == partition::Purpose::embedding;
    if (!embedding && (task.layer_begin < p.layer_begin || task.layer_end > p.layer_end)) {
      throw PlanError("collective task " + std::to_string(t) + " reduces layers its chunk does not hold");
    }
    const auto [begin, end] = embedding ? std::pair{0, 0} : std::pair{task.layer_begin, task.layer_end};
    const SplitPart part = common_part(plan.members(c));
    const bool whole_rank = part.lo_num * chunk.tp == static_cast<long long>(chunk.tp_rank) * part.lo_den &&
                            part.hi_num * chunk.tp == static_cast<long long>(chunk.tp_rank + 1) * part.hi_den;
    const size_t tied = p.has_embedding ? 0 : p.head_slot;
    if (whole_rank && embedding) {
      collective_span_[t] = {p.slots[tied].offset, p.slots[tied].offset + p.slots[tied].count};
      continue;
    }
    // Expert parallelism: a layer range's gradients are summed in two pieces, the layers less
    // their routed experts over every replica, and each expert rank's experts over the
    // replicas that hold them (partition's Segment pieces): told apart by their members.
    if (!embedding && chunk.math.experts().size > 1 && has_routed_experts(p, begin, end)) {
      const size_t context = static_cast<size_t>(std::max(1, plan.layout.size(partition::Axis::context)));
      const size_t replicas = plan.layout.workers.size() / context;
      const bool routed = plan.communicator(c.communicator).devices.size() < replicas;
      const PieceKey key{reads[0], begin, end, routed ? -2 : -1, 0, 0};
      buckets[key].push_back(static_cast<int>(t));
      if (!runs_of_piece.count(key)) runs_of_piece[key] = expert_piece_runs(p, begin, end, routed);
      continue;
    }
    const PieceKey key{reads[0], begin, end, part.lo_num * part.hi_den, part.hi_num * part.lo_den, part.lo_den * part.hi_den};
    buckets[key].push_back(static_cast<int>(t));
    if (whole_rank || runs_of_piece.count(key)) continue;
    runs_of_piece[key] = runs_of_collective(shape_, p, part, embedding, begin, end);
  }
  check_collective_sizes();
  for (const auto& [key, tasks] : buckets) {
    const auto& [grad, begin, end, lo, hi, denominator] = key;
    const size_t k = tasks.size();
    if (const auto runs = runs_of_piece.find(key); runs != runs_of_piece.end()) {
      const size_t n = floats_of(runs->second);
      if (lo < 0) {  // an expert-parallel piece: the plan's buckets hold its floats
        double planned = 0;
        for (const int task : tasks) planned += plan.collective(plan.task(task).collective).bytes;
        // (ZeRO's all-gathers move parameters, the rest gradients.)
        const bool gathers = plan.collective(plan.task(tasks[0]).collective).kind == partition::CollectiveKind::all_gather;
        planned /= gathers ? model::element_bytes(plan.layout.precision) : plan.layout.gradient_element_bytes();
        if (std::abs(planned - static_cast<double>(n)) > 0.5) {
          throw PlanError("collective task " + std::to_string(tasks[0]) + (gathers ? " gathers " : " sums ") +
                          model::units::format_number(planned) + (gathers ? " parameters" : " gradients") +
                          " of layers " + std::to_string(begin) + "-" + std::to_string(end - 1) + " where the " +
                          (lo == -2 ? "routed experts this replica holds" : "layers less their routed experts") +
                          " are " + std::to_string(n));
        }
      }
      for (size_t b = 0; b < k; ++b) {
        collective_runs_[static_cast<size_t>(tasks[b])] = slice_runs(runs->second, n * b / k, n * (b + 1) / k);
      }
      continue;
    }
    const ChunkParams& p = chunk_of_tensor_.at(grad)->math.params();
    const size_t from = p.layer_start[static_cast<size_t>(begin - p.layer_begin)];
    const size_t to = p.layer_start[static_cast<size_t>(end - p.layer_begin)];
    const size_t n = to - from;
    for (size_t b = 0; b < k; ++b) {
      collective_span_[static_cast<size_t>(tasks[b])] = {from + n * b / k, from + n * (b + 1) / k};
    }
  }
}

// Every member of a gradient collective must bring as many floats as the others, or the sum
// would mix parameters: refused before the run (a worker whose one chunk holds both ends of a
// tied embedding has no head copy to all-reduce, for one).
void Training::check_collective_sizes() const {
  std::map<int, std::pair<int, int>> layers_of_grad;  // weight_grad tensor -> its chunk's layers
  for (size_t t = 0; t < plan_.tasks.size(); ++t) {
    const partition::Task& task = plan_.tasks[t];
    if (task.kind != TaskKind::backward && task.kind != TaskKind::backward_weight) continue;
    const int grad = tensor_of_kind(plan_, plan_.writes(static_cast<int>(t)), TensorKind::weight_grad);
    if (grad >= 0) layers_of_grad.try_emplace(grad, task.layer_begin, task.layer_end);
  }
  std::map<std::tuple<int, int, int, int, int, int, long long, long long, long long>, size_t> cache;
  for (size_t id = 0; id < plan_.collectives.size(); ++id) {
    const partition::Collective& c = plan_.collectives[id];
    if (c.purpose != partition::Purpose::data_parallel && c.purpose != partition::Purpose::embedding) continue;
    const bool embedding = c.purpose == partition::Purpose::embedding;
    const SplitPart part = common_part(plan_.members(c));
    size_t first = 0;
    int first_device = -1;
    for (size_t i = 0; i < c.tasks.size(); ++i) {
      const partition::Task& task = plan_.task(c.tasks[i]);
      const auto reads = plan_.reads(c.tasks[i]);
      const auto layers = reads.empty() ? layers_of_grad.end() : layers_of_grad.find(reads[0]);
      if (layers == layers_of_grad.end()) continue;  // not a chunk's gradients: refused where it runs
      const auto [j, t] = tp_position_.count(task.device) ? tp_position_.at(task.device) : std::pair{0, 1};
      const auto [begin, end] = embedding ? std::pair{0, 0} : std::pair{task.layer_begin, task.layer_end};
      const std::tuple key{layers->second.first, layers->second.second, j, t, begin, end,
                           part.lo_num * part.hi_den, part.hi_num * part.lo_den, part.lo_den * part.hi_den};
      auto found = cache.find(key);
      if (found == cache.end()) {
        const ChunkParams mine = chunk_params(shape_, layers->second.first, layers->second.second, j, t);
        found = cache.emplace(key, floats_of(runs_of_collective(shape_, mine, part, embedding, begin, end))).first;
      }
      if (first_device < 0) {
        first = found->second;
        first_device = task.device;
      }
      if (found->second != first) {
        throw PlanError("collective " + std::to_string(id) + " (" + std::string(partition::to_string(c.purpose)) +
                        ") sums " + std::to_string(first) + " floats on device " + std::to_string(first_device) + " but " +
                        std::to_string(found->second) +
                        " on device " + std::to_string(task.device) + ": its members hold different parameters");
      }
    }
  }
}

// The part of Megatron's split that every member holds: the intersection of their ranks'
// [j / t, (j + 1) / t) (a member outside tensor parallelism holds all of it).
SplitPart Training::common_part(const std::vector<int>& members) const {
  SplitPart part{0, 1, 1, 1};
  for (const int d : members) {
    const auto found = tp_position_.find(d);
    const auto [j, t] = found == tp_position_.end() ? std::pair{0, 1} : found->second;
    if (static_cast<long long>(j) * part.lo_den > part.lo_num * t) part.lo_num = j, part.lo_den = t;
    if (static_cast<long long>(j + 1) * part.hi_den < part.hi_num * t) part.hi_num = j + 1, part.hi_den = t;
  }
  // In lowest terms, so one part has one spelling whatever the members' degrees.
  const long long lo = std::gcd(part.lo_num, part.lo_den), hi = std::gcd(part.hi_num, part.hi_den);
  return {part.lo_num / lo, part.lo_den / lo, part.hi_num / hi, part.hi_den / hi};
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
