// ZeRO over the data axis (Layout::sync.zero; Rajbhandari et al. 2020). Each chunk's piece
// (rank j's part of it) is sharded over its replicas, the same piece in every virtual worker.
// A replica's shard is what a reduce-scatter leaves it (collective_steps.hpp, member_part):
// replica w keeps elements [n w / D, n (w + 1) / D) of each of the n-element buffers its
// reduce-scatters reduce, and its all-gathers gather those same buffers back. What the
// stages add:
//  - 1: gradients reduce-scattered once per iteration, bucket by bucket (the all-reduce's
//    buckets, halved); each device's optimizer steps its shard (its part of every bucket);
//    the updated parameters all-gathered bucket by bucket before the next iteration's passes
//    (Megatron's distributed optimizer).
//  - 2: as 1, but the backward writes its gradients to a transient whole buffer that is
//    reduce-scattered into the shard at once, micro-batch by micro-batch (DeepSpeed
//    reduces every micro-step when gradients are partitioned); buffers are whole pieces.
//  - 3: parameters sharded too: the passes read them from a transient whole copy that an
//    all-gather on the "gather" stream makes (FSDP's all-gather stream), prefetched one
//    ahead; with resharding one per pass, freed after it, the gradients reduce-scattered per
//    micro-batch; without, one per chunk and iteration, kept until the chunk's last backward,
//    its gradients summed whole and reduce-scattered once.
// Collectives of stages 2 and 3 are one task per pass and piece whose messages are FSDP's
// units (a layer each, stage 3) or the layout's buckets (stage 2).
#include <algorithm>
#include <cmath>

#include "model/error.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::builder {

int zero_stage(const Layout& layout) {
  return layout.sync.kind == SyncKind::allreduce && layout.workers.size() > 1 ? layout.sync.zero.stage : 0;
}

bool zero_scatters_each_pass(const Layout& layout) {
  const int stage = zero_stage(layout);
  return stage == 2 || (stage == 3 && layout.sync.zero.reshard_after_forward);
}

// Replicas shard a piece element by element, so they must hold the same pieces and (from
// stage 2, where collectives run per pass) meet them in the same order.
void check_zero(const Layout& layout) {
  if (zero_stage(layout) == 0) return;
  if (layout.sync.zero.shares == ZeroShares::memory) {
    if (layout.experts.parallel > 1) {
      throw InputError(kOptions, 0, "zero_shares",
                       "expected equal with expert parallelism (experts are sharded over their holders alone), found memory");
    }
    if (zero_algorithm(layout) != CollectiveAlgorithm::ring) {
      throw InputError(kOptions, 0, "zero_shares",
                       "divides shards unevenly, which a ring reduce-scatter and all-gather carry and a " +
                           std::string(to_string(zero_algorithm(layout))) + " one does not: give `allreduce` ring");
    }
  }
  const VirtualWorker& first = layout.workers.front();
  for (size_t w = 1; w < layout.workers.size(); ++w) {
    const VirtualWorker& vw = layout.workers[w];
    bool same = vw.stages == first.stages && vw.ranks.size() == first.ranks.size();
    for (size_t r = 0; same && r < vw.ranks.size(); ++r) same = vw.ranks[r].size() == first.ranks[r].size();
    if (!same) {
      throw InputError(kOptions, 0, "zero_stage",
                       "shards each chunk over its replicas, but virtual worker " + std::to_string(w) +
                           " cuts the model differently from worker 0 (its chunks or their tensor-parallel degrees "
                           "differ); give every worker the same cuts");
    }
    if (zero_stage(layout) >= 2 && vw.microbatches != first.microbatches) {
      throw InputError(kOptions, 0, "zero_stage",
                       "stage " + std::to_string(zero_stage(layout)) + " synchronises every micro-batch, but virtual worker " +
                           std::to_string(w) + " runs " + std::to_string(vw.microbatches) + " and worker 0 runs " +
                           std::to_string(first.microbatches) + "; give every worker the same micro-batches");
    }
  }
}

// A scatter or gather has no tree (collective.hpp): a tree all-reduce's shards move by ring.
CollectiveAlgorithm zero_algorithm(const Layout& layout) {
  return supports(CollectiveKind::all_gather, layout.sync.algorithm) ? layout.sync.algorithm : CollectiveAlgorithm::ring;
}

double zero_shard(double params, int w, int replicas, const std::vector<double>& parts) {
  const auto n = static_cast<long long>(std::llround(params));
  if (!parts.empty()) {
    const std::vector<double> cuts = part_cuts(parts, parts.size());
    const auto at = [&](size_t i) { return std::llround(cuts[i] * static_cast<double>(n)); };
    return static_cast<double>(at(static_cast<size_t>(w) + 1) - at(static_cast<size_t>(w)));
  }
  const auto d = static_cast<long long>(replicas);
  return static_cast<double>(n * (w + 1) / d - n * w / d);
}

std::vector<double> zero_parts(const Layout& layout, const model::Cluster& cluster, const std::vector<int>& devices) {
  if (layout.sync.zero.shares == ZeroShares::equal || devices.size() < 2) return {};
  const std::vector<model::Device> all = cluster.devices();  // (made anew on each call)
  std::vector<double> memory;
  double total = 0;
  for (const int d : devices) {
    memory.push_back(cluster.device_gpu(all[static_cast<size_t>(d)]).memory_bytes);
    total += memory.back();
  }
  if (std::adjacent_find(memory.begin(), memory.end(), std::not_equal_to<>()) == memory.end()) return {};
  for (double& m : memory) m /= total;
  return memory;
}

double zero_own(const Layout& layout, double params, double experts, int w, const std::vector<double>& parts) {
  const int workers = static_cast<int>(layout.workers.size());
  const int c = std::max(1, layout.size(Axis::context)), ep = std::max(1, layout.experts.parallel);
  const int holders = std::max(1, workers / ep);  // (check_experts: ep divides the replicas)
  return zero_shard(params - experts, w, workers, parts) + zero_shard(experts, w / (c * ep) * c + w % c, holders);
}

int zero_messages(const model::Network& net, const Layout& layout, int begin, int end, double bytes) {
  if (zero_stage(layout) < 3) return std::max(1, static_cast<int>(std::ceil(bytes / layout.sync.bucket_bytes)));
  int units = 0;  // FSDP wraps each layer that holds parameters
  for (int l = begin; l < end; ++l) {
    const model::Layer& layer = net.layers[static_cast<size_t>(l)];
    units += layer.params + layer.tied_params > 0;
  }
  return std::max(1, units);
}

int Builder::zero_stage() const { return builder::zero_stage(layout_); }

void Builder::check_zero() const { builder::check_zero(layout_); }

CollectiveAlgorithm Builder::zero_algorithm() const { return builder::zero_algorithm(layout_); }

double Builder::shard(double params, int w) const {
  return zero_shard(params, w, static_cast<int>(layout_.workers.size()));
}


double Builder::piece_params(int w, int stage, int j) const {
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  return part_params(net_, s.layer_begin, s.layer_end, SplitPart::rank(j, degree(w, stage)));
}

double Builder::rank_params(int w, int stage, int j) const {
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  return piece_params(w, stage, j) - expert_params_elsewhere(net_, s.layer_begin, s.layer_end,
                                                             expert_share(experts_, layout_, w).held, degree(w, stage));
}

// A transient whole buffer holds one unit at a time: FSDP gathers and reduce-scatters layer by
// layer (its wrapped blocks), DeepSpeed's stage 2 reduces bucket by bucket; only without
// resharding is a chunk kept whole. The next unit (prefetched, or in its reduce-scatter) is
// the next pass's tensor, so two are alive at the peak.
double Builder::unit_params(int w, int stage, int j) const {
  const double whole = rank_params(w, stage, j), full = piece_params(w, stage, j);
  if (zero_stage() == 2) return std::min(whole, layout_.sync.bucket_bytes / layout_.gradient_element_bytes());
  if (!layout_.sync.zero.reshard_after_forward) return whole;
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  double largest = 0;
  for (int l = s.layer_begin; l < s.layer_end; ++l) {
    largest = std::max(largest, layer_part_params(net_, l, s.layer_begin, SplitPart::rank(j, degree(w, stage))));
  }
  // (Under expert parallelism the rank's share of its largest layer: the experts it holds.)
  return whole == full ? std::min(whole, largest) : whole * std::min(1.0, largest / std::max(1.0, full));
}

int Builder::zero_messages(int w, int stage, double bytes) const {
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  return builder::zero_messages(net_, layout_, s.layer_begin, s.layer_end, bytes);
}

std::vector<double> Builder::zero_parts(const std::vector<int>& devices) const {
  if (layout_.sync.zero.shares == ZeroShares::equal) return {};
  const auto known = zero_parts_.find(devices);  // (asked once a worker for each piece)
  if (known != zero_parts_.end()) return known->second;
  std::vector<double> parts = builder::zero_parts(layout_, cluster_, devices);
  if (!parts.empty() && layout_.folded) {
    // (A folded ring's members stand for replicas alike; uneven parts are not alike.)
    throw InputError(kOptions, 0, "zero_shares",
                     "divides shards by memory among replicas of different memory sizes, which a folded plan cannot "
                     "stand for by one replica: plan it without fold or with equal shares");
  }
  zero_parts_.emplace(devices, parts);
  return parts;
}

std::string Builder::expert_piece_name(int begin, int end, const std::vector<int>& members, int stage, int j) const {
  const int r = expert_rank(members.front(), layout_.size(Axis::context), layout_.experts.parallel);
  return "edp l" + std::to_string(begin) + "-" + std::to_string(end - 1) + " e" + std::to_string(r) +
         (degree(members.front(), stage) > 1 ? " t" + std::to_string(j) : "");
}

std::vector<int> Builder::replicas(int stage, int j) const {
  std::vector<int> devices;
  for (size_t w = 0; w < layout_.workers.size(); ++w) devices.push_back(device_of(static_cast<int>(w), stage, j));
  return devices;
}

std::string Builder::replica_group_name(int stage, int j) const {
  const Stage& s = worker(0).stages[static_cast<size_t>(stage)];
  return "dp l" + std::to_string(s.layer_begin) + "-" + std::to_string(s.layer_end - 1) + " t" + std::to_string(j);
}

std::vector<int> Builder::pass_params(int w, int stage, int mb, OpKind pass, int j) {
  const int d = device_of(w, stage, j);
  if (zero_stage() < 3) return {weight_of(d, stage)};
  const bool each_pass = layout_.sync.zero.reshard_after_forward;
  const auto key = each_pass ? std::make_tuple(stage, mb, static_cast<int>(pass), j) : std::make_tuple(stage, -1, -1, j);
  auto it = gathered_.find(key);
  if (it == gathered_.end()) {
    // Asked first by worker 0, whose program order every replica shares (check_zero): the
    // all-gathers are made for all of them at once, in that order on their gather streams.
    // Under expert parallelism a chunk with routed experts is two pieces (data_parallel_segments):
    // the dense part gathered over every replica, each expert rank's experts over their holders.
    const size_t built = built_workers();
    const double e = model::element_bytes(layout_.precision), g = layout_.gradient_element_bytes();
    const Stage& s = worker(0).stages[static_cast<size_t>(stage)];
    std::vector<Segment::Piece> pieces;
    if (layout_.experts.parallel > 1 && !expert_segments_) expert_segments_ = data_parallel_segments(net_, layout_);
    static const std::vector<Segment> kNone;
    for (const Segment& seg : expert_segments_ ? *expert_segments_ : kNone) {
      if (seg.begin != s.layer_begin || seg.end != s.layer_end) continue;
      for (const Segment::Piece& piece : seg.pieces) {
        if (piece.rank_of_worker.front() == j) pieces.push_back(piece);
      }
    }
    if (pieces.empty()) pieces.push_back({std::vector<int>(layout_.workers.size(), j), piece_params(w, stage, j) * g, 1, {}});
    // One pass holds a unit of each piece at a time (FSDP's layer), in the chunk's proportion.
    const double unit_share = unit_params(w, stage, j) / std::max(1.0, rank_params(w, stage, j));
    std::vector<std::vector<int>> copies(built);
    for (const Segment::Piece& piece : pieces) {
      const std::vector<int> members = piece_workers(piece, layout_.workers.size());
      const double params = piece.bytes / g, unit = pieces.size() == 1 ? unit_params(w, stage, j) : params * unit_share;
      std::vector<int> devices, shards, wholes;
      for (const int m : members) {
        devices.push_back(device_of(m, stage, j));
        if (static_cast<size_t>(m) >= built) continue;
        shards.push_back(weight_of(devices.back(), stage));
        wholes.push_back(tensor(TensorKind::gathered_weight, devices.back(), unit * e, {static_cast<std::int64_t>(unit)},
                                layout_.precision));
      }
      if (wholes.empty()) continue;  // (folded: a piece of replicas no built worker holds)
      const bool expert = members.size() < layout_.workers.size();
      const std::string name =
          expert ? expert_piece_name(s.layer_begin, s.layer_end, members, stage, j) : replica_group_name(stage, j);
      Task like = base_task(TaskKind::collective, devices[0], 0, stage, each_pass ? mb : -1);
      const auto tasks = add_collective(CollectiveKind::all_gather, zero_algorithm(), name, devices, params * e,
                                        Purpose::data_parallel, stream("gather"), like, shards, wholes, wholes.size());
      plan_.collectives.back().messages = zero_messages(w, stage, params * e);
      plan_.collectives.back().parts = zero_parts(devices);
      for (size_t i = 0; i < tasks.size(); ++i) {
        const auto m = static_cast<size_t>(members[i]);
        plan_.task(tasks[i]).worker = members[i];  // each replica's own
        gathers_[static_cast<size_t>(devices[i])].push_back({tasks[i], wholes[i], -1});
        copies[m].push_back(wholes[i]);
      }
    }
    it = gathered_.emplace(key, std::move(copies)).first;
  }
  return it->second[static_cast<size_t>(w)];
}

void Builder::read_params(const std::vector<int>& tensors, int task) {
  if (zero_stage() < 3) return;
  // The last reader frees a gathered copy (tasks are made in program order); the first is
  // what the next all-gather's prefetch waits to come up.
  for (const int tensor_id : tensors) {
    set_free_after(tensor_id, task);
    for (Gather& g : gathers_[static_cast<size_t>(plan_.task(task).device)]) {
      if (g.tensor == tensor_id && g.first_reader < 0) g.first_reader = task;
    }
  }
}

void Builder::add_gradient_target(int w, int stage, int mb, int j, std::vector<int>& reads, std::vector<int>& writes) {
  const int d = device_of(w, stage, j);
  const bool once = zero_stage() == 3 && !layout_.sync.zero.reshard_after_forward;
  if (zero_stage() < 2) {
    writes.push_back(grad_of(d, stage));
    return;
  }
  const auto key = std::make_tuple(w, stage, once ? -1 : mb, j);
  const auto it = unsharded_.find(key);
  if (it != unsharded_.end()) {
    reads.push_back(it->second);
    return;
  }
  const double unit = unit_params(w, stage, j);
  const int id = tensor(TensorKind::unsharded_grad, d, unit * layout_.gradient_element_bytes(),
                        {static_cast<std::int64_t>(unit)},
                        layout_.fp32_grad_accumulation ? model::Precision::fp32 : layout_.precision);
  unsharded_.emplace(key, id);
  writes.push_back(id);
}

// Stages 2 and 3: the reduce-scatters of the gradients the passes made, in worker 0's
// program order (every replica's), each replica's whole buffer into its shard.
void Builder::add_zero_reduce_scatters(std::map<int, std::vector<int>>& syncs_of_device) {
  const bool once = zero_stage() == 3 && !layout_.sync.zero.reshard_after_forward;
  const size_t built = built_workers();
  const OpKind makes = schedule_.splits_backward ? OpKind::W : OpKind::B;  // the pass that writes gradients
  const VirtualWorker& vw = worker(0);
  const int p = static_cast<int>(vw.ranks.size()), comm = stream("comm");
  std::vector<int> last_mb(vw.stages.size(), -1);  // per chunk: the micro-batch whose pass makes gradients last
  for (int r = 0; r < p; ++r) {
    for (const ScheduledOp& o : programs_[0][static_cast<size_t>(r)]) {
      if (o.kind == makes) last_mb[static_cast<size_t>(o.chunk * p + r)] = o.microbatch;
    }
  }
  // Under expert parallelism a chunk's gradients are reduce-scattered in the pieces its
  // all-reduce would sum (data_parallel_segments: the layers less their routed experts over
  // every replica, each expert rank's experts over their holders), each from the same whole
  // buffer; otherwise in one piece per tensor rank over every replica.
  const std::vector<Segment> segments =
      layout_.experts.parallel > 1 ? data_parallel_segments(net_, layout_) : std::vector<Segment>{};
  for (int r = 0; r < p; ++r) {
    for (const ScheduledOp& o : programs_[0][static_cast<size_t>(r)]) {
      const int stage = o.chunk * p + r;
      if (o.kind != makes || (once && o.microbatch != last_mb[static_cast<size_t>(stage)])) continue;
      const Stage& s = vw.stages[static_cast<size_t>(stage)];
      for (int j = 0; j < degree(0, stage); ++j) {
        std::vector<std::pair<std::vector<int>, double>> pieces;  // (members, gradient bytes)
        for (const Segment& seg : segments) {
          if (seg.begin != s.layer_begin || seg.end != s.layer_end) continue;
          for (const Segment::Piece& piece : seg.pieces) {
            if (piece.rank_of_worker.front() == j) pieces.emplace_back(piece_workers(piece, layout_.workers.size()), piece.bytes);
          }
        }
        if (pieces.empty()) {
          pieces.emplace_back(piece_workers({}, layout_.workers.size()), piece_params(0, stage, j) * layout_.gradient_element_bytes());
        }
        for (const auto& [members, bytes] : pieces) {
          // (Folded: the replicas' devices stand in the ring, the built workers' alone have tasks.)
          std::vector<int> devices, wholes, shards;
          for (const int w : members) {
            devices.push_back(device_of(w, stage, j));
            if (static_cast<size_t>(w) >= built) continue;
            wholes.push_back(unsharded_.at({w, stage, once ? -1 : o.microbatch, j}));
            shards.push_back(grad_of(devices.back(), stage));
          }
          const bool expert = members.size() < layout_.workers.size();
          const std::string name =
              expert ? expert_piece_name(s.layer_begin, s.layer_end, members, stage, j) : replica_group_name(stage, j);
          Task like = base_task(TaskKind::collective, devices[0], 0, stage, once ? -1 : o.microbatch);
          const auto tasks = add_collective(CollectiveKind::reduce_scatter, zero_algorithm(), name, devices, bytes,
                                            Purpose::data_parallel, comm, like, wholes, shards, wholes.size());
          plan_.collectives.back().messages = zero_messages(0, stage, bytes);
          plan_.collectives.back().parts = zero_parts(devices);
          for (size_t i = 0; i < tasks.size(); ++i) {
            const int w = members[i];
            plan_.task(tasks[i]).worker = w;
            set_free_after(wholes[i], tasks[i]);
            // After every pass that adds to it, not its first writer alone (each is an edge:
            // validation sees who reads a tensor before it is freed): summed whole over the
            // iteration, or the B that writes it and the W that adds the weights' gradients.
            for (int mb = once ? 0 : o.microbatch; mb < (once ? vw.microbatches : o.microbatch + 1); ++mb) {
              plan_.add_order(op(w, stage, mb, makes, j).task, tasks[i]);
              if (makes == OpKind::W) plan_.add_order(op(w, stage, mb, OpKind::B, j).task, tasks[i]);
            }
            syncs_of_device[devices[i]].push_back(tasks[i]);
          }
        }
      }
    }
  }
}

// Stages 1 and 2: once every replica's optimizer has stepped its shard, the pieces'
// parameters all-gathered on the comm stream; the device's next iteration waits for them.
// Stage 3: each device's first all-gather of an iteration waits for the previous
// iteration's optimizer, and each later one for the pass before the one that reads its
// predecessor's copy to end (prefetch one ahead, as FSDP's forward and backward prefetch).
void Builder::add_zero_gathers(const std::map<int, int>& optimizer_of_device) {
  const size_t built = built_workers();
  if (zero_stage() >= 3) {
    for (size_t d = 0; d < gathers_.size(); ++d) {
      const std::vector<Gather>& gathers = gathers_[d];
      if (gathers.empty()) continue;
      const auto opt = optimizer_of_device.find(static_cast<int>(d));
      const std::vector<int>& compute = plan_.program(static_cast<int>(d), compute_stream_);
      int previous = -1;  // the first reader of the previous pass's gathers (a pass may read several: pieces)
      for (size_t i = 0; i < gathers.size(); ++i) {
        if (i > 0 && gathers[i].first_reader != gathers[i - 1].first_reader) previous = gathers[i - 1].first_reader;
        if (previous < 0) {
          if (opt != optimizer_of_device.end()) plan_.add_order(opt->second, gathers[i].task, 1);
          continue;
        }
        const auto at = std::find(compute.begin(), compute.end(), previous);
        if (at != compute.end() && at != compute.begin()) plan_.add_order(*(at - 1), gathers[i].task);
      }
    }
    return;
  }
  const int comm = stream("comm");
  const double e = model::element_bytes(layout_.precision), grad_e = layout_.gradient_element_bytes();
  std::map<int, int> last_gather;
  // One all-gather per reduce-scatter, of the same floats: stage 1 per bucket (a replica's
  // shard is its part of every bucket, as Megatron's distributed optimizer shards each bucket
  // and gathers it back), stage 2 per piece (its reduce-scatters are the piece's).
  std::vector<Segment> pieces;
  if (zero_stage() == 1 || layout_.experts.parallel > 1) {
    pieces = data_parallel_segments(net_, layout_);
    // (Stage 2: each piece gathered once, in FSDP's units or buckets as its reduce-scatters.)
    for (Segment& seg : pieces) {
      for (Segment::Piece& piece : seg.pieces) piece.buckets = zero_stage() == 1 ? piece.buckets : 1;
    }
  } else {
    const VirtualWorker& vw = worker(0);
    for (int stage = 0; stage < static_cast<int>(vw.stages.size()); ++stage) {
      Segment seg{vw.stages[static_cast<size_t>(stage)].layer_begin, vw.stages[static_cast<size_t>(stage)].layer_end,
                  std::vector<int>(layout_.workers.size(), stage), {}};
      for (int j = 0; j < degree(0, stage); ++j) {
        seg.pieces.push_back({std::vector<int>(layout_.workers.size(), j), piece_params(0, stage, j) * grad_e, 1, {}});
      }
      pieces.push_back(std::move(seg));
    }
  }
  for (auto seg = pieces.rbegin(); seg != pieces.rend(); ++seg) {  // as the gradients came
    const int stage = seg->stage_of_worker.front();
    for (const Segment::Piece& piece : seg->pieces) {
      std::vector<int> devices, params;
      const std::vector<int> members = piece_workers(piece, layout_.workers.size());
      for (const int m : members) {
        const auto w = static_cast<size_t>(m);
        devices.push_back(device_of(m, seg->stage_of_worker[w], piece.rank_of_worker[w]));
        if (w < built) params.push_back(weight_of(devices.back(), seg->stage_of_worker[w]));
      }
      Task like = base_task(TaskKind::collective, devices[0], 0, stage, -1);
      like.layer_begin = seg->begin;
      like.layer_end = seg->end;
      const double bytes = piece.bytes / grad_e * e;
      const int j = piece.rank_of_worker.front();
      const std::vector<double> parts = zero_parts(devices);
      for (int b = 0; b < piece.buckets; ++b) {
        const auto tasks = add_collective(CollectiveKind::all_gather, zero_algorithm(), replica_group_name(stage, j),
                                          devices, bucket_bytes(bytes, e, piece.buckets, b), Purpose::data_parallel,
                                          comm, like, params, params, params.size());
        plan_.collectives.back().parts = parts;
        if (zero_stage() == 2) plan_.collectives.back().messages = zero_messages(0, stage, bytes);
        for (size_t w = 0; w < tasks.size(); ++w) {
          plan_.task(tasks[w]).worker = members[w];
          plan_.add_order(optimizer_of_device.at(devices[w]), tasks[w]);
          last_gather[devices[w]] = tasks[w];
        }
      }
    }
  }
  for (const auto& [device, gather] : last_gather) {
    const std::vector<int>& compute = plan_.program(device, compute_stream_);
    if (!compute.empty()) plan_.add_order(gather, compute.front(), 1);
  }
}

}  // namespace hetflow::partition::builder
