#include "exec/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "exec/training_chunk.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::exec {

using partition::TaskKind;
using partition::TensorKind;
using Floats = std::vector<float>;

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

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

int index_of(std::span<const int> ids, int tensor) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == tensor) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace
namespace training_detail {

int tensor_of_kind(const partition::Plan& plan, std::span<const int> ids, TensorKind kind) {
  for (const int t : ids) {
    if (plan.tensor(t).kind == kind) return t;
  }
  return -1;
}

// HuggingFace's GPT-2 checkpoints name the base model's tensors without "transformer.";
// these are the names a parameter may have in a file.
std::vector<std::string> file_names(const std::string& name) {
  std::vector<std::string> names{name};
  const std::string prefix = "transformer.";
  if (name.rfind(prefix, 0) == 0) names.push_back(name.substr(prefix.size()));
  return names;
}

void check_shape(const ParamSlot& slot, const WeightSource& source, size_t index) {
  const TensorInfo& t = source.tensors()[index];
  if (t.shape != slot.shape) {
    throw InputError(source.path(), 0, slot.name,
                     "expected shape " + shape_text(slot.shape) + ", found " + shape_text(t.shape));
  }
}

// This rank's share of a parameter from the source's tensor `index` (read now).
void load(const ParamSlot& slot, const WeightSource& source, size_t index, float* out) {
  check_shape(slot, source, index);
  const std::vector<float> data = source.read(index);
  const std::vector<float> shard = shard_of(slot, data.data());
  std::copy(shard.begin(), shard.end(), out);
}

// The index in `source` of the tensor holding `slot` (under any of its file names), or npos.
size_t find_tensor(const std::map<std::string, size_t>& by_name, const std::string& slot_name) {
  for (const std::string& name : file_names(slot_name)) {
    if (auto i = by_name.find(name); i != by_name.end()) return i->second;
  }
  return static_cast<size_t>(-1);
}

std::map<std::string, size_t> tensor_index(const WeightSource& source) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < source.tensors().size(); ++i) by_name[source.tensors()[i].name] = i;
  return by_name;
}

}  // namespace training_detail

namespace {

std::unique_ptr<WeightSource> in_memory(const SafetensorsFile* init, const std::string& path) {
  if (init == nullptr) return nullptr;
  return std::make_unique<InMemoryWeights>(*init, path);
}

}  // namespace

using training_detail::file_names;
using training_detail::load;
using training_detail::tensor_of_kind;


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
      optimizer_(optimizer) {
  if (!plan.network.architecture) {
    throw PlanError("the network '" + plan.network.name + "' has no transformer architecture: real math covers "
                    "GPT-2 and LLaMA style decoders (use --compute proxy)");
  }
  shape_ = decoder_shape(*plan.network.architecture);
  for (int d = 0; d < plan.device_count(); ++d) home_.push_back(std::make_unique<CpuDecoderOps>());
  const partition::Layout& layout = plan.layout;
  parameter_server_ = layout.sync.kind != partition::SyncKind::allreduce;
  staleness_ = layout.sync.staleness;
  for (const partition::VirtualWorker& vw : layout.workers) {
    for (const auto& rank : vw.ranks) {
      for (size_t j = 0; j < rank.size(); ++j) tp_position_[rank[j]] = {static_cast<int>(j), static_cast<int>(rank.size())};
    }
  }
  if (static_cast<int>(plan.network.layers.size()) != shape_.layers + 2) {
    throw PlanError("the plan's network has " + std::to_string(plan.network.layers.size()) +
                    " layers where its architecture gives " + std::to_string(shape_.layers + 2));
  }
  int samples = 0, parts = 0;
  for (const partition::VirtualWorker& vw : layout.workers) {
    sample_base_.push_back(samples);
    loss_part_base_.push_back(parts);
    samples += vw.microbatches * layout.micro_batch_size;
    parts += vw.microbatches;
  }
  global_batch_ = samples;
  schedule_ = optimizer_.schedule(global_batch_);
  schedule_.check();  // (a decay style without a decay end would divide 0 by 0)
  // A token file too short for one step is the input's fault (InputError): said now, not
  // by the first forward task.
  if (data_) (void)data_->batch(0, global_batch_, shape_.S);

  // One chunk per (device, stage) that computes, found from the forward tasks' weights.
  std::set<int> norm_ranks;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind == TaskKind::optimizer) {
      ++optimizer_tasks_;
      if (local(task.device)) ++local_optimizer_tasks_;
      if (ranks_ != nullptr) norm_ranks.insert(ranks_->owner(task.device, plan.device_count()));
    }
    if (task.kind != TaskKind::forward) continue;
    const int weight = tensor_of_kind(plan, plan.reads(static_cast<int>(t)), TensorKind::weight);
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
    auto c = std::make_unique<Chunk>(shape_, task.layer_begin, task.layer_end, layout.recompute, tp_rank, tp,
                                     ops_of_(task.device), layout.sequence_parallel);
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
    const double expected = plan.tensor(weight).shape.empty() ? -1 : static_cast<double>(plan.tensor(weight).shape[0]);
    // (Under tensor parallelism the plan counts 1/t of every split layer; the real split
    // keeps position embeddings, norms and some biases whole, so only t = 1 is exact.)
    if (tp == 1 && expected != static_cast<double>(p.count)) {
      throw PlanError("the weight tensor " + std::to_string(weight) + " of layers " + std::to_string(task.layer_begin) +
                      "-" + std::to_string(task.layer_end - 1) + " holds " + std::to_string(expected) +
                      " parameters; the real layers have " + std::to_string(p.count));
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
  norm_ranks_.assign(norm_ranks.begin(), norm_ranks.end());
  // Gradient tensors: what B or W of the same (device, stage) writes.
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind != TaskKind::backward && task.kind != TaskKind::backward_weight) continue;
    const int grad = tensor_of_kind(plan, plan.writes(static_cast<int>(t)), TensorKind::weight_grad);
    if (grad < 0 || chunk_of_tensor_.count(grad)) continue;
    for (auto& c : chunks_) {
      if (c->device == task.device && c->stage == task.stage && c->worker == task.worker) chunk_of_tensor_[grad] = c.get();
    }
  }
  check_sequence_shards();
  find_send_slices();
  const WeightSource* init = init_weights.source;
  if (init != nullptr) {
    const std::string& init_path = init->path();
    const std::map<std::string, size_t> by_name = training_detail::tensor_index(*init);
    std::set<std::string> model_names;  // the whole model's, wherever its chunks run
    for (const ParamSlot& slot : chunk_params(shape_, 0, shape_.layers + 2).slots) {
      for (const std::string& name : file_names(slot.name)) model_names.insert(name);
    }
    // A tied model's file may also hold the head as its own tensor (HuggingFace writes one
    // when it saves tied weights unshared): taken when it is the embedding, bit for bit. A
    // rank whose chunks hold neither (and no server) leaves the check to those that do.
    const bool holds_table = parameter_server_ || std::any_of(chunks_.begin(), chunks_.end(), [](const auto& c) {
                               return c->math.params().has_embedding || c->math.params().has_head;
                             });
    if (const auto head = by_name.find("lm_head.weight"); shape_.tied && head != by_name.end()) {
      const char* table = shape_.family == DecoderFamily::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
      const size_t embedding = training_detail::find_tensor(by_name, table);
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
        const size_t found = training_detail::find_tensor(by_name, slot.name);
        if (found == static_cast<size_t>(-1)) throw InputError(init_path, 0, slot.name, "missing: the model needs this parameter");
        training_detail::check_shape(slot, *init, found);
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

  // Each chunk's last backward of an iteration, in program order (the same micro-batch on
  // every tensor-parallel rank: they run one schedule). Its backwards must share one stream,
  // or "last" has no meaning.
  last_backward_.assign(plan_.tasks.size(), 0);
  std::map<const Chunk*, std::pair<int, int>> last;  // chunk -> (stream, task)
  for (const auto& device : plan_.programs) {
    for (const partition::StreamProgram& program : device) {
      for (const int task : program.tasks) {
        if (plan_.task(task).kind != TaskKind::backward) continue;
        const auto c = chunk_of_tensor_.find(tensor_of_kind(plan_, plan_.reads(task), TensorKind::weight));
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
  if (parameter_server_) build_servers(seed, init);
  scaler_after_[-1] = LossScaler(optimizer_.loss_scale);
  if (parameter_server_ && optimizer_.loss_scale.loss_scale <= 0 && optimizer_.loss_scale.dynamic) {
    // A worker running ahead (WSP) would scale its gradients before the verdict that sets
    // the scale is known; a constant scale works.
    throw PlanError("dynamic loss scaling with parameter servers is not supported: give a constant --loss-scale");
  }

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

Training::~Training() = default;

bool Training::tensor_parallel() const {
  return std::any_of(tp_position_.begin(), tp_position_.end(), [](const auto& p) { return p.second.second > 1; });
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

bool Training::local(int device) const {
  return ranks_ == nullptr || ranks_->owner(device, plan_.device_count()) == ranks_->rank();
}

size_t Training::buffer_bytes(int tensor) const {
  const partition::Tensor& t = plan_.tensor(tensor);
  if (t.kind == TensorKind::pushed_grad) {
    // What the pushing chunk really sends its server: under tensor parallelism a rank's
    // replicated parameters (norms, some biases) whole, where the plan counts 1/t of them.
    if (const auto source = push_source_.find(tensor); source != push_source_.end()) {
      const auto [worker, stage, device] = source->second;
      if (const auto p = params_at_.find({device, worker, stage}); p != params_at_.end()) {
        size_t floats = 0;
        for (const ParamSlot* slot : served_slots(p->second, t.device)) floats += slot->count;
        return floats * sizeof(float);
      }
    }
    return t.shape.empty() ? 0 : static_cast<size_t>(t.shape[0]) * sizeof(float);
  }
  if (t.kind != TensorKind::activation && t.kind != TensorKind::activation_grad && t.kind != TensorKind::partial_sum) {
    return 0;
  }
  const auto whole = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S) *
                     static_cast<size_t>(shape_.C);
  const auto [begin, end] = slice_of(tensor, whole);
  return (end - begin) * sizeof(float);
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

// A boundary tensor that arrives in 1/t slices (tensor parallelism) holds this part of the
// whole activation: the all-gather's piece for the device's rank, [at(j/t), at((j+1)/t)) as
// the CPU back end cuts a buffer. Any other tensor holds all of it.
std::pair<size_t, size_t> Training::slice_of(int tensor, size_t whole) const {
  const partition::Tensor& t = plan_.tensor(tensor);
  const auto found = tp_position_.find(t.device);
  if (found == tp_position_.end() || found->second.second < 2 || t.kind == TensorKind::partial_sum) return {0, whole};
  const int j = found->second.first, n = found->second.second;  // (not a structured binding: lambdas capture it)
  const double plan_whole = static_cast<double>(whole) * model::element_bytes(plan_.layout.precision);
  if (std::abs(t.bytes - plan_whole / n) >= std::abs(t.bytes - plan_whole)) return {0, whole};
  const auto at = [&](int k) {
    return std::min(whole, static_cast<size_t>(std::llround(static_cast<double>(k) / n * static_cast<double>(whole))));
  };
  return {at(j), at(j + 1)};
}

std::shared_ptr<const Batch> Training::batch(int iteration) {
  std::lock_guard lock(mutex_);
  auto& b = batches_[iteration];
  if (!b) {
    b = std::make_shared<const Batch>(data_->batch(iteration, global_batch_, shape_.S));
    batches_.erase(batches_.begin(), batches_.lower_bound(iteration - 2));  // steps behind are done with
  }
  return b;
}

namespace {

// A chunk's tensor-parallel group as the decoder math sees it: the back end's exchange on
// the chunk's communicator, for this task.
class Group final : public TensorParallelGroup {
 public:
  Group(TensorParallelExchange* exchange, TaskContext& task, int communicator)
      : exchange_(exchange), task_(task), communicator_(communicator) {}
  void all_reduce(std::span<float> data, bool max) override { exchange().all_reduce(task_, communicator_, data, max); }
  void all_gather(std::span<float> data, std::span<const size_t> parts) override {
    exchange().all_gather(task_, communicator_, data, parts);
  }
  void reduce_scatter(std::span<float> data, std::span<const size_t> parts) override {
    exchange().reduce_scatter(task_, communicator_, data, parts);
  }

 private:
  TensorParallelExchange& exchange() const {
    if (exchange_ == nullptr) throw PlanError("a tensor-parallel chunk needs a back end that exchanges between ranks");
    return *exchange_;
  }
  TensorParallelExchange* exchange_;
  TaskContext& task_;
  int communicator_;
};

}  // namespace

void Training::compute(TaskContext& task, const std::atomic<bool>& stop, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  if (t.kind == TaskKind::optimizer) {
    if (parameter_server_) {
      server_update(task, stop);
    } else {
      optimizer(task, stop);
    }
    return;
  }
  const auto found = chunk_at_.find({t.device, t.worker, t.stage});
  if (found == chunk_at_.end()) throw PlanError("task " + std::to_string(task.task) + " computes no chunk this plan holds");
  Chunk& c = *found->second;
  if (t.kind == TaskKind::forward && parameter_server_ && t.microbatch == 0 && task.iteration > staleness_) {
    adopt_pulled(c, task.iteration - staleness_ - 1);
  }
  if (t.kind == TaskKind::forward) {
    forward(task, c, exchange);
  } else if (t.kind == TaskKind::backward) {
    // A split backward's B writes no weight gradient: its W does.
    backward(task, c, tensor_of_kind(plan_, plan_.writes(task.task), TensorKind::weight_grad) < 0, exchange);
  } else {
    DecoderChunk::StashPtr stash;
    {
      std::lock_guard lock(c.mutex);
      auto s = c.stashes.find({task.iteration, t.microbatch});
      if (s == c.stashes.end()) throw PlanError("W task " + std::to_string(task.task) + " runs before its B");
      stash = std::move(s->second);
      c.stashes.erase(s);
    }
    c.math.backward_weight(*stash, c.grads.data());
  }
  if (parameter_server_ && takes_gradients_[static_cast<size_t>(task.task)]) take_gradients(t.device, task.iteration);
}

void Training::forward(TaskContext& task, Chunk& c, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  const ChunkParams& p = c.math.params();
  const int mbs = plan_.layout.micro_batch_size, T = shape_.S;
  const auto reads = plan_.reads(task.task);
  const auto writes = plan_.writes(task.task);
  DecoderChunk::Input in;
  in.samples = mbs;
  const auto b = batch(task.iteration);
  const size_t first = static_cast<size_t>(sample_base_[static_cast<size_t>(t.worker)] + t.microbatch * mbs) *
                       static_cast<size_t>(T);
  if (p.has_embedding) in.tokens = b->inputs.data() + first;
  if (p.has_head) {
    in.targets = b->targets.data() + first;
    // (A power-of-two loss scale multiplies exactly: the gradients are S times the unscaled.)
    in.loss_scale = static_cast<float>(scale_of(task.iteration) / (static_cast<double>(global_batch_) * T));
  }
  if (!p.has_embedding) {
    const int i = index_of(reads, tensor_of_kind(plan_, reads, TensorKind::activation));
    if (i < 0) throw PlanError("forward task " + std::to_string(task.task) + " of a middle chunk reads no activation");
    in.input = reinterpret_cast<const float*>(task.reads[static_cast<size_t>(i)].data);
  }
  if (!p.has_head) {
    // Under tensor parallelism the output is this rank's partial sum, which the plan's
    // all-reduce adds up.
    int i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::partial_sum));
    in.output_partial = i >= 0;
    if (i < 0) i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::activation));
    if (i < 0) throw PlanError("forward task " + std::to_string(task.task) + " before the head writes no activation");
    in.output = reinterpret_cast<float*>(task.writes[static_cast<size_t>(i)].data);
  }
  Group group(exchange, task, c.communicator);
  if (c.tp > 1) in.group = &group;
  double loss = 0;
  auto stash = c.math.forward(c.params.data(), in, loss);
  {
    std::lock_guard lock(c.mutex);
    c.stashes[{task.iteration, t.microbatch}] = std::move(stash);
  }
  if (p.has_head && c.worker >= 0 && c.tp_rank == 0) {  // every rank has the loss: count it once
    std::lock_guard lock(mutex_);
    auto& parts = loss_parts_[task.iteration];
    parts.resize(static_cast<size_t>(loss_part_base_.back() + plan_.layout.workers.back().microbatches), 0.0);
    parts[static_cast<size_t>(loss_part_base_[static_cast<size_t>(c.worker)] + t.microbatch)] = loss;
  }
}

void Training::backward(TaskContext& task, Chunk& c, bool split, TensorParallelExchange* exchange) {
  const partition::Task& t = *task.spec;
  const ChunkParams& p = c.math.params();
  const auto reads = plan_.reads(task.task);
  const auto writes = plan_.writes(task.task);
  const float* dout = nullptr;
  float* dinput = nullptr;
  if (!p.has_head) {
    const int i = index_of(reads, tensor_of_kind(plan_, reads, TensorKind::activation_grad));
    if (i < 0) throw PlanError("backward task " + std::to_string(task.task) + " reads no output gradient");
    dout = reinterpret_cast<const float*>(task.reads[static_cast<size_t>(i)].data);
  }
  bool partial = false;
  if (!p.has_embedding) {
    int i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::partial_sum));
    partial = i >= 0;
    if (i < 0) i = index_of(writes, tensor_of_kind(plan_, writes, TensorKind::activation_grad));
    // (A tensor-parallel rank whose input gradient no rank of the previous stage receives,
    // which has it whole like the others, writes none.)
    if (i < 0 && c.tp == 1) throw PlanError("backward task " + std::to_string(task.task) + " writes no input gradient");
    if (i >= 0) dinput = reinterpret_cast<float*>(task.writes[static_cast<size_t>(i)].data);
  }
  Group group(exchange, task, c.communicator);
  TensorParallelGroup* tp = c.tp > 1 ? &group : nullptr;
  DecoderChunk::StashPtr stash;
  {
    std::lock_guard lock(c.mutex);
    auto s = c.stashes.find({task.iteration, t.microbatch});
    if (s == c.stashes.end()) throw PlanError("B task " + std::to_string(task.task) + " runs before its F");
    if (split) {
      c.math.backward(*s->second, c.params.data(), c.grads.data(), dout, dinput, true, partial, tp,
                      last_backward_[static_cast<size_t>(task.task)] != 0);
      return;  // W takes the stash
    }
    stash = std::move(s->second);
    c.stashes.erase(s);
  }
  c.math.backward(*stash, c.params.data(), c.grads.data(), dout, dinput, false, partial, tp,
                  last_backward_[static_cast<size_t>(task.task)] != 0);
}

double Training::global_norm(TaskContext& task, const std::atomic<bool>& stop, double local) {
  std::unique_lock lock(mutex_);
  auto& parts = norm_parts_[task.iteration];
  parts[task.spec->device] = local;
  norm_cv_.notify_all();
  if (ranks_ != nullptr && static_cast<int>(parts.size()) == local_optimizer_tasks_) {
    // This rank's parts are all here: trade them for the other ranks'. (One exchange at a
    // time per rank: the next iteration's waits for this one's norm.)
    std::vector<std::byte> mine;
    for (const auto& [device, part] : parts) {
      put(mine, device);
      put(mine, part);
    }
    lock.unlock();
    task.waiting_for("the global gradient norm: the parts of ranks " + std::to_string(norm_ranks_.front()) + ".." +
                     std::to_string(norm_ranks_.back()));
    const auto all = ranks_->exchange(norm_ranks_, mine, stop);
    lock.lock();
    for (size_t r = 0; r < all.size(); ++r) {
      if (norm_ranks_[r] == ranks_->rank()) continue;
      ByteReader in(all[r]);
      while (!in.done()) {
        const int device = in.get<int>();
        parts[device] = in.get<double>();
      }
    }
    norm_cv_.notify_all();
  }
  while (static_cast<int>(parts.size()) < optimizer_tasks_) {
    task.waiting_for("the global gradient norm: " + std::to_string(parts.size()) + " of " +
                     std::to_string(optimizer_tasks_) + " devices' parts");
    norm_cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (stop.load()) throw Stopped();
  }
  double sum = 0;
  for (const auto& [device, part] : parts) sum += part;  // in device order: reproducible
  if (++norm_reads_[task.iteration] == local_optimizer_tasks_) {  // every task here has its norm
    norm_parts_.erase(task.iteration);
    norm_reads_.erase(task.iteration);
  }
  return std::sqrt(sum);
}

size_t Training::norms_in_flight() const {
  std::lock_guard lock(mutex_);
  return norm_parts_.size();
}

void Training::optimizer(TaskContext& task, const std::atomic<bool>& stop) {
  std::vector<Chunk*> mine;
  for (const int t : plan_.writes(task.task)) {
    if (auto c = chunk_of_tensor_.find(t); c != chunk_of_tensor_.end()) mine.push_back(c->second);
  }
  float scale = 1;
  const double loss_scale = scale_of(task.iteration);
  const bool scaling = optimizer_.loss_scale.active();
  if (optimizer_.clip_grad > 0 || scaling) {
    // The plan's all-reduce summed the worker's parts (its replicas hold the same gradients);
    // a worker of one device holds every parameter itself. A plan without that collective
    // (a CNN's, an older one): the devices' parts meet here, worker 0's counted.
    const int device = task.spec->device;
    double norm = 0;
    if (has_norm_[static_cast<size_t>(device)]) {
      float square = 0;
      ops_of_(device).download(&square, norm_square_[static_cast<size_t>(device)].data(), 1);
      norm = std::sqrt(static_cast<double>(square));
    } else if (plan_has_norm_) {
      norm = std::sqrt(local_sum_squares(device, task.iteration));
    } else {
      norm = global_norm(task, stop, task.spec->worker == 0 ? local_sum_squares(device, task.iteration) : 0.0);
    }
    // (The norm is of the unscaled gradients: a scaled one could overflow where they do not.)
    if (scaling && record_step(task.iteration, norm)) {  // not finite: skip the step
      for (Chunk* c : mine) c->ops().zero(c->grads.data(), c->grads.size());
      return;
    }
    const double clip = optimizer_.clip_grad / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
    if (optimizer_.clip_grad > 0 && clip < 1) scale = static_cast<float>(clip);
  }
  for (Chunk* c : mine) {
    const int step = ++c->steps;  // AdamW's count: skipped steps do not count
    const double lr = schedule_.at(step - 1);  // nor does the schedule (Megatron's)
    if (loss_scale != 1) c->ops().scale(c->grads.data(), static_cast<float>(1 / loss_scale), c->grads.size());
    if (scale != 1) c->ops().scale(c->grads.data(), scale, c->grads.size());
    for (const ParamSlot& slot : c->math.params().slots) {
      const size_t o = slot.offset;
      c->ops().adamw_update(c->params.data() + o, c->grads.data() + o, c->m.data() + o, c->v.data() + o, slot.count,
                          static_cast<float>(lr), static_cast<float>(optimizer_.adam_beta1),
                          static_cast<float>(optimizer_.adam_beta2), static_cast<float>(optimizer_.adam_eps),
                          slot.decays ? static_cast<float>(optimizer_.weight_decay) : 0.0f, step);
    }
    c->ops().zero(c->grads.data(), c->grads.size());
  }
}

// A device's part of the squared gradient norm: every parameter it holds once (the pieces of
// one Megatron splits on every rank, even where a split leaves one rank all of it and the
// others nothing; a replicated one on tensor rank 0 alone; a tied copy not at all), after its
// data-parallel sync; of the unscaled gradients (divided by the loss scale squared, exactly:
// a power of four).
double Training::local_sum_squares(int device, int iteration) const {
  double local = 0;
  for (const auto& c : chunks_) {
    if (c->device != device) continue;
    for (const ParamSlot& slot : c->math.params().slots) {
      if (slot.tied_copy || (!slot.split && c->tp_rank != 0)) continue;
      local = c->ops().sum_of_squares(c->grads.data() + slot.offset, slot.count, local);
    }
  }
  const double scale = scale_of(iteration);
  return scale == 1 ? local : local / (scale * scale);
}

std::span<float> Training::collective_data(const TaskContext& task) {
  if (norm_task_[static_cast<size_t>(task.task)]) {  // the norm's all-reduce: this device's part in, the worker's out
    const OpsFloats& slot = norm_square_[static_cast<size_t>(task.spec->device)];
    const float square = static_cast<float>(local_sum_squares(task.spec->device, task.iteration));
    ops_of_(task.spec->device).upload(slot.data(), &square, 1);
    return slot.span();
  }
  Chunk* c = collective_chunk_[static_cast<size_t>(task.task)];
  if (c == nullptr) return {};
  const auto& runs = collective_runs_[static_cast<size_t>(task.task)];
  if (runs.empty()) {
    const auto [begin, end] = collective_span_[static_cast<size_t>(task.task)];
    return c->grads.span().subspan(begin, end - begin);
  }
  // (One device's collectives run one after another on its stream: no other thread here.)
  c->take_replicated(task.iteration);
  OpsFloats& buffer = gathered_[static_cast<size_t>(task.task)];
  buffer = c->ops().floats(floats_of(runs));
  size_t at = 0;
  for (const FloatRun& run : runs) {
    const float* from = run.replicated ? c->replicated_at(run.at) : c->grads.data() + run.at;
    c->ops().copy(buffer.data() + at, from, run.count);
    at += run.count;
  }
  return buffer.span();
}

void Training::collective_done(const TaskContext& task) {
  if (static_cast<size_t>(task.task) >= collective_runs_.size()) return;
  const auto& runs = collective_runs_[static_cast<size_t>(task.task)];
  if (runs.empty()) return;
  Chunk& c = *collective_chunk_[static_cast<size_t>(task.task)];
  OpsFloats& buffer = gathered_[static_cast<size_t>(task.task)];
  size_t at = 0;
  for (const FloatRun& run : runs) {
    c.ops().copy(c.grads.data() + run.at, buffer.data() + at, run.count);
    at += run.count;
  }
  buffer = OpsFloats();
}

std::vector<double> Training::losses() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  const double tokens = static_cast<double>(global_batch_) * shape_.S;
  for (const auto& [iteration, parts] : loss_parts_) {
    double sum = 0;
    for (const double part : parts) sum += part;
    out.push_back(sum / tokens);
  }
  return out;
}

SafetensorsFile Training::weights() const {
  SafetensorsFile file;
  struct Held {
    int tp_rank = 0;
    const ChunkParams* params = nullptr;
    const float* values = nullptr;
  };
  std::map<int, std::vector<Held>> stages;  // virtual worker 0's chunks: per stage, its ranks in order
  std::vector<std::vector<float>> host;     // their parameters, out of their devices' memory
  host.reserve(chunks_.size());
  for (const auto& c : chunks_) {
    if (c->worker != 0) continue;
    host.push_back(c->host_params());
    stages[c->stage].push_back({c->tp_rank, &c->math.params(), host.back().data()});
  }
  for (const RemoteChunk& c : remote_chunks_) stages[c.stage].push_back({c.tp_rank, &c.params, c.values.data()});
  // Under a parameter server the servers hold the latest weights (workers adopt them a step later).
  std::map<std::string, const float*> served;
  for (const auto& [device, server] : servers_) {
    for (const auto& [name, p] : server.params) served[name] = p.p.data();
  }
  for (const auto& [name, values] : remote_server_weights_) served[name] = values.data();
  for (auto& [stage, ranks] : stages) {
    std::sort(ranks.begin(), ranks.end(), [](const Held& a, const Held& b) { return a.tp_rank < b.tp_rank; });
    const auto& slots = ranks.front().params->slots;
    for (size_t i = 0; i < slots.size(); ++i) {
      const ParamSlot& slot = slots[i];
      if (slot.tied_copy) continue;
      size_t elements = 1;
      for (const auto n : slot.shape) elements *= static_cast<size_t>(n);
      NamedTensor t{slot.name, slot.shape, Floats(elements, 0.0f)};
      if (auto s = served.find(slot.name); parameter_server_ && s != served.end()) {
        // The server's whole parameter: a rank's slot with the whole tensor as its one piece.
        ParamSlot whole = slot;
        whole.count = static_cast<size_t>(slot.full_rows * slot.full_cols);
        whole.pieces = {Piece{0, slot.full_rows, 0, slot.full_cols}};
        place_shard(whole, s->second, t.data.data());
      } else {
        for (const Held& held : ranks) {
          const ParamSlot& mine = held.params->slots[i];
          place_shard(mine, held.values + mine.offset, t.data.data());
        }
      }
      file.tensors.push_back(std::move(t));
    }
  }
  file.metadata["format"] = "pt";
  file.metadata["producer"] = "hetflow";
  return file;
}

void Training::collect_at_root() {
  if (ranks_ == nullptr) return;
  std::vector<std::byte> mine;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [iteration, parts] : loss_parts_) {
      put(mine, std::uint64_t{1});
      put(mine, iteration);
      put(mine, static_cast<std::uint64_t>(parts.size()));
      for (const double part : parts) put(mine, part);
    }
    for (const auto& c : chunks_) {
      if (c->worker != 0) continue;
      put(mine, std::uint64_t{2});
      for (const int v : {c->stage, c->tp_rank, c->tp, c->math.params().layer_begin, c->math.params().layer_end}) put(mine, v);
      const std::vector<float> values = c->host_params();
      put(mine, static_cast<std::uint64_t>(values.size()));
      for (const float v : values) put(mine, v);
    }
    for (const int iteration : skipped_iterations_) {  // (a rank with no optimizer and no server sees none)
      put(mine, std::uint64_t{4});
      put(mine, iteration);
    }
    for (const auto& [device, server] : servers_) {
      for (const auto& [name, p] : server.params) {
        put(mine, std::uint64_t{3});
        put_string(mine, name);
        put(mine, static_cast<std::uint64_t>(p.p.size()));
        for (const float v : p.p) put(mine, v);
      }
    }
  }
  const auto all = ranks_->gather(mine);
  if (ranks_->rank() != 0) return;
  std::lock_guard lock(mutex_);
  for (size_t r = 1; r < all.size(); ++r) {
    ByteReader in(all[r]);
    while (!in.done()) {
      const auto kind = in.get<std::uint64_t>();
      if (kind == 1) {  // a step's loss parts: each written by one rank, zero elsewhere, so a sum is exact
        const int iteration = in.get<int>();
        auto& parts = loss_parts_[iteration];
        const auto n = static_cast<size_t>(in.get<std::uint64_t>());
        if (parts.size() < n) parts.resize(n, 0.0);
        for (size_t i = 0; i < n; ++i) parts[i] += in.get<double>();
      } else if (kind == 2) {
        RemoteChunk c;
        c.stage = in.get<int>();
        c.tp_rank = in.get<int>();
        const int tp = in.get<int>(), begin = in.get<int>(), end = in.get<int>();
        c.params = chunk_params(shape_, begin, end, c.tp_rank, tp);
        c.values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
        in.get_into(std::span<float>(c.values));
        if (c.values.size() != c.params.count) throw Error("rank " + std::to_string(r) + " sent a chunk of the wrong size");
        remote_chunks_.push_back(std::move(c));
      } else if (kind == 4) {  // a step some rank saw skipped
        skipped_iterations_.insert(in.get<int>());
      } else if (kind == 3) {
        const std::string name = in.get_string();
        auto& values = remote_server_weights_[name];
        values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
        in.get_into(std::span<float>(values));
      } else {
        throw Error("rank " + std::to_string(r) + " sent an unknown record of its training");
      }
    }
  }
}

double Training::scale_of(int iteration) const {
  if (!optimizer_.loss_scale.active()) return 1;
  if (optimizer_.loss_scale.loss_scale > 0) return optimizer_.loss_scale.loss_scale;  // constant
  std::lock_guard lock(mutex_);
  const auto found = scaler_after_.find(iteration - 1);
  if (found == scaler_after_.end()) {
    throw PlanError("iteration " + std::to_string(iteration) + " computes before iteration " +
                    std::to_string(iteration - 1) + "'s loss scale is known (its optimizer has not run)");
  }
  return found->second.scale();
}

bool Training::record_step(int iteration, double scaled_norm) {
  const bool found_inf = !std::isfinite(scaled_norm);
  std::lock_guard lock(mutex_);
  if (const auto seen = skipped_.find(iteration); seen != skipped_.end()) {
    if (seen->second != found_inf) {
      throw Error("the devices disagree whether iteration " + std::to_string(iteration) +
                  "'s gradients are finite (a gradient norm that is not global?)");
    }
    return found_inf;
  }
  skipped_[iteration] = found_inf;
  if (found_inf) skipped_iterations_.insert(iteration);
  const auto before = scaler_after_.find(iteration - 1);
  if (before == scaler_after_.end()) {
    throw Error("iteration " + std::to_string(iteration) + "'s optimizer runs before iteration " +
                std::to_string(iteration - 1) + "'s");
  }
  LossScaler next = before->second;
  next.update(found_inf);
  scaler_after_[iteration] = next;
  // Steps this far back are done on every device (a worker lags by its staleness at most).
  scaler_after_.erase(scaler_after_.begin(), scaler_after_.lower_bound(iteration - staleness_ - 8));
  skipped_.erase(skipped_.begin(), skipped_.lower_bound(iteration - staleness_ - 8));
  return found_inf;
}

double Training::loss_scale() const {
  std::lock_guard lock(mutex_);
  return scaler_after_.rbegin()->second.scale();
}

int Training::skipped_steps() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(skipped_iterations_.size());
}

std::vector<double> Training::learning_rates() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  long long skipped_before = 0;  // (loss_parts_ is in iteration order)
  for (const auto& [iteration, parts] : loss_parts_) {
    if (skipped_iterations_.count(iteration)) {
      out.push_back(std::numeric_limits<double>::quiet_NaN());
      ++skipped_before;
      continue;
    }
    out.push_back(schedule_.at(iteration - skipped_before));  // the steps taken before it, as the optimizer counts
  }
  return out;
}

std::string Training::describe() const {
  std::ostringstream out;
  out << (shape_.family == DecoderFamily::gpt2 ? "GPT-2" : "LLaMA") << " style, " << shape_.layers << " layers, hidden "
      << shape_.C << ", " << shape_.NH << " heads";
  if (shape_.NH * shape_.HS != shape_.C) out << " of " << shape_.HS;
  if (shape_.NKV != shape_.NH) out << " (" << shape_.NKV << " key/value)";
  if (shape_.qk_norm) out << ", QK-norm";
  out << ", MLP " << shape_.F << ", vocabulary " << shape_.V << ", sequence " << shape_.S;
  if (shape_.qkv_bias) out << (shape_.out_bias ? ", q/k/v/o biases" : ", q/k/v biases");
  if (shape_.window > 0) out << ", sliding window " << shape_.window;
  using Scaling = kernels::RopeFrequencies::Scaling;
  const kernels::RopeFrequencies& r = shape_.rope;
  if (shape_.family == DecoderFamily::llama) {
    out << ", RoPE theta " << model::units::format_number(r.theta);
    if (r.scaling != Scaling::none) {
      out << (r.scaling == Scaling::linear ? " linear" : " llama3") << " x" << model::units::format_number(r.factor);
    }
  }
  return out.str();
}

bool Training::receive(const TaskContext& task, std::span<const float> data) {
  const partition::Task& t = *task.spec;
  if (t.purpose == partition::Purpose::activation || t.purpose == partition::Purpose::gradient) {
    // The sender's whole activation; a 1/t slice keeps its part for the all-gather.
    const auto writes = plan_.writes(task.task);
    const auto whole = static_cast<size_t>(plan_.layout.micro_batch_size) * static_cast<size_t>(shape_.S) *
                       static_cast<size_t>(shape_.C);
    if (writes.empty() || task.writes.empty() || data.size() != whole) return false;  // a shard travels as it is
    const auto [begin, end] = slice_of(writes[0], whole);
    if (end - begin == whole) return false;
    // (The message and the tensor are the device's memory: its ops copy.)
    ops_of_(t.device).copy(reinterpret_cast<float*>(task.writes[0].data), data.data() + begin, end - begin);
    return true;
  }
  if (t.purpose != partition::Purpose::ps_pull) return false;
  const partition::Channel& channel = plan_.channel(t.channel);
  const auto found = chunk_at_.find({t.device, t.worker, t.stage});
  if (found == chunk_at_.end()) throw PlanError("pull task " + std::to_string(task.task) + " serves no chunk");
  std::lock_guard lock(mutex_);
  pulled_[{found->second, task.iteration, channel.src}].assign(data.begin(), data.end());
  return true;
}

}  // namespace hetflow::exec
