#include "exec/gradient_sync.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

#include "exec/plan_tensors.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

using partition::CollectiveKind;
using partition::TaskKind;
using partition::TensorKind;

namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

// Sorted, touching ranges joined.
Ranges merged(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [a, b] : r) {
    if (a == b) continue;
    if (!out.empty() && a <= out.back().second) {
      out.back().second = std::max(out.back().second, b);
    } else {
      out.emplace_back(a, b);
    }
  }
  return out;
}

std::string ranges_text(const Ranges& r) {
  std::string s;
  for (const auto& [a, b] : r) s += (s.empty() ? "" : ", ") + std::string("[") + std::to_string(a) + ", " + std::to_string(b) + ")";
  return s.empty() ? "nothing" : s;
}

// The transient buffer of (iteration, tensor) in `made`, which an earlier task must have made:
// else the plan's order is at fault (PlanError: the task, what it does, who should have made it).
template <class Transients>
auto& made_before(Transients& made, const partition::Plan& plan, const TaskContext& task, int tensor,
                  const std::string& does, const std::string& maker) {
  const auto found = made.find({task.iteration, tensor});
  if (found == made.end()) {
    throw PlanError(partition::describe_task(plan, task.task) + " " + does + " of tensor " + std::to_string(tensor) +
                    ", which no " + maker + " of iteration " + std::to_string(task.iteration) + " made before it");
  }
  return found->second.floats;
}

// Under expert parallelism, whether collective `c` moves an expert rank's experts (over the
// workers of that rank alone) rather than the layers less their experts (over every worker,
// context ranks included): partition's Segment pieces, told apart by their members.
bool moves_experts(const partition::Plan& plan, const partition::Collective& c) {
  return plan.communicator(c.communicator).devices.size() < plan.layout.workers.size();
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

// The float where fraction f of a buffer of n begins, rounded as the back ends slice the parts
// of a reduce-scatter or all-gather (exec/cpu_backend.cpp).
size_t part_at(double f, size_t n) { return std::min(n, static_cast<size_t>(std::llround(f * static_cast<double>(n)))); }

// A chunk holding a tied embedding's table [table, table + t) of its `count` floats, ordered
// for ZeRO's collectives member by member: member i's slice [round(lo count), round(hi count))
// of the buffer holds its [round(lo t), round(hi t)) of the table and then as much of the rest
// of the chunk, in order. `parts`: every member's [lo, hi), tiling [0, 1). So each replica
// owns the same rows of the table in the first chunk and in the last, whatever else they
// hold. Empty where the parts do not tile, or a member's slice would hold less than its rows
// of the table (a chunk of little more than the table, cut in many parts).
std::vector<FloatRun> tied_member_runs(size_t count, size_t table, size_t t, std::vector<std::pair<double, double>> parts) {
  std::sort(parts.begin(), parts.end());
  std::vector<FloatRun> rest;  // the chunk less the table
  if (table > 0) rest.push_back({0, table});
  if (table + t < count) rest.push_back({table + t, count - table - t});
  std::vector<FloatRun> runs;
  double tiled = 0;
  for (const auto& [lo, hi] : parts) {
    const size_t a = part_at(lo, count), b = part_at(hi, count), ta = part_at(lo, t), tb = part_at(hi, t);
    if (lo != tiled || b - tb < a - ta) return {};
    tiled = hi;
    if (tb > ta) runs.push_back({table + ta, tb - ta});
    for (const FloatRun& run : slice_runs(rest, a - ta, b - tb)) runs.push_back(run);
  }
  if (tiled != 1) return {};
  return runs;
}

}  // namespace

GradientSync::GradientSync(const partition::Plan& plan, const DecoderShape& shape,
                           const std::map<int, ChunkState*>& chunk_of_tensor,
                           const std::map<int, std::pair<int, int>>& tp_position, std::function<bool(int)> local,
                           int zero_stage)
    : plan_(plan),
      shape_(shape),
      chunk_of_tensor_(chunk_of_tensor),
      tp_position_(tp_position),
      local_(std::move(local)),
      zero_stage_(zero_stage) {
  map_collectives();
  map_zero();
}

void GradientSync::map_collectives() {
  const partition::Plan& plan = plan_;
  collective_span_.assign(plan.tasks.size(), {0, 0});
  collective_chunk_.assign(plan.tasks.size(), nullptr);
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
    if (task.kind != TaskKind::collective || !local_(task.device)) continue;
    const auto& c = plan.collective(task.collective);
    if (c.purpose != partition::Purpose::data_parallel && c.purpose != partition::Purpose::embedding) continue;
    // From ZeRO stage 2 the sharded collectives move whole pieces (map_zero).
    if (zero_stage_ >= 2 && c.kind != partition::CollectiveKind::all_reduce) continue;
    const auto reads = plan.reads(static_cast<int>(t));
    const auto found = reads.empty() ? chunk_of_tensor_.end() : chunk_of_tensor_.find(reads[0]);
    if (found == chunk_of_tensor_.end()) {
      throw PlanError("collective task " + std::to_string(t) + " reduces no gradient tensor of a chunk");
    }
    ChunkState& chunk = *found->second;
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
      const bool routed = moves_experts(plan, c);
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
void GradientSync::check_collective_sizes() const {
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

// From stage 2 the two copies of a tied embedding (the first chunk's table, the last chunk's
// head) add after the reduce-scatters, each replica its shard: so each such chunk's ZeRO
// collectives move it member by member (tied_member_runs), and the embedding all-reduce sums
// in place the table's rows the member owns, the same rows at both ends. Refused, naming the
// collective, where the two ends would own different rows (their replicas' parts differ), or
// where the table is not one piece of its chunk (tensor-parallel degrees that differ between
// the ends, expert parallelism's pieces).
std::map<const ChunkState*, std::vector<FloatRun>> GradientSync::map_tied_embedding(const std::function<int(int)>& node) {
  const partition::Plan& plan = plan_;
  tied_shard_.assign(plan.tasks.size(), 0);
  std::map<const ChunkState*, std::vector<FloatRun>> runs_of_chunk;
  if (zero_stage_ < 2) return runs_of_chunk;
  // Each device's reduce-scatter leaving it a shard of a chunk, by that chunk's weight_grad.
  std::map<std::pair<int, int>, int> scatter_of;  // (device, weight_grad tensor) -> collective
  std::map<int, std::vector<int>> tasks_of;       // embedding collective -> its tasks
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind != TaskKind::collective) continue;
    const partition::Collective& c = plan.collective(task.collective);
    if (c.purpose == partition::Purpose::embedding) tasks_of[task.collective].push_back(static_cast<int>(t));
    if (c.purpose != partition::Purpose::data_parallel || c.kind != CollectiveKind::reduce_scatter) continue;
    const int grad = tensor_of_kind(plan, plan.writes(static_cast<int>(t)), TensorKind::weight_grad);
    if (grad >= 0) scatter_of.emplace(std::pair{task.device, grad}, task.collective);
  }
  for (const auto& [id, tasks] : tasks_of) {
    const std::string what = "collective " + std::to_string(id) + " sums a tied embedding between pipeline stages " +
                             "(layout.sync.zero.stage " + std::to_string(zero_stage_) + ")";
    // Each end's rows of the table: its fractions of its chunk's reduce-scatters.
    std::vector<std::pair<double, double>> rows;
    for (const int t : tasks) {
      const partition::Task& task = plan.task(t);
      const auto reads = plan.reads(t);
      const auto scatter = reads.empty() ? scatter_of.end() : scatter_of.find({task.device, reads[0]});
      if (scatter == scatter_of.end()) {
        throw PlanError(what + ": no reduce-scatter leaves device " + std::to_string(task.device) +
                        " a shard of the gradients it sums");
      }
      const partition::CollectiveSpec spec = partition::collective_spec(plan, plan.collective(scatter->second));
      rows.push_back(partition::member_part(spec, task.device, node));
      if (!local_(task.device)) continue;
      ChunkState& chunk = *chunk_of_tensor_.at(reads[0]);
      const ChunkParams& p = chunk.math.params();
      if (!collective_runs_[static_cast<size_t>(t)].empty()) {
        throw PlanError(what + ": its ends are tensor-parallel ranks of different degrees, whose shards of the table "
                               "are not one piece; plan them at one degree, or with --zero-stage 1");
      }
      if (chunk.math.experts().size > 1 && has_routed_experts(p, p.layer_begin, p.layer_end)) {
        throw PlanError(what + ": its chunk on device " + std::to_string(task.device) +
                        " holds experts sharded in pieces of their own (expert parallelism); plan it with --zero-stage 1");
      }
      const ParamSlot& table = p.slots[p.has_embedding ? 0 : p.head_slot];
      std::vector<std::pair<double, double>> parts;
      for (const int m : spec.devices) parts.push_back(partition::member_part(spec, m, node));
      std::vector<FloatRun> runs = tied_member_runs(p.count, table.offset, table.count, parts);
      if (runs.empty()) {
        throw PlanError(what + ": device " + std::to_string(task.device) + "'s chunk holds too little beside the table "
                        "to give each of its " + std::to_string(spec.devices.size()) + " replicas its rows of it");
      }
      const auto [lo, hi] = rows.back();
      collective_span_[static_cast<size_t>(t)] = {table.offset + part_at(lo, table.count),
                                                  table.offset + part_at(hi, table.count)};
      tied_shard_[static_cast<size_t>(t)] = 1;
      runs_of_chunk[&chunk] = std::move(runs);
    }
    if (std::adjacent_find(rows.begin(), rows.end(), std::not_equal_to<>()) != rows.end()) {
      throw PlanError(what + ": its ends' replicas shard the table differently (their ZeRO parts differ: " +
                      "layout.sync.zero.shares by memory over devices of different memories); plan them with equal "
                      "shares, or with --zero-stage 1");
    }
  }
  return runs_of_chunk;
}

// The part of Megatron's split that every member holds: the intersection of their ranks'
// [j / t, (j + 1) / t) (a member outside tensor parallelism holds all of it).
SplitPart GradientSync::common_part(const std::vector<int>& members) const {
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

void GradientSync::map_zero() {
  const partition::Plan& plan = plan_;
  zero_role_.assign(plan.tasks.size(), ZeroRole::none);
  zero_part_.assign(plan.tasks.size(), {0, 0});
  if (zero_stage_ == 0) return;
  std::vector<int> node_of;
  for (const model::Device& d : plan.cluster.devices()) node_of.push_back(d.node);
  const auto node = [&](int d) { return d >= 0 && static_cast<size_t>(d) < node_of.size() ? node_of[static_cast<size_t>(d)] : d; };
  const std::map<const ChunkState*, std::vector<FloatRun>> tied = map_tied_embedding(node);
  // Per chunk: the ranges its reduce-scatters leave it, its all-gathers bring it, and every
  // range a reduce-scatter moves (what none moves is the chunk's alone: under expert
  // parallelism, experts of a rank that one replica holds).
  std::map<ChunkState*, Ranges> scattered, gathered, moved;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    int copy = -1;
    for (const int id : plan.reads(static_cast<int>(t))) {
      if (plan.tensor(id).kind != TensorKind::gathered_weight) continue;
      ++readers_of_[id];
      copy = copy < 0 ? id : std::min(copy, id);
    }
    for (const int id : plan.reads(static_cast<int>(t))) {
      if (plan.tensor(id).kind == TensorKind::gathered_weight) copy_of_[id] = copy;
    }
    if (task.kind != TaskKind::collective || !local_(task.device)) continue;
    const partition::Collective& c = plan.collective(task.collective);
    const bool scatter = c.kind == CollectiveKind::reduce_scatter, gather = c.kind == CollectiveKind::all_gather;
    if (c.purpose != partition::Purpose::data_parallel || !(scatter || gather)) continue;
    const auto reads = plan.reads(static_cast<int>(t)), writes = plan.writes(static_cast<int>(t));
    // The chunk: a stage-2/3 reduce-scatter writes its gradients, any other reads its gradients or weights.
    const int tensor = scatter && !reads.empty() && plan.tensor(reads[0]).kind == TensorKind::unsharded_grad
                           ? (writes.empty() ? -1 : writes[0])
                           : (reads.empty() ? -1 : reads[0]);
    const auto found = chunk_of_tensor_.find(tensor);
    if (found == chunk_of_tensor_.end()) {
      throw PlanError(partition::describe_task(plan, static_cast<int>(t)) + ": a ZeRO " +
                      std::string(partition::to_string(c.kind)) + " that moves no chunk's weights or gradients");
    }
    ChunkState& chunk = *found->second;
    ZeroRole role = scatter ? ZeroRole::scatter : ZeroRole::gather;
    if (scatter && tensor != reads[0]) role = ZeroRole::scatter_whole;
    if (gather && !writes.empty() && plan.tensor(writes[0]).kind == TensorKind::gathered_weight) {
      role = ZeroRole::gather_copy;
    }
    // Stage 1's buckets are spans of the chunk (map_collectives); the rest move whole pieces,
    // under expert parallelism two: the layers less their routed experts over every replica,
    // the experts over their holders (told apart by their members, as map_collectives does).
    if (zero_stage_ >= 2) {
      const ChunkParams& p = chunk.math.params();
      collective_chunk_[t] = &chunk;
      collective_span_[t] = {0, p.count};
      if (chunk.math.experts().size > 1 && has_routed_experts(p, p.layer_begin, p.layer_end)) {
        const bool routed = moves_experts(plan, c);
        collective_runs_[t] = expert_piece_runs(p, p.layer_begin, p.layer_end, routed);
      }
      if (const auto found_tied = tied.find(&chunk); found_tied != tied.end()) collective_runs_[t] = found_tied->second;
      if (role == ZeroRole::scatter_whole) ++scatters_of_whole_[reads[0]];
    }
    const auto [lo, hi] = partition::member_part(partition::collective_spec(plan, c), task.device, node);
    zero_role_[t] = role;
    if (const auto& runs = collective_runs_[t]; !runs.empty()) {
      // Under expert parallelism a piece is runs of the chunk (map_collectives; stage 2 above),
      // as is a chunk holding a tied copy (member by member: map_tied_embedding), packed into
      // one buffer; the member's part of the buffer is runs of the chunk too.
      const size_t count = floats_of(runs);
      zero_part_[t] = {part_at(lo, count), part_at(hi, count)};  // (of the packed buffer)
      for (const FloatRun& run : slice_runs(runs, part_at(lo, count), part_at(hi, count))) {
        (scatter ? scattered : gathered)[&chunk].emplace_back(run.at, run.at + run.count);
      }
      if (scatter) {
        for (const FloatRun& run : runs) moved[&chunk].emplace_back(run.at, run.at + run.count);
      }
      continue;
    }
    const auto [begin, end] = collective_span_[t];
    zero_part_[t] = {begin + part_at(lo, end - begin), begin + part_at(hi, end - begin)};
    (scatter ? scattered : gathered)[&chunk].push_back(zero_part_[t]);
    if (scatter) moved[&chunk].emplace_back(begin, end);
  }
  for (auto& [chunk, parts] : scattered) {
    chunk->owned = merged(parts);
    const Ranges brought = merged(gathered[chunk]);
    Ranges alone;  // what no reduce-scatter moves: the chunk's whole
    size_t from = 0;
    for (const auto& [a, b] : merged(moved[chunk])) {
      alone.emplace_back(from, a);
      from = b;
    }
    alone.emplace_back(from, chunk->params.size());
    // Stage 3 gathers whole pieces, of which the scattered shard is a part; 1 and 2 gather back what they scattered.
    if (brought != chunk->owned) {
      throw PlanError("the plan's all-gathers of worker " + std::to_string(chunk->worker) + "'s stage " +
                      std::to_string(chunk->stage) + " on device " + std::to_string(chunk->device) +
                      " bring its parameters " + ranges_text(brought) + ", but its reduce-scatters leave it the gradients " +
                      ranges_text(chunk->owned) + ": a replica's optimizer steps the shard it is left");
    }
    chunk->alone = merged(alone);
    alone.insert(alone.end(), chunk->owned.begin(), chunk->owned.end());
    chunk->owned = merged(std::move(alone));
  }
  for (auto& [chunk, parts] : gathered) {
    if (!scattered.count(chunk)) {
      throw PlanError("the plan all-gathers the parameters of worker " + std::to_string(chunk->worker) + "'s stage " +
                      std::to_string(chunk->stage) + " on device " + std::to_string(chunk->device) +
                      " but reduce-scatters none of its gradients");
    }
  }
}

int GradientSync::copy_read_by(int task) const {
  const int gathered = tensor_of_kind(plan_, plan_.reads(task), TensorKind::gathered_weight);
  const auto copy = copy_of_.find(gathered);
  return copy == copy_of_.end() ? gathered : copy->second;
}

const float* GradientSync::pass_params(const TaskContext& task, ChunkState& c) {
  const int gathered = zero_stage_ >= 3 ? copy_read_by(task.task) : -1;
  if (gathered < 0 && c.params_sharded) {
    throw PlanError(partition::describe_task(plan_, task.task) + " reads no gathered parameters (gathered_weight) "
                    "under layout.sync.zero.stage " + std::to_string(zero_stage_) + ": this replica holds its shard alone");
  }
  if (gathered < 0) return c.params.data();
  std::lock_guard lock(transient_mutex_);
  return made_before(transient_, plan_, task, gathered, "reads the gathered parameters", "all-gather").data();
}

float* GradientSync::pass_grads(const TaskContext& task, ChunkState& c) {
  if (zero_stage_ < 2) return c.grads.data();
  int whole = tensor_of_kind(plan_, plan_.writes(task.task), TensorKind::unsharded_grad);
  if (whole < 0) whole = tensor_of_kind(plan_, plan_.reads(task.task), TensorKind::unsharded_grad);
  if (whole < 0 && c.grads_sharded) {  // (its gradients hold the shard alone)
    throw PlanError(partition::describe_task(plan_, task.task) + " writes no whole gradient buffer (unsharded_grad) "
                    "under layout.sync.zero.stage " + std::to_string(zero_stage_) + ": the pass has nowhere to add");
  }
  if (whole < 0) return c.grads.data();
  std::lock_guard lock(transient_mutex_);
  Transient& t = transient_[{task.iteration, whole}];
  if (t.floats.size() == 0) {  // its first pass: backwards add; its reduce-scatters free it (zero_done)
    t.floats = c.ops().zeros(c.whole());
    const auto readers = scatters_of_whole_.find(whole);
    t.reads_left = readers == scatters_of_whole_.end() ? 1 : readers->second;
  }
  return t.floats.data();
}

void GradientSync::pass_done(const TaskContext& task) {
  if (zero_stage_ < 3) return;
  const int gathered = copy_read_by(task.task);
  if (gathered < 0) return;
  std::lock_guard lock(transient_mutex_);
  const auto found = transient_.find({task.iteration, gathered});
  if (found != transient_.end() && --found->second.reads_left <= 0) transient_.erase(found);
}

std::span<float> GradientSync::zero_data(const TaskContext& task) {
  const auto t = static_cast<size_t>(task.task);
  ChunkState& c = *collective_chunk_[t];
  const auto [begin, end] = collective_span_[t];
  // A piece of runs (expert parallelism) moves through a buffer: packed here, unpacked by zero_done.
  const auto packed = [&](const OpsFloats& from) {
    OpsFloats& buffer = gathered_[t];
    buffer = c.ops().floats(floats_of(collective_runs_[t]));
    size_t at = 0;
    for (const FloatRun& run : collective_runs_[t]) {
      c.ops().copy(buffer.data() + at, from.data() + run.at, run.count);
      at += run.count;
    }
    return buffer.span();
  };
  switch (zero_role_[t]) {
    case ZeroRole::scatter:
      if (!collective_runs_[t].empty()) return packed(c.grads);
      return c.grads.span().subspan(begin, end - begin);
    case ZeroRole::gather:
      if (!collective_runs_[t].empty()) return packed(c.params);
      return c.params.span().subspan(begin, end - begin);
    case ZeroRole::scatter_whole: {
      const int whole = plan_.reads(task.task)[0];
      std::lock_guard lock(transient_mutex_);
      OpsFloats& summed = made_before(transient_, plan_, task, whole, "reduce-scatters the gradients", "pass");
      if (!collective_runs_[t].empty()) return packed(summed);
      return summed.span();
    }
    case ZeroRole::gather_copy: {
      if (!collective_runs_[t].empty()) {
        // A piece of runs (expert parallelism): this member's part packed from its shard; zero_done
        // unpacks the gathered piece into the pass's whole copy.
        OpsFloats& buffer = gathered_[t];
        buffer = c.ops().floats(floats_of(collective_runs_[t]));
        const auto [a, b] = zero_part_[t];
        size_t at = 0;
        for (const FloatRun& run : collective_runs_[t]) {
          const size_t from = std::max(at, a), to = std::min(at + run.count, b);
          if (from < to) c.ops().copy(buffer.data() + from, c.params.data() + c.index_in(c.params, run.at + (from - at)), to - from);
          at += run.count;
        }
        return buffer.span();
      }
      const int whole = plan_.writes(task.task)[0];
      OpsFloats copy = c.ops().floats(c.whole());
      const auto [a, b] = zero_part_[t];  // what this member brings (its shard's); the steps bring the rest
      c.ops().copy(copy.data() + a, c.params.data() + c.index_in(c.params, a), b - a);
      std::lock_guard lock(transient_mutex_);
      Transient& made = transient_[{task.iteration, whole}];
      made.floats = std::move(copy);
      made.reads_left = readers_of_.count(whole) ? readers_of_.at(whole) : 0;
      return made.floats.span();
    }
    case ZeroRole::none:
      break;
  }
  return {};
}

void GradientSync::zero_done(const TaskContext& task) {
  const auto t = static_cast<size_t>(task.task);
  ChunkState& c = *collective_chunk_[t];
  if (!collective_runs_[t].empty() && zero_role_[t] == ZeroRole::gather_copy) {
    // A gathered piece into the whole copy its pass reads (made by the pass's first piece).
    const int piece = plan_.writes(task.task)[0];
    const auto copy = copy_of_.find(piece);
    const int whole = copy == copy_of_.end() ? piece : copy->second;
    std::lock_guard lock(transient_mutex_);
    Transient& made = transient_[{task.iteration, whole}];
    if (made.floats.size() == 0) {  // (and the experts this replica holds alone, which no piece gathers)
      made.floats = c.ops().floats(c.whole());
      made.reads_left = readers_of_.count(whole) ? readers_of_.at(whole) : 0;
      for (const auto& [a, b] : c.alone) c.ops().copy(made.floats.data() + a, c.params.data() + c.index_in(c.params, a), b - a);
    }
    size_t at = 0;
    for (const FloatRun& run : collective_runs_[t]) {
      c.ops().copy(made.floats.data() + run.at, gathered_[t].data() + at, run.count);
      at += run.count;
    }
    gathered_[t] = OpsFloats();
    return;
  }
  if (!collective_runs_[t].empty() && zero_role_[t] != ZeroRole::scatter_whole) {
    // A piece of runs (scatter or gather): its sums or parameters back in place.
    const OpsFloats& into = zero_role_[t] == ZeroRole::scatter ? c.grads : c.params;
    size_t at = 0;
    for (const FloatRun& run : collective_runs_[t]) {
      c.ops().copy(into.data() + run.at, gathered_[t].data() + at, run.count);
      at += run.count;
    }
    gathered_[t] = OpsFloats();
    return;
  }
  if (zero_role_[t] != ZeroRole::scatter_whole) return;
  const auto [a, b] = zero_part_[t];
  const int whole = plan_.reads(task.task)[0];
  std::lock_guard lock(transient_mutex_);
  const OpsFloats& summed = made_before(transient_, plan_, task, whole, "reduce-scatters the gradients", "pass");
  const auto add = [&](size_t into, const float* from, size_t n) {  // (into an owned run: contiguous in a shard)
    if (n > 0) c.ops().residual_add(c.grad_at(into), from, static_cast<long>(n));
  };
  // (The shard's sum lands in the chunk's gradients, micro-batch after micro-batch.)
  if (collective_runs_[t].empty()) {
    add(a, summed.data() + a, b - a);
  } else {  // a piece of runs: the member's part of the packed sums into its runs of the chunk
    size_t at = 0;
    for (const FloatRun& run : collective_runs_[t]) {
      const size_t from = std::max(a, at), to = std::min(b, at + run.count);
      if (from < to) add(run.at + (from - at), gathered_[t].data() + from, to - from);
      at += run.count;
    }
    gathered_[t] = OpsFloats();
  }
  // The whole buffer goes with its last reduce-scatter, leaving what none moves (experts one
  // replica holds) to the chunk's gradients whole.
  Transient& made = transient_.at({task.iteration, whole});
  if (--made.reads_left > 0) return;
  for (const auto& [from, to] : c.alone) add(from, made.floats.data() + from, to - from);
  transient_.erase({task.iteration, whole});
}

std::span<float> GradientSync::data(const TaskContext& task) {
  if (zero_stage_ > 0 && zero_role_[static_cast<size_t>(task.task)] != ZeroRole::none) return zero_data(task);
  ChunkState* c = collective_chunk_[static_cast<size_t>(task.task)];
  if (c == nullptr) return {};
  if (!tied_shard_.empty() && tied_shard_[static_cast<size_t>(task.task)]) {  // the table's owned rows, in place
    const auto [begin, end] = collective_span_[static_cast<size_t>(task.task)];
    return {c->grad_at(begin), end - begin};
  }
  if (c->grads_sharded) {
    throw PlanError(partition::describe_task(plan_, task.task) + " reduces whole gradients, which a replica under "
                    "layout.sync.zero.stage " + std::to_string(zero_stage_) + " keeps only its shard of");
  }
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

void GradientSync::done(const TaskContext& task) {
  if (static_cast<size_t>(task.task) >= collective_runs_.size()) return;
  if (zero_stage_ > 0 && zero_role_[static_cast<size_t>(task.task)] != ZeroRole::none) return zero_done(task);
  const auto& runs = collective_runs_[static_cast<size_t>(task.task)];
  if (runs.empty()) return;
  ChunkState& c = *collective_chunk_[static_cast<size_t>(task.task)];
  OpsFloats& buffer = gathered_[static_cast<size_t>(task.task)];
  size_t at = 0;
  for (const FloatRun& run : runs) {
    c.ops().copy(c.grads.data() + run.at, buffer.data() + at, run.count);
    at += run.count;
  }
  buffer = OpsFloats();
}

}  // namespace hetflow::exec
