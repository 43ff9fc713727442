// The chunks of estimate_layout's virtual workers and the communication among them
// (partition/layout_estimate_detail.hpp).
#include <algorithm>

#include "partition/layout_estimate_detail.hpp"
#include "partition/tp_calls.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::estimate_detail {

namespace {

// The compute time of a chunk's pass on each device of its rank (devices that compute alike
// share one evaluation: the operation costs walk every layer).
std::vector<double> per_device(const model::Network& network, const Layout& layout, const CostModel& cost, Task task,
                               const std::vector<int>& devices) {
  std::vector<double> out(devices.size());
  for (size_t j = 0; j < devices.size(); ++j) {
    if (j > 0 && cost.same_compute(devices[j], devices[j - 1])) {
      out[j] = out[j - 1];
      continue;
    }
    task.device = devices[j];
    out[j] = cost.task_compute_time_s(network, layout, task);
  }
  return out;
}

CollectiveSpec ring_of(CollectiveKind kind, const std::vector<int>& devices, double bytes, int messages = 1) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.algorithm = CollectiveAlgorithm::ring;
  spec.devices = devices;
  spec.bytes = bytes;
  spec.messages = messages;
  return spec;
}

// Chunk k's compute per tensor rank for each of its passes.
void compute_of(const model::Network& network, const Layout& layout, const CostModel& cost, int w, size_t k,
                const builder::ChunkWork& wk, bool splits_backward, Chunk& c) {
  const VirtualWorker& vw = layout.workers[static_cast<size_t>(w)];
  Task task;
  task.worker = w;
  task.stage = static_cast<int>(k);
  task.layer_begin = vw.stages[k].layer_begin;
  task.layer_end = vw.stages[k].layer_end;
  task.memory_bytes = wk.weight_bytes + wk.stash_bytes;
  task.kind = TaskKind::forward;
  task.flops = wk.forward_flops;
  c.f_compute_s = per_device(network, layout, cost, task, *c.devices);
  task.kind = TaskKind::backward;
  task.flops = (splits_backward ? wk.backward_flops / 2 : wk.backward_flops) + wk.recompute_flops;
  task.recompute_flops = wk.recompute_flops;
  c.b_compute_s = per_device(network, layout, cost, task, *c.devices);
  if (splits_backward) {
    task.kind = TaskKind::backward_weight;
    task.flops = wk.backward_flops / 2;
    task.recompute_flops = 0;
    c.w_compute_s = per_device(network, layout, cost, task, *c.devices);
  }
  if (layout.offload.activations && wk.stash_bytes > 0) {  // (Builder::offload_stash: each device its own)
    for (const int d : *c.devices) c.stash_copy_s = std::max(c.stash_copy_s, cost.host_copy_time_s(d, wk.stash_bytes));
  }
}

// Expert parallelism: each pass of a chunk holding MoE layers meets its expert group at every
// combine, so it takes the slowest member's compute (its own load of the routed experts on
// its own devices), the busiest rank on alike devices, a slower rank with fewer experts on
// mixed ones.
void gate_by_expert_group(const model::Network& network, const Layout& layout, const CostModel& cost, int w, size_t k,
                          bool splits_backward, WorkMemo& memo, Chunk& c) {
  const int ep = layout.experts.parallel, context = layout.size(Axis::context);
  const Stage& s = layout.workers[static_cast<size_t>(w)].stages[k];
  if (ep <= 1 || routed_expert_params(network, s.layer_begin, s.layer_end, 1) <= 0) return;
  const builder::ChunkWork& mine = memo.of(s, layout.workers[static_cast<size_t>(w)].tensor_of(k), w).work;
  for (const int m : expert_group(w, static_cast<int>(layout.workers.size()) / context, context, ep)) {
    if (m == w) continue;
    const VirtualWorker& peer = layout.workers[static_cast<size_t>(m)];
    const builder::ChunkWork& theirs = memo.of(peer.stages[k], peer.tensor_of(k), m).work;
    const std::vector<int>& devices = peer.ranks.at(static_cast<size_t>(peer.stages[k].rank));
    // A member alike (its work, its devices' speed) takes this one's time: no need to time it
    // (every member of a balanced group on one GPU type, DeepSeek's 64 included).
    bool alike = theirs.forward_flops == mine.forward_flops && theirs.backward_flops == mine.backward_flops &&
                 theirs.weight_bytes == mine.weight_bytes && devices.size() == c.devices->size();
    for (size_t j = 0; alike && j < devices.size(); ++j) alike = cost.same_compute(devices[j], (*c.devices)[j]);
    if (alike) continue;
    Chunk other;
    other.devices = &devices;
    compute_of(network, layout, cost, m, k, theirs, splits_backward, other);
    const auto gate = [](std::vector<double>& own, const std::vector<double>& peer_s) {
      const double slowest = largest(peer_s);
      for (double& x : own) x = std::max(x, slowest);
    };
    gate(c.f_compute_s, other.f_compute_s);
    gate(c.b_compute_s, other.b_compute_s);
    gate(c.w_compute_s, other.w_compute_s);
  }
}

// The slowest tensor rank's transfer of `whole` bytes from chunk `from` to chunk `to`:
// receiving rank j gets 1/t_to of it from sending rank j % t_from (none on one device).
void boundary(PipelineComm& comm, int w, size_t k, PipelineComm::Slot slot, const std::vector<int>& from,
              const std::vector<int>& to, double whole) {
  const double bytes = whole / static_cast<double>(to.size());
  if (bytes <= 0) return;
  for (size_t j = 0; j < to.size(); ++j) {
    const int src = from[j % from.size()], dst = to[j];
    if (src != dst) comm.transfer(w, k, slot, src, dst, bytes);
  }
}

}  // namespace

PipelineComm::Phase& PipelineComm::phase(int w, size_t k, Slot slot, int order) {
  // Shared: every worker's in one phase; alone: each its own (each item is timed alone anyway).
  const auto key = std::make_tuple(k, static_cast<int>(slot), order, shared_ ? -1 : w);
  auto it = phases_.find(key);
  if (it == phases_.end()) it = phases_.emplace(key, Phase{SharedPhase(cost_, shared_), {}}).first;
  return it->second;
}

void PipelineComm::collective(int w, size_t k, Slot slot, int order, const CollectiveSpec& c, std::vector<double> overlap) {
  if (c.devices.size() < 2 || c.bytes <= 0) return;
  Phase& p = phase(w, k, slot, order);
  p.items.add(c);
  p.uses.push_back({w, k, slot, std::move(overlap)});
}

void PipelineComm::transfer(int w, size_t k, Slot slot, int src, int dst, double bytes) {
  Phase& p = phase(w, k, slot, 0);
  p.items.add_transfer(src, dst, bytes);
  p.uses.push_back({w, k, slot});
}

void PipelineComm::resolve(std::vector<std::vector<Chunk>*>& chunks) {
  for (const auto& [key, p] : phases_) {
    const std::vector<double> times = p.items.times_s();
    for (size_t i = 0; i < times.size(); ++i) {
      const Use& use = p.uses[i];
      Chunk& c = (*chunks[static_cast<size_t>(use.worker)])[use.chunk];
      // Overlapped messages (Use::overlap): what each outlasts of its part of the pass.
      const auto exposed = [&](const std::vector<double>& compute_s) {
        if (use.overlap.empty()) return times[i];
        const double one = times[i] / static_cast<double>(use.overlap.size()), pass_s = largest(compute_s);
        double s = 0;
        for (const double part : use.overlap) s += std::max(0.0, one - part * pass_s);
        return s;
      };
      switch (use.slot) {
        case kForwardBefore: c.f_before_s += times[i]; break;
        case kForwardAfter: c.f_after_s += exposed(c.f_compute_s); break;
        case kBackwardBefore: c.b_before_s += times[i]; break;
        case kBackwardAfter: c.b_after_s += exposed(c.b_compute_s); break;
        case kLastBackwardAfter: c.last_b_after_s += times[i]; break;
        case kToNext: c.to_next_s = std::max(c.to_next_s, times[i]); break;
        case kToPrevious: c.to_previous_s = std::max(c.to_previous_s, times[i]); break;
      }
    }
  }
  for (std::vector<Chunk>* worker : chunks) {
    for (Chunk& c : *worker) {
      c.f_s = c.f_before_s + largest(c.f_compute_s) + c.f_after_s;
      c.b_s = c.b_before_s + largest(c.b_compute_s) + c.b_after_s;
      c.w_s = largest(c.w_compute_s);
    }
  }
}

std::vector<Chunk> chunks_of(const model::Network& network, const Layout& layout, const CostModel& cost, int w,
                             bool splits_backward, WorkMemo& memo, PipelineComm& comm) {
  const VirtualWorker& vw = layout.workers[static_cast<size_t>(w)];
  const size_t count = vw.stages.size();
  std::vector<Chunk> chunks(count);
  std::vector<builder::ChunkWork> work(count);
  std::vector<bool> sharded(count);
  for (size_t k = 0; k < count; ++k) {
    const Stage& s = vw.stages[k];
    chunks[k].rank = s.rank;
    chunks[k].devices = &vw.ranks.at(static_cast<size_t>(s.rank));
    work[k] = memo.of(s, vw.tensor_of(k), w).work;
    sharded[k] = layout.sequence_parallel && builder::tp_collectives(work[k], vw.tensor_of(k));
  }
  for (size_t k = 0; k < count; ++k) {
    Chunk& c = chunks[k];
    const builder::ChunkWork& wk = work[k];
    const std::vector<int>& devices = *c.devices;
    const bool tp = builder::tp_collectives(wk, static_cast<int>(devices.size()));
    compute_of(network, layout, cost, w, k, wk, splits_backward, c);
    gate_by_expert_group(network, layout, cost, w, k, splits_backward, memo, c);
    // Tensor-parallel collectives: a sliced boundary's all-gather (Builder::gather_inputs), the
    // calls inside the passes, the summed gains.
    for (const bool backward : {false, true}) {
      const auto before = backward ? PipelineComm::kBackwardBefore : PipelineComm::kForwardBefore;
      const auto after = backward ? PipelineComm::kBackwardAfter : PipelineComm::kForwardAfter;
      const int neighbour = backward ? static_cast<int>(k) + 1 : static_cast<int>(k) - 1;
      if (neighbour >= 0 && neighbour < static_cast<int>(count) && devices.size() > 1 && !sharded[k] &&
          devices != *chunks[static_cast<size_t>(neighbour)].devices) {
        comm.collective(w, k, before, 0,
                        ring_of(CollectiveKind::all_gather, devices, backward ? wk.output_bytes : wk.input_bytes));
      }
      // The calls inside the pass (tp_calls.hpp, axis_context.cpp, axis_expert.cpp), one collective per kind
      // and size as the plan has them, timed after its compute as the plan's estimate times
      // them.
      const int context = layout.size(Axis::context), ep = layout.experts.parallel;
      if (!tp && context <= 1 && ep <= 1) continue;
      PassShape pass;
      pass.layer_begin = vw.stages[k].layer_begin;
      pass.layer_end = vw.stages[k].layer_end;
      pass.tensor = static_cast<int>(devices.size());
      pass.backward = backward;
      pass.sequence_parallel = layout.sequence_parallel;
      pass.split_backward = splits_backward;
      pass.recompute = layout.recompute;
      pass.context = context;
      pass.context_comm = layout.context_comm;
      pass.experts = ep;
      pass.expert_kept = memo.dispatch().kept;
      pass.expert_load = memo.expert_load(w);
      pass.micro_batch = layout.micro_batch_size;
      const double bytes_per_elem = layout.micro_batch_size * model::element_bytes(layout.precision);
      // A context group's devices at this chunk's first tensor rank (its other ranks' groups
      // are alike).
      std::vector<int> peers;
      const size_t first = static_cast<size_t>(w) - static_cast<size_t>(w) % static_cast<size_t>(context);
      for (size_t m = first; context > 1 && m < first + static_cast<size_t>(context) && m < layout.workers.size(); ++m) {
        peers.push_back(layout.workers[m].ranks[static_cast<size_t>(vw.stages[k].rank)].front());
      }
      // An expert group's devices likewise (expert_shard.hpp), exchanging in the routing's parts.
      std::vector<int> group;
      for (const int m : ep > 1 ? expert_group(w, static_cast<int>(layout.workers.size()) / context, context, ep)
                                : std::vector<int>{}) {
        group.push_back(layout.workers[static_cast<size_t>(m)].ranks[static_cast<size_t>(vw.stages[k].rank)].front());
      }
      int order = 0;
      for (const AxisRules& axis : axis_table()) {  // the in-pass axes' (axis_registry.hpp)
        if (axis.pass_calls == nullptr) continue;
        const bool in_rank = axis.scope == AxisScope::in_rank && tp;
        const bool experts = axis.scope == AxisScope::in_expert_group && group.size() > 1;
        if (!in_rank && !experts && !(axis.scope == AxisScope::in_context_group && peers.size() > 1)) continue;
        for (const PassCallGroup& g : group_calls(axis.pass_calls(network, pass))) {
          const auto n = static_cast<int>(g.points.size());
          CollectiveSpec call = ring_of(g.kind, in_rank ? devices : experts ? group : peers, g.elems * bytes_per_elem * n, n);
          if (experts) {
            call.algorithm = layout.experts.dispatch;
            call.parts = memo.dispatch().parts;
          }
          std::vector<double> overlap;
          for (size_t m = 0; m < g.until.size(); ++m) overlap.push_back(g.until[m] - g.points[m]);
          comm.collective(w, k, after, order++, std::move(call), std::move(overlap));
        }
      }
    }
    if (!tp) continue;
    // Once a step, in the chunk's last backward; in every one where ZeRO scatters each pass's
    // gradients (Builder::add_compute), in phases of their own after the pass's calls'.
    int order = 1 << 16;
    const auto slot = builder::zero_scatters_each_pass(layout) ? PipelineComm::kBackwardAfter : PipelineComm::kLastBackwardAfter;
    for (const AxisRules& axis : axis_table()) {
      if (axis.scope != AxisScope::in_rank || axis.step_elems == nullptr) continue;
      const double gains = axis.step_elems(network, vw.stages[k].layer_begin, vw.stages[k].layer_end,
                                           static_cast<int>(devices.size()), layout.sequence_parallel);
      comm.collective(w, k, slot, order++,
                      ring_of(CollectiveKind::all_reduce, devices, gains * model::element_bytes(layout.precision)));
    }
  }
  for (size_t k = 0; k + 1 < count; ++k) {
    boundary(comm, w, k, PipelineComm::kToNext, *chunks[k].devices, *chunks[k + 1].devices, work[k].output_bytes);
    boundary(comm, w, k + 1, PipelineComm::kToPrevious, *chunks[k + 1].devices, *chunks[k].devices,
             work[k + 1].input_bytes);
  }
  return chunks;
}

}  // namespace hetflow::partition::estimate_detail
