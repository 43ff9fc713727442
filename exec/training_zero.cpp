// exec::Training under ZeRO (training.hpp): which floats of a chunk each sharded collective
// moves, what each replica owns, and the transient whole buffers of stages 2 and 3.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "exec/training.hpp"
#include "exec/training_chunk.hpp"
#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

using partition::CollectiveKind;
using partition::TaskKind;
using partition::TensorKind;
using training_detail::tensor_of_kind;

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

}  // namespace

int Training::weight_read_by(int task) const {
  const auto reads = plan_.reads(task);
  const int weight = tensor_of_kind(plan_, reads, TensorKind::weight);
  if (weight >= 0) return weight;
  const int gathered = tensor_of_kind(plan_, reads, TensorKind::gathered_weight);
  const auto found = weight_of_gathered_.find(gathered);
  return found == weight_of_gathered_.end() ? -1 : found->second;
}

void Training::map_zero() {
  const partition::Plan& plan = plan_;
  zero_role_.assign(plan.tasks.size(), ZeroRole::none);
  zero_part_.assign(plan.tasks.size(), {0, 0});
  if (zero_stage_ == 0) return;
  for (size_t id = 0; id < plan.collectives.size() && zero_stage_ >= 2; ++id) {
    // (Stage 1 sums the two copies whole before its reduce-scatters: plan_builder_sync.cpp.)
    if (plan.collectives[id].purpose == partition::Purpose::embedding) {
      throw PlanError("collective " + std::to_string(id) + " sums a tied embedding between pipeline stages, whose "
                      "replicas shard its two copies differently (layout.sync.zero.stage " +
                      std::to_string(zero_stage_) + "): the executors do not run it; keep the embedding and the head "
                      "on one stage, untie them, or plan without --zero-stage");
    }
  }
  if (zero_stage_ >= 2 && plan.layout.sequence_parallel && tensor_parallel()) {
    throw PlanError("sequence parallelism sums its norm gains over the tensor-parallel ranks once per step, after "
                    "ZeRO stage " + std::to_string(zero_stage_) + " has scattered every micro-batch's gradients "
                    "(layout.sync.zero.stage): the executors do not run it; use stage 1 or plan without "
                    "--sequence-parallel");
  }
  std::vector<int> node_of;
  for (const model::Device& d : plan.cluster.devices()) node_of.push_back(d.node);
  const auto node = [&](int d) { return d >= 0 && static_cast<size_t>(d) < node_of.size() ? node_of[static_cast<size_t>(d)] : d; };
  // Per chunk: the ranges its reduce-scatters leave it, its all-gathers bring it, and every
  // range a reduce-scatter moves (what none moves is the chunk's alone: under expert
  // parallelism, experts of a rank that one replica holds).
  std::map<Chunk*, Ranges> scattered, gathered, moved;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    for (const int id : plan.reads(static_cast<int>(t))) {
      if (plan.tensor(id).kind == TensorKind::gathered_weight) ++readers_of_[id];
    }
    if (task.kind != TaskKind::collective || !local(task.device)) continue;
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
    Chunk& chunk = *found->second;
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
      if (chunk.math.experts().size > 1 && training_detail::has_routed_experts(p, p.layer_begin, p.layer_end)) {
        const size_t context = static_cast<size_t>(std::max(1, plan.layout.size(partition::Axis::context)));
        const bool routed = plan.communicator(c.communicator).devices.size() < plan.layout.workers.size() / context;
        collective_runs_[t] = training_detail::expert_piece_runs(p, p.layer_begin, p.layer_end, routed);
      }
      if (role == ZeroRole::scatter_whole) ++scatters_of_whole_[reads[0]];
    }
    const auto [lo, hi] = partition::member_part(partition::collective_spec(plan, c), task.device, node);
    zero_role_[t] = role;
    const auto at = [&](double f, size_t count) {
      return std::min(count, static_cast<size_t>(std::llround(f * static_cast<double>(count))));
    };
    if (const auto& runs = collective_runs_[t]; !runs.empty()) {
      // Under expert parallelism a piece is runs of the chunk (map_collectives; stage 2 above),
      // packed into one buffer; the member's part of the buffer is runs of the chunk too.
      if (role == ZeroRole::gather_copy) {
        throw PlanError(partition::describe_task(plan, static_cast<int>(t)) + ": a ZeRO stage-3 all-gather of a part "
                        "of its chunk's parameters (expert parallelism), which the executors do not run");
      }
      const size_t count = floats_of(runs);
      zero_part_[t] = {at(lo, count), at(hi, count)};  // (of the packed buffer)
      for (const FloatRun& run : slice_runs(runs, at(lo, count), at(hi, count))) {
        (scatter ? scattered : gathered)[&chunk].emplace_back(run.at, run.at + run.count);
      }
      if (scatter) {
        for (const FloatRun& run : runs) moved[&chunk].emplace_back(run.at, run.at + run.count);
      }
      continue;
    }
    const auto [begin, end] = collective_span_[t];
    zero_part_[t] = {begin + at(lo, end - begin), begin + at(hi, end - begin)};
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
  // Stage 3: no pass reads the chunk's own parameters, only gathered copies.
  if (zero_stage_ >= 3) {
    for (auto& c : chunks_) {
      if (!c->owned.empty()) set_unowned(*c, std::numeric_limits<float>::quiet_NaN());
    }
  }
}

void Training::set_unowned(Chunk& c, float value) {
  size_t at = 0;
  std::vector<float> fill;
  const auto set = [&](size_t a, size_t b) {
    if (b <= a) return;
    fill.assign(b - a, value);
    c.ops().upload(c.params.data() + a, fill.data(), b - a);
  };
  for (const auto& [a, b] : c.owned) {
    set(at, a);
    at = b;
  }
  set(at, c.params.size());
}

const float* Training::pass_params(const TaskContext& task, Chunk& c) {
  const int gathered = zero_stage_ >= 3 ? tensor_of_kind(plan_, plan_.reads(task.task), TensorKind::gathered_weight) : -1;
  if (gathered < 0) return c.params.data();
  std::lock_guard lock(transient_mutex_);
  return made_before(transient_, plan_, task, gathered, "reads the gathered parameters", "all-gather").data();
}

float* Training::pass_grads(const TaskContext& task, Chunk& c) {
  if (zero_stage_ < 2) return c.grads.data();
  int whole = tensor_of_kind(plan_, plan_.writes(task.task), TensorKind::unsharded_grad);
  if (whole < 0) whole = tensor_of_kind(plan_, plan_.reads(task.task), TensorKind::unsharded_grad);
  if (whole < 0) return c.grads.data();
  std::lock_guard lock(transient_mutex_);
  Transient& t = transient_[{task.iteration, whole}];
  if (t.floats.size() == 0) {  // its first pass: backwards add; its reduce-scatters free it (zero_done)
    t.floats = c.ops().zeros(c.params.size());
    const auto readers = scatters_of_whole_.find(whole);
    t.reads_left = readers == scatters_of_whole_.end() ? 1 : readers->second;
  }
  return t.floats.data();
}

void Training::pass_done(const TaskContext& task) {
  if (zero_stage_ < 3) return;
  const int gathered = tensor_of_kind(plan_, plan_.reads(task.task), TensorKind::gathered_weight);
  if (gathered < 0) return;
  std::lock_guard lock(transient_mutex_);
  const auto found = transient_.find({task.iteration, gathered});
  if (found != transient_.end() && --found->second.reads_left <= 0) transient_.erase(found);
}

std::span<float> Training::zero_data(const TaskContext& task) {
  const auto t = static_cast<size_t>(task.task);
  Chunk& c = *collective_chunk_[t];
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
      const int whole = plan_.writes(task.task)[0];
      OpsFloats copy = c.ops().floats(c.params.size());
      const auto [a, b] = zero_part_[t];  // what this member brings; the steps bring the rest
      c.ops().copy(copy.data() + a, c.params.data() + a, b - a);
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

void Training::zero_done(const TaskContext& task) {
  const auto t = static_cast<size_t>(task.task);
  Chunk& c = *collective_chunk_[t];
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
  const auto add = [&](size_t into, const float* from, size_t n) {
    if (n > 0) c.ops().residual_add(c.grads.data() + into, from, static_cast<long>(n));
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

void Training::fill_from_shards(int stage, int tp_rank, int expert_rank, std::vector<float>& values) const {
  if (zero_stage_ == 0) return;
  for (const auto& c : chunks_) {
    if (c->worker == 0 || c->stage != stage || c->tp_rank != tp_rank || c->math.experts().rank != expert_rank) continue;
    for (const auto& [a, b] : c->owned) c->ops().download(values.data() + a, c->params.data() + a, b - a);
  }
  for (const RemoteShard& r : remote_shards_) {
    if (r.stage != stage || r.tp_rank != tp_rank || r.expert_rank != expert_rank) continue;
    if (r.offset + r.values.size() > values.size()) throw Error("a rank sent a shard beyond its chunk's parameters");
    std::copy(r.values.begin(), r.values.end(), values.begin() + static_cast<std::ptrdiff_t>(r.offset));
  }
}

}  // namespace hetflow::exec
