// How estimate_layout follows the builder (partition/plan_builder_*.cpp), and where it does not:
//  - An operation (F, B or W of one chunk and micro-batch) takes its rank's slowest device's
//    compute plus its in-pass collectives, back to back: the input all-gather of a boundary
//    that came in 1/t slices, sequence parallelism's, the partial sums' all-reduce or
//    reduce-scatter, a context group's keys and values. In the plan each device's compute
//    starts when its own inputs are there; here the rank moves as one.
//  - A boundary transfer leaves when its operation ends and queues behind the earlier ones on
//    its channel (one per rank pair and direction, as the plan's channel streams); tensor
//    ranks send in parallel, the slowest counted.
//  - Data-parallel pieces run their buckets back to back once every member is ready, in the
//    builder's global order (data_parallel_segments), then tied embeddings and the optimizer;
//    ZeRO's collectives as the builder orders them on its streams (layout_estimate_zero.hpp).
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
#include "partition/layout_estimate_detail.hpp"
#include "partition/layout_estimate_zero.hpp"
#include "partition/loading.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {
namespace {

using namespace estimate_detail;

// `norm_bytes`: the gradient norm's read where no all-reduce task carries it (Builder::add_optimizers).
double optimizer_s(const CostModel& cost, const Layout& layout, int device, double params, double norm_bytes = 0) {
  return cost.compute_time_s(device, TaskKind::optimizer, builder::kAdamFlopsPerParam * params,
                             builder::adam_bytes_per_param(layout.kernels) * params + norm_bytes);
}

// estimate_layout's state and its phases, in the order they run.
class Estimator {
 public:
  Estimator(const model::Network& network, const Layout& layout, const CostModel& cost, const LayoutEstimateOptions& options)
      : network_(network),
        layout_(layout),
        cost_(cost),
        options_(options),
        schedule_(schedule_by_name(layout.schedule)),
        devices_(static_cast<size_t>(cost.device_count())),
        iterations_(std::max(1, layout.iterations)),
        allreduce_(layout.sync.kind == SyncKind::allreduce),
        memo_(network, layout),
        zero_(network, layout, cost, memo_, options.shared_links) {}

  LayoutEstimate run() {
    out_.busy_s.assign(devices_, 0);
    params_.assign(devices_, 0);
    memory_.resize(devices_);
    in_copies_.assign(devices_, 0);
    offloaded_activations_.assign(devices_, 0);
    computes_.assign(devices_, false);
    make_workers();
    // (All its memory is known by now; offloaded stashes are screened with their copies, as
    // the search screens them.)
    if (options_.time_only_what_fits && allreduce_ &&
        (headroom() < 0 || out_.headroom_with_copies_bytes < 0 || out_.host_headroom_bytes < 0)) {
      out_.iteration_time_s = std::numeric_limits<double>::infinity();
      return std::move(out_);
    }
    check_servers();
    gradient_norms();
    if (allreduce_) {
      data_parallel_times();
    } else {
      server_times();
    }
    stream_free_.assign(devices_, 0);
    comm_free_.assign(devices_, 0);
    to_host_free_.assign(devices_, 0);
    to_device_free_.assign(devices_, 0);
    channels_.resize(layout_.workers.size());
    push_free_.resize(devices_);
    pull_free_.resize(devices_);
    pulled_.resize(static_cast<size_t>(iterations_));
    iteration_end_.assign(static_cast<size_t>(iterations_), 0);
    // Iteration after iteration, each stream and channel carrying on from where the last left it.
    for (int it = 0; it < iterations_; ++it) {
      std::vector<double> last_end(devices_, 0);
      const std::vector<WorkerRun> runs = run_pipelines(it, last_end);
      if (allreduce_) {
        zero_.reduce_scatter(runs, *workers_.front().programs, comm_free_);
        // ZeRO 1 adds the tied copies whole before scattering the buckets (Builder::add_allreduce_sync).
        if (zero_.stage() == 1) sync_tied_embeddings(last_end);
        sync_data_parallel(runs, last_end);
        if (zero_.stage() != 1) sync_tied_embeddings(last_end);
        run_optimizers(it, last_end);
        zero_.gather_after_optimizers(stream_free_, comm_free_, iteration_end_[static_cast<size_t>(it)]);
      } else {
        sync_servers(it, last_end);
      }
    }
    return finish();
  }

 private:
  struct Worker {
    const RankPrograms* programs = nullptr;
    std::vector<Chunk> chunks;
    int same_as = -1;  // an earlier worker whose pipeline costs alike (it runs alike from the same start)
  };

  int device_of(size_t w, int stage, int j) const {
    const VirtualWorker& vw = layout_.workers[w];
    return vw.ranks[static_cast<size_t>(vw.stages[static_cast<size_t>(stage)].rank)][static_cast<size_t>(j)];
  }

  // Each worker's programs and chunks, their communication costed together, and each rank's memory.
  void make_workers() {
    workers_.resize(layout_.workers.size());
    PipelineComm comm(cost_, options_.shared_links);
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      const int p = static_cast<int>(vw.ranks.size());
      if (p == 0 || vw.stages.size() % static_cast<size_t>(p) != 0) {
        throw InputError(kOptions, 0, "stages", "worker " + std::to_string(w) + ": the chunks do not divide over its ranks");
      }
      const int v = static_cast<int>(vw.stages.size()) / p;
      check_schedule_sizes(layout_.schedule, p, vw.microbatches, v, schedule_.interleaved, schedule_.min_chunks);
      auto programs_at = programs_of_.find({p, vw.microbatches, v});
      if (programs_at == programs_of_.end()) {
        programs_at = programs_of_.emplace(std::make_tuple(p, vw.microbatches, v), schedule_.build(p, vw.microbatches, v)).first;
      }
      workers_[w].programs = &programs_at->second;
      workers_[w].chunks = chunks_of(network_, layout_, cost_, static_cast<int>(w), schedule_.splits_backward, memo_, comm);
      for (int r = 0; r < p; ++r) rank_memory(w, r, v);
    }
    std::vector<std::vector<Chunk>*> chunks;
    for (Worker& worker : workers_) chunks.push_back(&worker.chunks);
    comm.resolve(chunks);
    for (size_t w = 0; w < workers_.size(); ++w) {
      Worker& worker = workers_[w];
      for (size_t x = 0; x < w && worker.same_as < 0; ++x) {
        if (workers_[x].same_as < 0 && layout_.workers[x].microbatches == layout_.workers[w].microbatches &&
            same_timing(workers_[x].chunks, worker.chunks)) {
          worker.same_as = static_cast<int>(x);
        }
      }
    }
  }

  // Rank r of worker w: persistent state from the closed form (no micro-batch in flight),
  // activations at the rank's own peak over its program (the closed form's per-chunk peaks
  // need not coincide). Each tensor rank holds its own shard; most hold as much as the last
  // (the largest).
  void rank_memory(size_t w, int r, int v) {
    const VirtualWorker& vw = layout_.workers[w];
    const int p = static_cast<int>(vw.ranks.size());
    const auto& rank = vw.ranks[static_cast<size_t>(r)];
    const int t = static_cast<int>(rank.size());
    std::vector<Stage> held;
    std::vector<double> stash_bytes;
    double scratch = 0;  // a backward's workspace: full recomputation's layer, a context group's keys and values
    std::vector<double> rank_params(static_cast<size_t>(t), 0.0);  // each tensor rank's shard
    std::vector<double> stepped(static_cast<size_t>(t), 0.0);      // ... of which its optimizer steps (ZeRO: its own)
    for (int c = 0; c < v; ++c) {
      const Stage& s = vw.stages[static_cast<size_t>(c * p + r)];
      const WorkMemo::Entry& e = memo_.of(s, t, static_cast<int>(w));
      held.push_back(s);
      stash_bytes.push_back(e.work.stash_bytes);
      scratch = std::max(scratch, (layout_.recompute == Recompute::full ? e.work.largest_layer_bytes : 0) +
                                      2 * e.work.context_bytes);
      for (int j = 0; j < t; ++j) {
        rank_params[static_cast<size_t>(j)] += e.params[static_cast<size_t>(j)];
        stepped[static_cast<size_t>(j)] += zero_.optimizer_params(s, e, static_cast<size_t>(j), static_cast<int>(w));
      }
    }
    DeviceMemory last = device_memory(network_, layout_, held, {}, allreduce_, 0, t);
    const bool offloaded = layout_.offload.activations;
    const RankStashes stashes = rank_stashes((*workers_[w].programs)[static_cast<size_t>(r)], stash_bytes, scratch,
                                             schedule_.splits_backward, offloaded);
    last.activations_bytes = stashes.device;
    for (size_t j = 0; j < rank.size(); ++j) {
      const auto dd = static_cast<size_t>(rank[j]);
      // The screens add ZeRO's whole copies (left out of the offloaded bound, below), closed form.
      in_copies_[dd] = offloaded ? stashes.in_copies + last.gathered_bytes : 0;
      offloaded_activations_[dd] = offloaded ? 0 : stashes.if_offloaded + last.gathered_bytes;
      computes_[dd] = true;
      params_[dd] += stepped[j];
      memory_[dd] = last;
      if (rank_params[j] != rank_params.back()) {
        const DeviceMemory own = device_memory(network_, layout_, held, {}, allreduce_, 0, t, static_cast<int>(j));
        memory_[dd].weights_bytes = own.weights_bytes;
        memory_[dd].gradients_bytes = own.gradients_bytes;
        memory_[dd].optimizer_bytes = own.optimizer_bytes;
        memory_[dd].host_bytes = own.host_bytes;
      }
      hold_own_experts(layout_, rank_params[j], memory_[dd]);
      // (Offloaded, the stashes at ZeRO's gathered peak are not known: its gathered copies are left out.)
      zero_.sharded_memory(memo_, static_cast<int>(w), held, t, static_cast<int>(j),
                           {offloaded ? nullptr : &(*workers_[w].programs)[static_cast<size_t>(r)], &stash_bytes,
                            scratch, schedule_.splits_backward},
                           memory_[dd]);
      memory_[dd].capacity_bytes = cost_.memory_capacity_bytes(rank[j]);
      memory_[dd].host_bytes += stashes.host;
    }
  }

  void check_servers() const {
    if (allreduce_) return;
    const std::vector<int>& server_of = layout_.sync.layer_server;
    if (server_of.size() != network_.layers.size()) {
      throw InputError("<layout>", 0, "sync.layer_server", "expected one server device per layer");
    }
    for (int s : server_of) {
      if (s < 0 || static_cast<size_t>(s) >= devices_) {
        throw InputError("<layout>", 0, "sync.layer_server", "server device " + std::to_string(s) + " does not exist");
      }
    }
  }

  // Each virtual worker's gradient-norm all-reduce (Builder::add_optimizers): its computing
  // devices and the collective's time, the same every iteration (4 bytes: latency alone),
  // after the slowest member's read of the gradients its optimizer steps (estimate_plan's
  // unit of a collective). A device in none reads them in its optimizer step (norm_bytes_).
  void gradient_norms() {
    norm_bytes_.assign(devices_, 0);
    if (!builder::clips_gradient_norm(network_, layout_)) return;
    const double gradient_bytes = layout_.gradient_element_bytes();
    for (size_t d = 0; d < devices_; ++d) norm_bytes_[d] = computes_[d] ? params_[d] * gradient_bytes : 0;
    for (const std::vector<int>& workers : builder::gradient_norm_workers(layout_, zero_.stage(), layout_.workers.size())) {
      std::vector<int> members;
      for (const int v : workers) {
        for (const auto& rank : layout_.workers[static_cast<size_t>(v)].ranks) {
          for (const int d : rank) {
            if (computes_[static_cast<size_t>(d)]) members.push_back(d);
          }
        }
      }
      if (members.size() < 2) continue;
      double read_s = 0;
      for (const int d : members) {
        read_s = std::max(read_s, cost_.memory_op_time_s(d, norm_bytes_[static_cast<size_t>(d)]));
        norm_bytes_[static_cast<size_t>(d)] = 0;  // (its all-reduce task carries it)
      }
      const CollectiveSpec norm{.algorithm = CollectiveAlgorithm::tree, .devices = members, .bytes = 4};
      norms_.emplace_back(std::move(members), read_s + cost_.collective_time_s(norm));
    }
  }

  // The data-parallel pieces and each one's bucket time. The pieces of one segment (one layer
  // range: every tensor rank's piece, each a ring over the replicas) become ready together
  // and run at once, sharing links, but for those that meet on a device, which run one after
  // another on its comm stream (workers of unequal tensor degrees: a device in several
  // pieces); segments of other pipeline ranks finish their backward at other times.
  void data_parallel_times() {
    // From ZeRO stage 2 every pass's gradients are reduce-scattered instead (ZeroSync).
    if (zero_.stage() >= 2) return;
    segments_ = builder::data_parallel_segments(network_, layout_);
    std::vector<std::pair<std::pair<int, int>, CollectiveSpec>> pieces;  // ((segment, wave), one bucket)
    for (size_t s = 0; s < segments_.size(); ++s) {
      const builder::Segment& seg = segments_[s];
      Waves waves;
      for (const builder::Segment::Piece& piece : seg.pieces) {
        CollectiveSpec c;
        c.algorithm = layout_.sync.algorithm;
        if (zero_.stage() >= 1) {  // each replica keeps its shard's sum
          c.kind = CollectiveKind::reduce_scatter;
          c.algorithm = builder::zero_algorithm(layout_);
        }
        std::vector<long long> queues;
        for (const auto w : builder::piece_workers(piece, layout_.workers.size())) {
          c.devices.push_back(device_of(w, seg.stage_of_worker[w], piece.rank_of_worker[w]));
          queues.push_back(c.devices.back());
        }
        if (zero_.stage() >= 1) c.parts = builder::zero_parts(layout_, cost_.cluster(), c.devices);
        c.bytes = piece.bytes / piece.buckets;
        pieces.emplace_back(std::pair{static_cast<int>(s), waves.next(queues)}, std::move(c));
      }
    }
    bucket_s_ = shared_times(pieces);
  }

  // Each item's time in its phase.
  std::vector<double> shared_times(const std::vector<std::pair<std::pair<int, int>, CollectiveSpec>>& items) const {
    std::map<std::pair<int, int>, std::pair<SharedPhase, std::vector<size_t>>> phases;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [phase, c] = items[i];
      const auto key = options_.shared_links ? phase : std::pair{-1, static_cast<int>(i)};
      auto at = phases.try_emplace(key, SharedPhase(cost_, options_.shared_links), std::vector<size_t>{}).first;
      if (c.devices.size() < 2 || c.bytes <= 0) continue;
      at->second.first.add(c);
      at->second.second.push_back(i);
    }
    std::vector<double> out(items.size(), 0);
    for (const auto& [key, phase] : phases) {
      const std::vector<double> times = phase.first.times_s();
      for (size_t k = 0; k < times.size(); ++k) out[phase.second[k]] = times[k];
    }
    return out;
  }

  // Parameter servers: each push and pull as a transfer, in the order sync_servers takes them.
  // The pushes of one chunk of every replica (its tensor ranks' too) leave together, as the
  // replicas' pipelines end together, and share links; so do one server's pulls, which all
  // leave when its update ends. Either at the same place in their channels' queues.
  void server_times() {
    const double e = model::element_bytes(layout_.precision);
    std::map<std::pair<int, int>, std::pair<SharedPhase, std::vector<size_t>>> push_phases, pull_phases;
    Waves push_waves, pull_waves;
    size_t at = 0;
    for_each_push([&](size_t k, int device, int server, double n) {
      push_s_.push_back(0);
      pull_s_.push_back(0);
      if (server == device) {  // its own: nothing moves
        ++at;
        return;
      }
      const long long channel = static_cast<long long>(device) * static_cast<long long>(devices_) + server;
      const bool shared = options_.shared_links;
      const auto push_key = shared ? std::pair{static_cast<int>(k), push_waves.next({channel})} : std::pair{-1, static_cast<int>(at)};
      const auto pull_key = shared ? std::pair{server, pull_waves.next({channel})} : std::pair{-1, static_cast<int>(at)};
      auto& push = push_phases.try_emplace(push_key, SharedPhase(cost_, shared), std::vector<size_t>{}).first->second;
      push.first.add_transfer(device, server, n * e);
      push.second.push_back(at);
      auto& pull = pull_phases.try_emplace(pull_key, SharedPhase(cost_, shared), std::vector<size_t>{}).first->second;
      pull.first.add_transfer(server, device, n * e);
      pull.second.push_back(at);
      ++at;
    });
    for (auto* phases : {&push_phases, &pull_phases}) {
      std::vector<double>& out = phases == &push_phases ? push_s_ : pull_s_;
      for (const auto& [key, phase] : *phases) {
        const std::vector<double> times = phase.first.times_s();
        for (size_t i = 0; i < times.size(); ++i) out[phase.second[i]] = times[i];
      }
    }
  }

  // Calls f(chunk, device, server, parameters) for each push of a device's parameters to a server,
  // in the builder's order (Builder::add_parameter_server_sync).
  template <class F>
  void for_each_push(F f) {
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      for (size_t k = 0; k < vw.stages.size(); ++k) {
        const int t = vw.tensor_of(k);
        for (int j = 0; j < t; ++j) {
          const int device = device_of(w, static_cast<int>(k), j);
          for (const auto& [server, n] : memo_.per_server(vw.stages[k], t, static_cast<int>(w), j, layout_.sync.layer_server)) {
            if (n > 0) f(k, device, server, n);
          }
        }
      }
    }
  }

  // Every worker's pipeline in iteration `it`, from where the last iteration left its streams.
  std::vector<WorkerRun> run_pipelines(int it, std::vector<double>& last_end) {
    std::vector<WorkerRun> runs(layout_.workers.size());
    const int staleness = layout_.sync.kind == SyncKind::wsp ? layout_.sync.staleness : 0;
    std::vector<PipelineInput> inputs;
    std::vector<size_t> run_now;  // the workers to run; the others run as an earlier one
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      const Worker& worker = workers_[w];
      // From the same start (every stream free at 0: the first iteration), alike workers run alike.
      if (it == 0 && worker.same_as >= 0) continue;
      PipelineStart& from = inputs.emplace_back(PipelineInput{&worker.chunks, worker.programs, vw.microbatches, {}}).from;
      run_now.push_back(w);
      if (it > 0) {
        from.channel_free = channels_[w];
        for (const auto& rank : vw.ranks) {
          double free = 0;
          std::vector<double>& each = from.device_free.emplace_back();
          for (const int d : rank) {
            free = std::max(free, stream_free_[static_cast<size_t>(d)]);
            each.push_back(stream_free_[static_cast<size_t>(d)]);
          }
          from.rank_free.push_back(free);
          if (layout_.offload.activations) {  // (a rank's devices copy alike)
            from.to_host_free.push_back(to_host_free_[static_cast<size_t>(rank.front())]);
            from.to_device_free.push_back(to_device_free_[static_cast<size_t>(rank.front())]);
          }
        }
        const int source = it - staleness - 1;  // the iteration whose pulls the first forwards wait for
        if (!allreduce_ && source >= 0) {
          from.first_forward.assign(vw.stages.size(), 0);
          const auto& arrived = pulled_[static_cast<size_t>(source)];
          for (size_t k = 0; k < vw.stages.size(); ++k) {
            for (int j = 0; j < vw.tensor_of(k); ++j) {
              const auto at = arrived.find({static_cast<int>(w), static_cast<int>(k), j});
              if (at != arrived.end()) from.first_forward[k] = std::max(from.first_forward[k], at->second);
            }
          }
        }
      }
    }
    // ZeRO-3's all-gathers span the replicas: their pipelines run together.
    std::vector<WorkerRun> ran = run_pipelines_of(inputs);
    for (size_t i = 0; i < run_now.size(); ++i) runs[run_now[i]] = std::move(ran[i]);
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      if (it == 0 && workers_[w].same_as >= 0) runs[w] = runs[static_cast<size_t>(workers_[w].same_as)];
      const VirtualWorker& vw = layout_.workers[w];
      const WorkerRun& run = runs[w];
      channels_[w] = run.channel_free;
      bubble_sum_ += run.bubble_sum;
      bubble_count_ += run.bubble_count;
      for (size_t r = 0; r < vw.ranks.size(); ++r) {
        const auto& rank = vw.ranks[r];
        for (size_t j = 0; j < rank.size(); ++j) {
          const auto dd = static_cast<size_t>(rank[j]);
          last_end[dd] = run.rank_end_s[r];
          stream_free_[dd] = last_end[dd];
          out_.busy_s[dd] += run.busy[r][j];
          if (r < run.to_host_free.size()) {
            to_host_free_[dd] = run.to_host_free[r];
            to_device_free_[dd] = run.to_device_free[r];
          }
        }
      }
    }
    return runs;
  }

  std::vector<WorkerRun> run_pipelines_of(const std::vector<PipelineInput>& inputs) const {
    if (zero_.gathers() != nullptr) return estimate_detail::run_pipelines(layout_, inputs, zero_.gathers());
    std::vector<WorkerRun> out;
    for (const PipelineInput& in : inputs) out.push_back(run_pipeline(layout_, *in.chunks, *in.programs, in.microbatches, in.from));
    return out;
  }

  // A collective on the comm streams once its members' compute and earlier syncs are done.
  void run_collective(const std::vector<int>& members, double duration_s, const std::vector<double>& last_end) {
    double start = 0;
    for (int d : members) start = std::max({start, comm_free_[static_cast<size_t>(d)], last_end[static_cast<size_t>(d)]});
    for (int d : members) comm_free_[static_cast<size_t>(d)] = start + duration_s;
  }

  // The data-parallel pieces in the builder's global order (Builder::add_allreduce_sync).
  void sync_data_parallel(const std::vector<WorkerRun>& runs, const std::vector<double>& last_end) {
    size_t at = 0;
    for (const builder::Segment& seg : segments_) {
      for (const builder::Segment::Piece& piece : seg.pieces) {
        std::vector<int> members;
        const std::vector<int> workers = builder::piece_workers(piece, layout_.workers.size());
        for (const auto w : workers) members.push_back(device_of(w, seg.stage_of_worker[w], piece.rank_of_worker[w]));
        const double bucket_s = bucket_s_[at++];
        if (!layout_.sync.overlap_grad_reduce) {
          run_collective(members, bucket_s * piece.buckets, last_end);
          continue;
        }
        // Bucket b waits for the part of each member's last backward that makes its
        // gradients, and for the member's comm stream.
        std::vector<std::vector<double>> ready;  // per member
        for (const auto w : workers) {
          const Stage& s = layout_.workers[static_cast<size_t>(w)].stages[static_cast<size_t>(seg.stage_of_worker[w])];
          ready.push_back(builder::bucket_ready_fractions(network_, s.layer_begin, s.layer_end, seg.begin, seg.end,
                                                          piece.buckets));
        }
        for (int b = 0; b < piece.buckets; ++b) {
          double start = 0;
          for (size_t i = 0; i < workers.size(); ++i) {
            const auto w = static_cast<size_t>(workers[i]), k = static_cast<size_t>(seg.stage_of_worker[w]);
            const auto j = static_cast<size_t>(piece.rank_of_worker[w]);
            const WorkerRun& run = runs[w];
            const double made = run.made_start[k][j] + ready[i][static_cast<size_t>(b)] * run.made_s[k][j];
            start = std::max({start, made, comm_free_[static_cast<size_t>(members[i])]});
          }
          for (int d : members) comm_free_[static_cast<size_t>(d)] = start + bucket_s;
        }
      }
    }
  }

  // Tied embeddings between the first and each later chunk (Builder::add_tied_embedding_sync).
  void sync_tied_embeddings(const std::vector<double>& last_end) {
    // From ZeRO stage 2 each replica sums its own share of the tied gradients (ZeroSync::tied_share).
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      for (size_t k = 1; k < vw.stages.size(); ++k) {
        const int t0 = vw.tensor_of(0), tk = vw.tensor_of(k);
        std::vector<int> tied_layers;
        for (int l = vw.stages[k].layer_begin; l < vw.stages[k].layer_end; ++l) {
          if (network_.layers[static_cast<size_t>(l)].tied_params > 0) tied_layers.push_back(l);
        }
        if (tied_layers.empty()) continue;
        for (const builder::Share& share : builder::shares({t0, tk})) {
          const int first = device_of(w, 0, share.rank_of[0]);
          const int holder = device_of(w, static_cast<int>(k), share.rank_of[1]);
          if (first == holder) continue;
          double tied = 0;
          for (const int l : tied_layers) tied += tied_part_params(network_, l, share.part);
          CollectiveSpec c;
          c.devices = {first, holder};
          c.bytes = tied * layout_.gradient_element_bytes() * zero_.tied_share(w, share.rank_of[0]);
          run_collective(c.devices, c.bytes > 0 ? cost_.collective_time_s(c) : 0, last_end);
        }
      }
    }
  }

  // The optimizer, on the compute stream after the device's gradients and their syncs, and
  // after its worker's gradient-norm all-reduce (Builder::add_optimizers).
  void run_optimizers(int it, const std::vector<double>& last_end) {
    double& makespan = iteration_end_[static_cast<size_t>(it)];
    std::vector<double> ready(devices_, 0);
    for (size_t d = 0; d < devices_; ++d) ready[d] = std::max(last_end[d], comm_free_[d]);
    for (const auto& [members, norm_s] : norms_) {
      double start = 0;
      for (const int d : members) start = std::max(start, ready[static_cast<size_t>(d)]);
      for (const int d : members) ready[static_cast<size_t>(d)] = start + norm_s;
    }
    for (size_t d = 0; d < devices_; ++d) {
      if (!computes_[d]) continue;
      if (layout_.offload.optimizer) {
        // Off the GPU (plan_builder_offload.cpp): the gradients down, the host's step, the
        // parameters up, which the next iteration's first pass waits for.
        // Each copy after the stashes' copies before it on its stream (activation offload).
        const auto device = static_cast<int>(d);
        const double e = model::element_bytes(layout_.precision), g = layout_.gradient_element_bytes();
        to_host_free_[d] = std::max(ready[d], to_host_free_[d]) + cost_.host_copy_time_s(device, params_[d] * g);
        const double stepped =
            to_host_free_[d] + cost_.host_step_time_s(device, builder::kAdamFlopsPerParam * params_[d],
                                                      builder::host_step_bytes_per_param(layout_) * params_[d] + norm_bytes_[d]);
        to_device_free_[d] = std::max(stepped, to_device_free_[d]) + cost_.host_copy_time_s(device, params_[d] * e);
        stream_free_[d] = to_device_free_[d];
      } else {
        const double s = optimizer_s(cost_, layout_, static_cast<int>(d), params_[d], norm_bytes_[d]);
        out_.busy_s[d] += s;
        stream_free_[d] = ready[d] + s;
      }
      makespan = std::max(makespan, stream_free_[d]);
    }
  }

  // Parameter servers (Builder::add_parameter_server_sync): pushes after each device's last
  // operation, queued per device and server, one update per server once all its pushes are
  // in, pulls queued per server and device.
  void sync_servers(int it, const std::vector<double>& last_end) {
    double& makespan = iteration_end_[static_cast<size_t>(it)];
    const double e = model::element_bytes(layout_.precision);
    const std::vector<int>& server_of = layout_.sync.layer_server;
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
      double transfer_s;
    };
    std::vector<Pull> pulls;
    size_t at = 0;
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      for (size_t k = 0; k < vw.stages.size(); ++k) {
        const int t = vw.tensor_of(k);
        for (int j = 0; j < t; ++j) {
          const int device = device_of(w, static_cast<int>(k), j);
          const double ready = last_end[static_cast<size_t>(device)];
          for (const auto& [server, n] : memo_.per_server(vw.stages[k], t, static_cast<int>(w), j, server_of)) {
            if (n <= 0) continue;
            double in = ready;
            if (server != device) {
              double& free = queue(push_free_[static_cast<size_t>(device)], server);
              free = std::max(free, ready) + push_s_[at];
              in = free;
            }
            pushed[server] = std::max(pushed[server], in);
            pulls.push_back({server, device, n * e, {static_cast<int>(w), static_cast<int>(k), j}, pull_s_[at]});
            ++at;
          }
        }
      }
    }
    std::map<int, double> updated;  // server -> end of its update
    for (const auto& [server, in] : pushed) {
      double n = 0;
      for (size_t l = 0; l < server_of.size(); ++l) {
        if (server_of[l] == server) n += params_per_device(network_, static_cast<int>(l), static_cast<int>(l) + 1, 1);
      }
      const double s = optimizer_s(cost_, layout_, server, n);
      out_.busy_s[static_cast<size_t>(server)] += s;
      double& free = update_free_[server];  // its own stream: after its last update
      // ... and after the last iteration's pulls left (Builder: the weights are not
      // overwritten while they are sent).
      free = std::max({free, in, pulls_sent_[server]}) + s;
      updated[server] = free;
      if (it > 0) continue;
      memory_[static_cast<size_t>(server)].optimizer_bytes += n * model::adam_state_bytes(layout_.precision);
      if (!computes_[static_cast<size_t>(server)]) {  // a server alone: its state and the workspace
        memory_[static_cast<size_t>(server)].capacity_bytes = cost_.memory_capacity_bytes(server);
        memory_[static_cast<size_t>(server)].workspace_bytes = layout_.workspace_bytes;
        computes_[static_cast<size_t>(server)] = true;
      }
    }
    for (const Pull& pull : pulls) {
      double in = updated.at(pull.server);
      if (pull.server != pull.device) {
        double& free = queue(pull_free_[static_cast<size_t>(pull.device)], pull.server);
        free = std::max(free, in) + pull.transfer_s;
        in = free;
        pulls_sent_[pull.server] = std::max(pulls_sent_[pull.server], in);
      }
      double& arrived = pulled_[static_cast<size_t>(it)][pull.chunk];
      arrived = std::max(arrived, in);
      makespan = std::max(makespan, in);
    }
    for (size_t d = 0; d < devices_; ++d) makespan = std::max(makespan, last_end[d]);
  }

  // Every headroom (headroom_of) into out_, the least free memory of any computing device first.
  double headroom() {
    const Headroom h = headroom_of(memory_, computes_, in_copies_, offloaded_activations_, cost_, layout_.offload.any());
    out_.headroom_bytes = h.bytes;
    out_.tightest_device = h.tightest;
    out_.headroom_with_copies_bytes = h.with_copies;
    out_.headroom_stashes_offloaded_bytes = h.stashes_offloaded;
    out_.host_headroom_bytes = h.host;
    return out_.headroom_bytes;
  }

  // The plan's estimate over several iterations: the steady state between the first and the last.
  LayoutEstimate finish() {
    out_.iteration_time_s = iterations_ > 1 ? (iteration_end_.back() - iteration_end_.front()) / (iterations_ - 1)
                                            : iteration_end_.front();
    for (double& busy : out_.busy_s) busy /= iterations_;
    out_.bubble_fraction = bubble_count_ > 0 ? bubble_sum_ / bubble_count_ : 0;
    headroom();
    out_.slowest_device = static_cast<int>(std::max_element(out_.busy_s.begin(), out_.busy_s.end()) - out_.busy_s.begin());
    return std::move(out_);
  }

  const model::Network& network_;
  const Layout& layout_;
  const CostModel& cost_;
  LayoutEstimateOptions options_;
  const Schedule& schedule_;
  const size_t devices_;
  const int iterations_;
  const bool allreduce_;
  WorkMemo memo_;
  ZeroSync zero_;
  std::map<std::tuple<int, int, int>, RankPrograms> programs_of_;  // (p, m, v)
  std::vector<Worker> workers_;
  LayoutEstimate out_;
  std::vector<double> params_;  // per device: the parameters its optimizer updates
  std::vector<DeviceMemory> memory_;
  std::vector<bool> computes_;
  std::vector<std::pair<std::vector<int>, double>> norms_;  // per worker: members and time
  std::vector<double> norm_bytes_;  // per device: the norm's read in its optimizer step (no all-reduce carries it)
  std::vector<builder::Segment> segments_;
  std::vector<double> bucket_s_;        // per data-parallel piece, in segments_' order: one bucket's time
  std::vector<double> push_s_, pull_s_;  // per push (for_each_push's order): its transfer, and its pull's
  std::vector<double> stream_free_;     // per device: its compute stream
  std::vector<double> to_host_free_, to_device_free_;  // per device: its copy streams (offload)
  std::vector<double> in_copies_, offloaded_activations_;  // per device: the screens' (headroom_of)
  std::vector<double> comm_free_;       // all-reduce: per device, its comm stream
  std::vector<std::vector<double>> channels_;  // per worker: its pipeline channels
  // Parameter servers: per device, (peer, when that channel is free); per server, its update stream.
  std::vector<std::vector<std::pair<int, double>>> push_free_, pull_free_;
  std::map<int, double> update_free_;
  std::map<int, double> pulls_sent_;  // per server: when its pulls of the last iteration were sent
  // WSP: per iteration, when each (worker, chunk, tensor rank) has all its pulls.
  std::vector<std::map<std::tuple<int, int, int>, double>> pulled_;
  std::vector<double> iteration_end_;
  double bubble_sum_ = 0;
  int bubble_count_ = 0;
};

}  // namespace

LayoutEstimate estimate_layout(const model::Network& network, const Layout& layout, const CostModel& cost,
                               const LayoutEstimateOptions& options) {
  LayoutEstimate e = Estimator(network, layout, cost, options).run();
  // The loader's closed form as a floor: an input-bound layout runs no faster than its loader.
  e.iteration_time_s = std::max(e.iteration_time_s, loader_bound(cost.cluster(), network, layout).iteration_s);
  return e;
}

}  // namespace hetflow::partition
