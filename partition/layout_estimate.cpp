// How estimate_layout follows the builder (partition/plan_builder_*.cpp), and where it does not:
//  - An operation (F, B or W of one chunk and micro-batch) takes its rank's slowest device's
//    compute plus the tensor-parallel collectives around it, back to back: the input
//    all-gather of a boundary that came in 1/t slices, the sequence-parallel all-gather, and
//    the all-reduce or reduce-scatter of the partial sums. In the plan each device's compute
//    starts when its own inputs are there; here the rank moves as one.
//  - A boundary transfer leaves when its operation ends and queues behind the earlier ones on
//    its channel (one per rank pair and direction, as the plan's channel streams); tensor
//    ranks send in parallel, the slowest counted.
//  - Data-parallel pieces run their buckets back to back once every member is ready, in the
//    builder's global order (data_parallel_segments), then tied embeddings and the optimizer.
//  - Parameter servers: pushes after each device's last operation, queued per device and
//    server, one update per server once all its pushes are in, pulls queued per server and
//    device. Under WSP a chunk's first forward computes once its pulls of D + 1 iterations
//    back are in (its input gathers need not wait for them), as the plan's offset edges say.
#include "partition/layout_estimate.hpp"

#include <algorithm>
#include <limits>
#include <map>

#include "model/error.hpp"
#include "partition/collective.hpp"
#include "partition/layout_estimate_memo.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {
namespace {

using estimate_detail::WorkMemo;

constexpr double kNotYet = -1;

double collective_s(const CostModel& cost, CollectiveKind kind, CollectiveAlgorithm algorithm,
                    const std::vector<int>& devices, double bytes, int messages = 1) {
  if (devices.size() < 2 || bytes <= 0) return 0;
  CollectiveSpec spec;
  spec.kind = kind;
  spec.algorithm = algorithm;
  spec.devices = devices;
  spec.bytes = bytes;
  spec.messages = messages;
  return cost.collective_time_s(spec);
}

// One chunk of one virtual worker, per micro-batch.
struct Chunk {
  const std::vector<int>* devices = nullptr;  // its rank's
  int rank = 0;
  double f_s = 0, b_s = 0, w_s = 0;           // each operation, collectives included
  std::vector<double> f_compute_s, b_compute_s, w_compute_s;  // per tensor rank: compute alone
  double f_before_s = 0, b_before_s = 0;      // collectives before each pass's compute (gathers)
  double f_after_s = 0, b_after_s = 0;        // and after it (the partial sums' reduction)
  double to_next_s = 0;                       // its output to the next chunk
  double to_previous_s = 0;                   // its input gradient to the previous chunk
};

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

double largest(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// The slowest tensor rank's transfer of `whole` bytes from chunk `from` to chunk `to`:
// receiving rank j gets 1/t_to of it from sending rank j % t_from (none on one device).
double boundary_s(const CostModel& cost, const std::vector<int>& from, const std::vector<int>& to, double whole) {
  double slowest = 0;
  const double bytes = whole / static_cast<double>(to.size());
  if (bytes <= 0) return 0;
  for (size_t j = 0; j < to.size(); ++j) {
    const int src = from[j % from.size()], dst = to[j];
    if (src != dst) slowest = std::max(slowest, cost.transfer_time_s(src, dst, bytes));
  }
  return slowest;
}

std::vector<Chunk> chunks_of(const model::Network& network, const Layout& layout, const CostModel& cost, int w,
                             bool splits_backward, WorkMemo& memo) {
  const VirtualWorker& vw = layout.workers[static_cast<size_t>(w)];
  const size_t count = vw.stages.size();
  std::vector<Chunk> chunks(count);
  std::vector<builder::ChunkWork> work(count);
  std::vector<bool> sharded(count);
  for (size_t k = 0; k < count; ++k) {
    const Stage& s = vw.stages[k];
    chunks[k].rank = s.rank;
    chunks[k].devices = &vw.ranks.at(static_cast<size_t>(s.rank));
    work[k] = memo.of(s, vw.tensor_of(k)).work;
    sharded[k] = layout.sequence_parallel && builder::tp_collectives(work[k], vw.tensor_of(k));
  }
  for (size_t k = 0; k < count; ++k) {
    Chunk& c = chunks[k];
    const builder::ChunkWork& wk = work[k];
    const std::vector<int>& devices = *c.devices;
    const bool tp = builder::tp_collectives(wk, static_cast<int>(devices.size()));
    Task task;
    task.worker = w;
    task.stage = static_cast<int>(k);
    task.layer_begin = vw.stages[k].layer_begin;
    task.layer_end = vw.stages[k].layer_end;
    task.memory_bytes = wk.weight_bytes + wk.stash_bytes;
    task.kind = TaskKind::forward;
    task.flops = wk.forward_flops;
    c.f_compute_s = per_device(network, layout, cost, task, devices);
    task.kind = TaskKind::backward;
    task.flops = (splits_backward ? wk.backward_flops / 2 : wk.backward_flops) + wk.recompute_flops;
    task.recompute_flops = wk.recompute_flops;
    c.b_compute_s = per_device(network, layout, cost, task, devices);
    if (splits_backward) {
      task.kind = TaskKind::backward_weight;
      task.flops = wk.backward_flops / 2;
      task.recompute_flops = 0;
      c.w_compute_s = per_device(network, layout, cost, task, devices);
    }
    // Tensor-parallel collectives (Builder::gather_inputs, reduce_partials, tp_pass).
    const auto ring = CollectiveAlgorithm::ring;
    for (const bool backward : {false, true}) {
      const int neighbour = backward ? static_cast<int>(k) + 1 : static_cast<int>(k) - 1;
      double before = 0, after = 0;
      if (neighbour >= 0 && neighbour < static_cast<int>(count) && devices.size() > 1 && !sharded[k] &&
          devices != *chunks[static_cast<size_t>(neighbour)].devices) {
        before += collective_s(cost, CollectiveKind::all_gather, ring, devices, backward ? wk.output_bytes : wk.input_bytes);
      }
      const builder::TpPass pass = builder::tp_pass(wk, backward, sharded[k], layout.recompute);
      if (sharded[k]) {
        before +=
            collective_s(cost, CollectiveKind::all_gather, ring, devices, pass.gather_bytes, pass.gather_messages);
        after +=
            collective_s(cost, CollectiveKind::reduce_scatter, ring, devices, pass.reduce_bytes, pass.reduce_messages);
      } else if (tp) {
        after += collective_s(cost, CollectiveKind::all_reduce, ring, devices, pass.reduce_bytes, pass.reduce_messages);
      }
      (backward ? c.b_before_s : c.f_before_s) = before;
      (backward ? c.b_after_s : c.f_after_s) = after;
    }
    c.f_s = c.f_before_s + largest(c.f_compute_s) + c.f_after_s;
    c.b_s = c.b_before_s + largest(c.b_compute_s) + c.b_after_s;
    c.w_s = largest(c.w_compute_s);
  }
  for (size_t k = 0; k + 1 < count; ++k) {
    chunks[k].to_next_s = boundary_s(cost, *chunks[k].devices, *chunks[k + 1].devices, work[k].output_bytes);
    chunks[k + 1].to_previous_s = boundary_s(cost, *chunks[k + 1].devices, *chunks[k].devices, work[k + 1].input_bytes);
  }
  return chunks;
}

// What running one worker's pipeline leaves for the rest of the iteration.
struct WorkerRun {
  std::vector<double> rank_end_s;         // per rank: the end of its last operation
  std::vector<double> channel_free;       // per sending rank and direction: when its channel is free
  std::vector<std::vector<double>> busy;  // per rank and tensor rank: compute and collectives
  double bubble_sum = 0;                  // over its devices: 1 - F/B/W compute / the worker's span
  int bubble_count = 0;
  // Per chunk and tensor rank: the start and length of the compute that completes its
  // gradients (its last B or W in program order), for --overlap-grad-reduce.
  std::vector<std::vector<double>> made_start, made_s;
};

// Where a worker's pipeline starts an iteration from: when each rank's compute stream and
// each channel are free (the last iteration's ends: a plan's streams run their tasks of
// iteration i after those of i - 1), and when each chunk's first forward (of micro-batch 0)
// may start (WSP: the pull of iteration i - D - 1 arrived). Empty: all at 0.
struct PipelineStart {
  std::vector<double> rank_free;
  // Per rank and tensor rank: when each device's stream is free. A rank's devices may free at
  // different times (the data-parallel pieces of ranks of unequal degree run one after
  // another); each device's first compute starts then, and its tensor-parallel collective
  // waits for the others: the bubble counts a device's span from its own first start.
  std::vector<std::vector<double>> device_free;
  std::vector<double> channel_free;
  std::vector<double> first_forward;  // per chunk
};

// The same times for the same pipeline: workers whose chunks cost alike run alike.
bool same_timing(const std::vector<Chunk>& a, const std::vector<Chunk>& b) {
  const auto same = [](const Chunk& x, const Chunk& y) {
    return x.rank == y.rank && x.devices->size() == y.devices->size() && x.f_s == y.f_s && x.b_s == y.b_s &&
           x.w_s == y.w_s && x.f_compute_s == y.f_compute_s && x.b_compute_s == y.b_compute_s &&
           x.w_compute_s == y.w_compute_s && x.f_before_s == y.f_before_s && x.b_before_s == y.b_before_s &&
           x.f_after_s == y.f_after_s && x.b_after_s == y.b_after_s && x.to_next_s == y.to_next_s &&
           x.to_previous_s == y.to_previous_s;
  };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same);
}

WorkerRun run_pipeline(const Layout& layout, const std::vector<Chunk>& chunks, const RankPrograms& programs, int m,
                       const PipelineStart& from) {
  const int p = static_cast<int>(programs.size());
  const size_t count = chunks.size(), mbs = static_cast<size_t>(m);
  std::vector<double> end_f(count * mbs, kNotYet), end_b(count * mbs, kNotYet);
  std::vector<double> input_at(count * mbs, kNotYet), grad_at(count * mbs, kNotYet);
  std::vector<double> channel_free = from.channel_free;  // per sending rank and direction
  std::vector<double> rank_free = from.rank_free;
  channel_free.resize(static_cast<size_t>(p) * 2, 0);
  rank_free.resize(static_cast<size_t>(p), 0);
  WorkerRun run;
  run.busy.resize(static_cast<size_t>(p));
  run.made_start.resize(count);
  run.made_s.resize(count);
  std::vector<std::vector<double>> compute_s(static_cast<size_t>(p));  // the bubble's busy time
  for (int r = 0; r < p; ++r) {
    const size_t t = chunks[static_cast<size_t>(r)].devices->size();
    run.busy[static_cast<size_t>(r)].assign(t, 0);
    compute_s[static_cast<size_t>(r)].assign(t, 0);
  }
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  double span_begin = std::numeric_limits<double>::infinity(), span_end = 0;
  std::vector<bool> started(static_cast<size_t>(p), false);  // per rank: its first operation placed
  size_t left = 0;
  for (const auto& program : programs) left += program.size();
  while (left > 0) {
    bool moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& program = programs[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      for (; i < program.size(); ++i) {
        const ScheduledOp& op = program[i];
        const size_t k = static_cast<size_t>(op.chunk * p + r);
        const size_t at = k * mbs + static_cast<size_t>(op.microbatch);
        if (k >= count) throw PlanError("estimate_layout: the schedule names chunk " + std::to_string(k) + " of " + std::to_string(count));
        double ready = 0, compute_ready = 0;  // the latter: the compute's own wait, after any gathers
        if (op.kind == OpKind::F) {
          ready = k == 0 ? 0 : input_at[at];
          if (op.microbatch == 0 && k < from.first_forward.size()) compute_ready = from.first_forward[k];
        } else if (op.kind == OpKind::B) {
          ready = k + 1 == count ? end_f[at] : grad_at[at];
        } else {
          ready = end_b[at];
        }
        if (ready < 0) break;  // waits for another rank
        const Chunk& c = chunks[k];
        const double start = std::max(rank_free[static_cast<size_t>(r)], ready);
        const auto& compute = op.kind == OpKind::F ? c.f_compute_s : op.kind == OpKind::B ? c.b_compute_s : c.w_compute_s;
        const double before = op.kind == OpKind::F ? c.f_before_s : op.kind == OpKind::B ? c.b_before_s : 0;
        const double after = op.kind == OpKind::F ? c.f_after_s : op.kind == OpKind::B ? c.b_after_s : 0;
        // The gathers run as soon as the input is there; the compute waits for its weights too.
        const double compute_start = std::max(start + before, compute_ready);
        const double end = compute_start + largest(compute) + after;
        rank_free[static_cast<size_t>(r)] = end;
        span_begin = std::min(span_begin, compute_start);
        if (!started[static_cast<size_t>(r)] && before == 0 && static_cast<size_t>(r) < from.device_free.size()) {
          for (const double free : from.device_free[static_cast<size_t>(r)]) {
            span_begin = std::min(span_begin, std::max({free, ready, compute_ready}));
          }
        }
        started[static_cast<size_t>(r)] = true;
        for (size_t j = 0; j < c.devices->size(); ++j) {
          run.busy[static_cast<size_t>(r)][j] += before + compute[j] + after;
          compute_s[static_cast<size_t>(r)][j] += compute[j];
          span_end = std::max(span_end, compute_start + compute[j]);
        }
        const auto send = [&](int dir, double transfer_s, size_t to, std::vector<double>& arrived) {
          double& free = channel_free[static_cast<size_t>(r) * 2 + static_cast<size_t>(dir)];
          if (transfer_s <= 0) {
            arrived[to] = end;
            return;
          }
          free = std::max(free, end) + transfer_s;
          arrived[to] = free;
        };
        if (op.kind == OpKind::F) {
          end_f[at] = end;
          if (k + 1 < count) send(0, c.to_next_s, at + mbs, input_at);
        } else if (op.kind == OpKind::B) {
          end_b[at] = end;
          if (k > 0) send(1, c.to_previous_s, at - mbs, grad_at);
        }
        if (op.kind != OpKind::F) {  // the chunk's gradients so far: the last one completes them
          run.made_start[k].assign(c.devices->size(), compute_start);
          run.made_s[k] = compute;
        }
        --left;
        moved = true;
      }
    }
    if (!moved) throw PlanError("estimate_layout: the schedule " + layout.schedule + " deadlocks");
  }
  run.rank_end_s = rank_free;
  run.channel_free = std::move(channel_free);
  const double span = span_end - span_begin;
  for (const auto& rank : compute_s) {
    for (const double busy : rank) {
      if (span <= 0) break;
      run.bubble_sum += 1 - busy / span;
      ++run.bubble_count;
    }
  }
  return run;
}

// The most activation bytes one rank holds at once: a micro-batch's stash of chunk c lives
// from its F to its B (its W when backward is split), as the plan's stash tensors do, and a
// backward under full recomputation adds its scratch (one layer rebuilt) while it runs.
double activation_peak_bytes(const std::vector<ScheduledOp>& program, const std::vector<double>& stash_bytes,
                             double scratch_bytes, bool splits_backward) {
  double held = 0, peak = 0;
  for (const ScheduledOp& op : program) {
    const double bytes = stash_bytes[static_cast<size_t>(op.chunk)];
    if (op.kind == OpKind::F) {
      held += bytes;
      peak = std::max(peak, held);
      continue;
    }
    if (op.kind == OpKind::B) peak = std::max(peak, held + scratch_bytes);
    if ((op.kind == OpKind::B) != splits_backward) held -= bytes;
  }
  return peak;
}

double optimizer_s(const CostModel& cost, const Layout& layout, int device, double params) {
  return cost.compute_time_s(device, TaskKind::optimizer, builder::kAdamFlopsPerParam * params,
                            builder::adam_bytes_per_param(layout.kernels) * params);
}

}  // namespace

LayoutEstimate estimate_layout(const model::Network& network, const Layout& layout, const CostModel& cost) {
  const Schedule& schedule = schedule_by_name(layout.schedule);
  const auto devices = static_cast<size_t>(cost.device_count());
  const int iterations = std::max(1, layout.iterations);
  LayoutEstimate out;
  out.busy_s.assign(devices, 0);
  std::vector<double> params(devices, 0);
  std::vector<DeviceMemory> memory(devices);
  std::vector<bool> computes(devices, false);
  const bool allreduce = layout.sync.kind == SyncKind::allreduce;
  WorkMemo memo(network, layout);
  std::map<std::tuple<int, int, int>, RankPrograms> programs_of;  // (p, m, v)
  struct Worker {
    const RankPrograms* programs = nullptr;
    std::vector<Chunk> chunks;
    int same_as = -1;  // an earlier worker whose pipeline costs alike (it runs alike from the same start)
  };
  std::vector<Worker> workers(layout.workers.size());
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    const VirtualWorker& vw = layout.workers[w];
    const int p = static_cast<int>(vw.ranks.size());
    if (p == 0 || vw.stages.size() % static_cast<size_t>(p) != 0) {
      throw InputError(kOptions, 0, "stages", "worker " + std::to_string(w) + ": the chunks do not divide over its ranks");
    }
    const int v = static_cast<int>(vw.stages.size()) / p;
    check_schedule_sizes(layout.schedule, p, vw.microbatches, v, schedule.interleaved, schedule.min_chunks);
    auto programs_at = programs_of.find({p, vw.microbatches, v});
    if (programs_at == programs_of.end()) {
      programs_at = programs_of.emplace(std::make_tuple(p, vw.microbatches, v), schedule.build(p, vw.microbatches, v)).first;
    }
    Worker& worker = workers[w];
    worker.programs = &programs_at->second;
    worker.chunks = chunks_of(network, layout, cost, static_cast<int>(w), schedule.splits_backward, memo);
    for (size_t x = 0; x < w && worker.same_as < 0; ++x) {
      if (workers[x].same_as < 0 && layout.workers[x].microbatches == vw.microbatches &&
          same_timing(workers[x].chunks, worker.chunks)) {
        worker.same_as = static_cast<int>(x);
      }
    }
    const RankPrograms& programs = *worker.programs;
    for (int r = 0; r < p; ++r) {
      const auto& rank = vw.ranks[static_cast<size_t>(r)];
      const int t = static_cast<int>(rank.size());
      std::vector<Stage> held;
      std::vector<double> stash_bytes;
      double largest_layer_bytes = 0;
      std::vector<double> rank_params(static_cast<size_t>(t), 0.0);  // each tensor rank's shard
      for (int c = 0; c < v; ++c) {
        const Stage& s = vw.stages[static_cast<size_t>(c * p + r)];
        const WorkMemo::Entry& e = memo.of(s, t);
        held.push_back(s);
        stash_bytes.push_back(e.work.stash_bytes);
        largest_layer_bytes = std::max(largest_layer_bytes, e.work.largest_layer_bytes);
        for (int j = 0; j < t; ++j) rank_params[static_cast<size_t>(j)] += e.params[static_cast<size_t>(j)];
      }
      // Persistent state from the closed form (no micro-batch in flight), activations at the
      // rank's own peak over its program (the closed form's per-chunk peaks need not coincide).
      // Each tensor rank holds its own shard; most hold as much as the last (the largest).
      DeviceMemory last = device_memory(network, layout, held, {}, allreduce, 0, t);
      last.activations_bytes = activation_peak_bytes(programs[static_cast<size_t>(r)], stash_bytes,
                                                     layout.recompute == Recompute::full ? largest_layer_bytes : 0,
                                                     schedule.splits_backward);
      for (size_t j = 0; j < rank.size(); ++j) {
        const auto dd = static_cast<size_t>(rank[j]);
        computes[dd] = true;
        params[dd] += rank_params[j];
        memory[dd] = last;
        if (rank_params[j] != rank_params.back()) {
          const DeviceMemory own = device_memory(network, layout, held, {}, allreduce, 0, t, static_cast<int>(j));
          memory[dd].weights_bytes = own.weights_bytes;
          memory[dd].gradients_bytes = own.gradients_bytes;
          memory[dd].optimizer_bytes = own.optimizer_bytes;
        }
        memory[dd].capacity_bytes = cost.memory_capacity_bytes(rank[j]);
      }
    }
  }
  const auto device_of = [&](size_t w, int stage, int j) {
    const VirtualWorker& vw = layout.workers[w];
    return vw.ranks[static_cast<size_t>(vw.stages[static_cast<size_t>(stage)].rank)][static_cast<size_t>(j)];
  };
  const double e = model::element_bytes(layout.precision);
  const std::vector<int>& server_of = layout.sync.layer_server;
  if (!allreduce) {
    if (server_of.size() != network.layers.size()) {
      throw InputError("<layout>", 0, "sync.layer_server", "expected one server device per layer");
    }
    for (int s : server_of) {
      if (s < 0 || static_cast<size_t>(s) >= devices) {
        throw InputError("<layout>", 0, "sync.layer_server", "server device " + std::to_string(s) + " does not exist");
      }
    }
  }

  // Iteration after iteration, each stream and channel carrying on from where the last left it.
  std::vector<double> stream_free(devices, 0);  // the compute stream
  std::vector<double> comm_free(devices, 0);    // all-reduce: the comm stream
  std::vector<std::vector<double>> channels(layout.workers.size());  // per worker: its pipeline channels
  // Parameter servers: per device, (peer, when that channel is free); per server, its update stream.
  std::vector<std::vector<std::pair<int, double>>> push_free(devices), pull_free(devices);
  std::map<int, double> update_free;
  std::map<int, double> pulls_sent;  // per server: when its pulls of the last iteration were sent
  // WSP: per iteration, when each (worker, chunk, tensor rank) has all its pulls.
  std::vector<std::map<std::tuple<int, int, int>, double>> pulled(static_cast<size_t>(iterations));
  const int staleness = layout.sync.kind == SyncKind::wsp ? layout.sync.staleness : 0;
  std::vector<double> iteration_end(static_cast<size_t>(iterations), 0);
  double bubble_sum = 0;
  int bubble_count = 0;
  // Each virtual worker's gradient-norm all-reduce (Builder::add_optimizers): its computing
  // devices and the collective's time, the same every iteration.
  std::vector<std::pair<std::vector<int>, double>> norms;
  for (const VirtualWorker& vw : layout.workers) {
    if (!builder::clips_gradient_norm(network, layout)) break;
    std::vector<int> members;
    for (const auto& rank : vw.ranks) {
      for (const int d : rank) {
        if (computes[static_cast<size_t>(d)]) members.push_back(d);
      }
    }
    if (members.size() < 2) continue;
    const double norm_s = collective_s(cost, CollectiveKind::all_reduce, CollectiveAlgorithm::tree, members, 4);
    norms.emplace_back(std::move(members), norm_s);
  }
  for (int it = 0; it < iterations; ++it) {
    double& makespan = iteration_end[static_cast<size_t>(it)];
    std::vector<double> last_end(devices, 0);
    std::vector<WorkerRun> runs(layout.workers.size());
    for (size_t w = 0; w < layout.workers.size(); ++w) {
      const VirtualWorker& vw = layout.workers[w];
      const Worker& worker = workers[w];
      const int p = static_cast<int>(vw.ranks.size());
      PipelineStart from;
      if (it > 0) {
        from.channel_free = channels[w];
        for (const auto& rank : vw.ranks) {
          double free = 0;
          std::vector<double>& each = from.device_free.emplace_back();
          for (const int d : rank) {
            free = std::max(free, stream_free[static_cast<size_t>(d)]);
            each.push_back(stream_free[static_cast<size_t>(d)]);
          }
          from.rank_free.push_back(free);
        }
        const int source = it - staleness - 1;  // the iteration whose pulls the first forwards wait for
        if (!allreduce && source >= 0) {
          from.first_forward.assign(vw.stages.size(), 0);
          for (size_t k = 0; k < vw.stages.size(); ++k) {
            for (int j = 0; j < vw.tensor_of(k); ++j) {
              const auto at = pulled[static_cast<size_t>(source)].find({static_cast<int>(w), static_cast<int>(k), j});
              if (at != pulled[static_cast<size_t>(source)].end()) from.first_forward[k] = std::max(from.first_forward[k], at->second);
            }
          }
        }
      }
      // From the same start (every stream free at 0: the first iteration), alike workers run alike.
      runs[w] = it == 0 && worker.same_as >= 0 ? runs[static_cast<size_t>(worker.same_as)]
                                               : run_pipeline(layout, worker.chunks, *worker.programs, vw.microbatches, from);
      const WorkerRun& run = runs[w];
      channels[w] = run.channel_free;
      bubble_sum += run.bubble_sum;
      bubble_count += run.bubble_count;
      for (int r = 0; r < p; ++r) {
        const auto& rank = vw.ranks[static_cast<size_t>(r)];
        for (size_t j = 0; j < rank.size(); ++j) {
          const auto dd = static_cast<size_t>(rank[j]);
          last_end[dd] = run.rank_end_s[static_cast<size_t>(r)];
          stream_free[dd] = last_end[dd];
          out.busy_s[dd] += run.busy[static_cast<size_t>(r)][j];
        }
      }
    }
    if (allreduce) {
      const auto run_collective = [&](const std::vector<int>& members, double duration_s) {
        double start = 0;
        for (int d : members) start = std::max({start, comm_free[static_cast<size_t>(d)], last_end[static_cast<size_t>(d)]});
        for (int d : members) comm_free[static_cast<size_t>(d)] = start + duration_s;
      };
      for (const builder::Segment& seg : builder::data_parallel_segments(network, layout)) {
        for (const builder::Segment::Piece& piece : seg.pieces) {
          std::vector<int> members;
          for (size_t w = 0; w < layout.workers.size(); ++w) {
            members.push_back(device_of(w, seg.stage_of_worker[w], piece.rank_of_worker[w]));
          }
          const double bucket_s = collective_s(cost, CollectiveKind::all_reduce, layout.sync.algorithm, members,
                                               piece.bytes / piece.buckets);
          if (!layout.sync.overlap_grad_reduce) {
            run_collective(members, bucket_s * piece.buckets);
            continue;
          }
          // Builder::add_allreduce_sync: bucket b waits for the part of each member's last
          // backward that makes its gradients, and for the member's comm stream.
          std::vector<std::vector<double>> ready;
          for (size_t w = 0; w < layout.workers.size(); ++w) {
            const Stage& s = layout.workers[w].stages[static_cast<size_t>(seg.stage_of_worker[w])];
            ready.push_back(builder::bucket_ready_fractions(network, s.layer_begin, s.layer_end, seg.begin, seg.end,
                                                            piece.buckets));
          }
          for (int b = 0; b < piece.buckets; ++b) {
            double start = 0;
            for (size_t w = 0; w < layout.workers.size(); ++w) {
              const auto k = static_cast<size_t>(seg.stage_of_worker[w]);
              const auto j = static_cast<size_t>(piece.rank_of_worker[w]);
              const WorkerRun& run = runs[w];
              const double made = run.made_start[k][j] + ready[w][static_cast<size_t>(b)] * run.made_s[k][j];
              start = std::max({start, made, comm_free[static_cast<size_t>(members[w])]});
            }
            for (int d : members) comm_free[static_cast<size_t>(d)] = start + bucket_s;
          }
        }
      }
      // Tied embeddings between the first and each later chunk (Builder::add_tied_embedding_sync).
      const double grad_bytes_per_param = layout.fp32_grad_accumulation ? 4.0 : e;
      for (size_t w = 0; w < layout.workers.size(); ++w) {
        const VirtualWorker& vw = layout.workers[w];
        for (size_t k = 1; k < vw.stages.size(); ++k) {
          const int t0 = vw.tensor_of(0), tk = vw.tensor_of(k);
          std::vector<int> tied_layers;
          for (int l = vw.stages[k].layer_begin; l < vw.stages[k].layer_end; ++l) {
            if (network.layers[static_cast<size_t>(l)].tied_params > 0) tied_layers.push_back(l);
          }
          if (tied_layers.empty()) continue;
          for (const builder::Share& share : builder::shares({t0, tk})) {
            const int first = device_of(w, 0, share.rank_of[0]);
            const int holder = device_of(w, static_cast<int>(k), share.rank_of[1]);
            if (first == holder) continue;
            double tied = 0;
            for (const int l : tied_layers) tied += tied_part_params(network, l, share.part);
            const double bytes = tied * grad_bytes_per_param;
            run_collective({first, holder}, collective_s(cost, CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                                         {first, holder}, bytes));
          }
        }
      }
      // The optimizer, on the compute stream after the device's gradients and their syncs, and
      // after its worker's gradient-norm all-reduce (Builder::add_optimizers).
      std::vector<double> ready(devices, 0);
      for (size_t d = 0; d < devices; ++d) ready[d] = std::max(last_end[d], comm_free[d]);
      for (const auto& [members, norm_s] : norms) {
        double start = 0;
        for (const int d : members) start = std::max(start, ready[static_cast<size_t>(d)]);
        for (const int d : members) ready[static_cast<size_t>(d)] = start + norm_s;
      }
      for (size_t d = 0; d < devices; ++d) {
        if (!computes[d]) continue;
        const double s = optimizer_s(cost, layout, static_cast<int>(d), params[d]);
        out.busy_s[d] += s;
        stream_free[d] = ready[d] + s;
        makespan = std::max(makespan, stream_free[d]);
      }
    } else {
      // Parameter servers (Builder::add_parameter_server_sync).
      // A channel's queue: per device, (peer, when it is free).
      const auto queue = [](std::vector<std::pair<int, double>>& of_device, int peer) -> double& {
        for (auto& [p, free] : of_device) {
          if (p == peer) return free;
        }
        return of_device.emplace_back(peer, 0.0).second;
      };
      std::map<int, double> pushed;  // server -> when its last push is in
      struct Pull {
        int server, device;
        double bytes;
        std::tuple<int, int, int> chunk;  // (worker, stage, tensor rank) whose weights it brings
      };
      std::vector<Pull> pulls;
      for (size_t w = 0; w < layout.workers.size(); ++w) {
        const VirtualWorker& vw = layout.workers[w];
        for (size_t k = 0; k < vw.stages.size(); ++k) {
          const int t = vw.tensor_of(k);
          for (int j = 0; j < t; ++j) {
            const auto& params_per_server = memo.per_server(vw.stages[k], t, j, server_of);
            const int device = device_of(w, static_cast<int>(k), j);
            const double ready = last_end[static_cast<size_t>(device)];
            for (const auto& [server, n] : params_per_server) {
              if (n <= 0) continue;
              double in = ready;
              if (server != device) {
                double& free = queue(push_free[static_cast<size_t>(device)], server);
                free = std::max(free, ready) + cost.transfer_time_s(device, server, n * e);
                in = free;
              }
              pushed[server] = std::max(pushed[server], in);
              pulls.push_back({server, device, n * e, {static_cast<int>(w), static_cast<int>(k), j}});
            }
          }
        }
      }
      std::map<int, double> updated;  // server -> end of its update
      for (const auto& [server, in] : pushed) {
        double n = 0;
        for (size_t l = 0; l < server_of.size(); ++l) {
          if (server_of[l] == server) n += params_per_device(network, static_cast<int>(l), static_cast<int>(l) + 1, 1);
        }
        const double s = optimizer_s(cost, layout, server, n);
        out.busy_s[static_cast<size_t>(server)] += s;
        double& free = update_free[server];  // its own stream: after its last update
        // ... and after the last iteration's pulls left (Builder: the weights are not
        // overwritten while they are sent).
        free = std::max({free, in, pulls_sent[server]}) + s;
        updated[server] = free;
        if (it > 0) continue;
        memory[static_cast<size_t>(server)].optimizer_bytes += n * model::adam_state_bytes(layout.precision);
        if (!computes[static_cast<size_t>(server)]) {  // a server alone: its state and the workspace
          memory[static_cast<size_t>(server)].capacity_bytes = cost.memory_capacity_bytes(server);
          memory[static_cast<size_t>(server)].workspace_bytes = layout.workspace_bytes;
          computes[static_cast<size_t>(server)] = true;
        }
      }
      for (const Pull& pull : pulls) {
        double in = updated.at(pull.server);
        if (pull.server != pull.device) {
          double& free = queue(pull_free[static_cast<size_t>(pull.device)], pull.server);
          free = std::max(free, in) + cost.transfer_time_s(pull.server, pull.device, pull.bytes);
          in = free;
          pulls_sent[pull.server] = std::max(pulls_sent[pull.server], in);
        }
        double& arrived = pulled[static_cast<size_t>(it)][pull.chunk];
        arrived = std::max(arrived, in);
        makespan = std::max(makespan, in);
      }
      for (size_t d = 0; d < devices; ++d) makespan = std::max(makespan, last_end[d]);
    }
  }
  // The plan's estimate over several iterations: the steady state between the first and the last.
  out.iteration_time_s = iterations > 1 ? (iteration_end.back() - iteration_end.front()) / (iterations - 1) : iteration_end.front();
  for (double& busy : out.busy_s) busy /= iterations;
  out.bubble_fraction = bubble_count > 0 ? bubble_sum / bubble_count : 0;
  out.headroom_bytes = std::numeric_limits<double>::infinity();
  for (size_t d = 0; d < devices; ++d) {
    if (computes[d] && memory[d].capacity_bytes > 0 && memory[d].capacity_bytes - memory[d].total_bytes() < out.headroom_bytes) {
      out.headroom_bytes = memory[d].capacity_bytes - memory[d].total_bytes();
      out.tightest_device = static_cast<int>(d);
    }
  }
  out.slowest_device = static_cast<int>(std::max_element(out.busy_s.begin(), out.busy_s.end()) - out.busy_s.begin());
  return out;
}

}  // namespace hetflow::partition
