// After the pipelines: gradient synchronisation and the optimizer.
//  - all-reduce: one bucketed all-reduce per layer segment held by the same devices across
//    virtual workers, on the "comm" stream (workers that hold a segment at different
//    tensor-parallel degrees all-reduce it in pieces, see Share); then the tied-embedding
//    gradient all-reduce
//    between the first and the last stage of each virtual worker (Megatron's embedding
//    group); then the gradient norm all-reduced over each virtual worker's devices (clipping);
//    then an optimizer step per device.
//    Under ZeRO (plan_builder_zero.cpp) the buckets are reduce-scattered (stage 1) or every
//    pass's gradients are (stages 2, 3), each optimizer steps its replica's shard, and the
//    parameters are all-gathered after it (stages 1, 2) or before each pass (stage 3).
//  - ps / wsp: pushes of each chunk's gradients to the servers of its layers, one update per
//    server, pulls back; iteration i + D + 1 of a worker's chunk waits for the pull of
//    iteration i (an order edge with offset D + 1; D = 0 is synchronous); a server's update of
//    iteration i + 1 waits for its pulls of iteration i to be sent (offset 1): the weights
//    they carry are not overwritten in flight.
#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

#include "model/error.hpp"
#include "partition/expert_shard.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::builder {

// The last compute task of each device (its gradients are complete after it).
std::map<int, int> Builder::last_compute_of_devices() const {
  std::map<int, int> last;
  for (const VirtualWorker& vw : layout_.workers) {
    for (const auto& rank : vw.ranks) {
      for (int d : rank) {
        const auto& program = plan_.program(d, compute_stream_);
        for (auto i = program.rbegin(); i != program.rend(); ++i) {
          const TaskKind k = plan_.task(*i).kind;
          if (k == TaskKind::backward || k == TaskKind::backward_weight || k == TaskKind::collective) {
            last[d] = *i;
            break;
          }
        }
      }
    }
  }
  return last;
}

// The task after which each chunk's gradients are complete, by (device, worker, stage): its
// last backward (or W) in the device's compute program, the last micro-batch's.
std::map<std::tuple<int, int, int>, int> Builder::last_backward_of_chunks() const {
  std::map<std::tuple<int, int, int>, int> last;
  for (const VirtualWorker& vw : layout_.workers) {
    for (const auto& rank : vw.ranks) {
      for (int d : rank) {
        const auto& program = plan_.program(d, compute_stream_);
        for (auto i = program.rbegin(); i != program.rend(); ++i) {
          const Task& t = plan_.task(*i);
          if (t.kind == TaskKind::backward || t.kind == TaskKind::backward_weight) last.try_emplace({d, t.worker, t.stage}, *i);
        }
      }
    }
  }
  return last;
}

std::vector<double> bucket_ready_fractions(const model::Network& net, int chunk_begin, int chunk_end, int begin, int end,
                                           int buckets) {
  const auto work = [&net](int l) { return net.layers[static_cast<size_t>(l)].backward_flops; };
  double total = 0, done = 0, params = 0;
  for (int l = chunk_begin; l < chunk_end; ++l) total += work(l);
  for (int l = end; l < chunk_end; ++l) done += work(l);  // layers above the segment come first
  for (int l = begin; l < end; ++l) params += layer_params_per_device(net, l, chunk_begin, 1);
  std::vector<double> out;
  double above = 0;  // parameters of the layers the backward has passed, from `end` down
  int l = end;
  for (int b = 0; b < buckets; ++b) {
    const double need = params * (b + 1) / buckets;
    while (l > begin && (above < need * (1 - 1e-12) || b + 1 == buckets)) {
      --l;
      above += layer_params_per_device(net, l, chunk_begin, 1);
      done += work(l);
    }
    const double f = total > 0 ? done / total : 1;
    out.push_back(f > 0 && f < 1 - 1e-12 ? f : 1.0);
  }
  return out;
}

std::vector<Share> shares(const std::vector<int>& degrees) {
  const auto first = degrees.empty() ? 1 : degrees.front();
  if (std::all_of(degrees.begin(), degrees.end(), [first](int t) { return t == first; })) {
    std::vector<Share> out(static_cast<size_t>(first));
    for (int j = 0; j < first; ++j) {
      out[static_cast<size_t>(j)] = {1.0 / first, std::vector<int>(degrees.size(), j), SplitPart::rank(j, first)};
    }
    return out;
  }
  // The cuts j / t of every degree, as fractions (numerator, denominator), in order.
  std::vector<std::pair<long long, long long>> cuts;
  for (const int t : degrees) {
    for (int j = 0; j < t; ++j) cuts.emplace_back(j, t);
  }
  const auto less = [](const auto& a, const auto& b) { return a.first * b.second < b.first * a.second; };
  const auto same = [](const auto& a, const auto& b) { return a.first * b.second == b.first * a.second; };
  std::sort(cuts.begin(), cuts.end(), less);
  cuts.erase(std::unique(cuts.begin(), cuts.end(), same), cuts.end());
  cuts.emplace_back(1, 1);
  std::vector<Share> out;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const auto [a, b] = cuts[c];
    const auto [n, d] = cuts[c + 1];
    Share share;
    share.fraction = static_cast<double>(n * b - a * d) / static_cast<double>(b * d);
    for (const int t : degrees) share.rank_of.push_back(static_cast<int>(a * t / b));  // j / t <= a / b < (j + 1) / t
    share.part = {a, b, n, d};
    out.push_back(std::move(share));
  }
  return out;
}

std::vector<int> piece_workers(const Segment::Piece& piece, size_t workers) {
  if (!piece.workers.empty()) return piece.workers;
  std::vector<int> all(workers);
  for (size_t w = 0; w < workers; ++w) all[w] = static_cast<int>(w);
  return all;
}

namespace {
// Expert parallelism: a segment's routed experts leave its (one-degree, check_experts)
// pieces, one per tensor rank, for pieces of their own, one per expert rank and tensor rank,
// over the workers of that expert rank (every expert group's, and every context rank's: they
// hold the same experts).
void split_expert_pieces(const model::Network& net, const Layout& layout, Segment& seg) {
  const int ep = layout.experts.parallel, context = layout.size(Axis::context);
  const int t = static_cast<int>(seg.pieces.size());
  if (ep <= 1 || t < 1 || routed_expert_params(net, seg.begin, seg.end, 1) <= 0) return;
  const double routed = routed_expert_params(net, seg.begin, seg.end, t);
  const double g = layout.gradient_element_bytes();
  const ExpertSplit split = expert_split(net, layout);
  std::vector<Segment::Piece> experts;
  for (Segment::Piece& dense : seg.pieces) {
    dense.bytes -= routed * g;
    dense.buckets = std::max(1, static_cast<int>(std::ceil(dense.bytes / layout.sync.bucket_bytes)));
    for (int r = 0; r < ep; ++r) {
      Segment::Piece piece;
      piece.rank_of_worker = dense.rank_of_worker;
      for (size_t w = 0; w < layout.workers.size(); ++w) {
        if (expert_rank(static_cast<int>(w), context, ep) == r) piece.workers.push_back(static_cast<int>(w));
      }
      const int held = split.held[static_cast<size_t>(r)];
      piece.bytes = (routed - expert_params_elsewhere(net, seg.begin, seg.end, held, t)) * g;
      piece.buckets = std::max(1, static_cast<int>(std::ceil(piece.bytes / layout.sync.bucket_bytes)));
      if (piece.bytes > 0 && piece.workers.size() > 1) experts.push_back(std::move(piece));
    }
  }
  for (Segment::Piece& piece : experts) seg.pieces.push_back(std::move(piece));
}
}  // namespace

// Maximal layer ranges held by the same chunks in every virtual worker.
std::vector<Segment> data_parallel_segments(const model::Network& net, const Layout& layout) {
  std::vector<Segment> segments;
  if (layout.workers.size() < 2) return segments;
  const double grad_bytes_per_param = layout.gradient_element_bytes();
  const int layers = static_cast<int>(net.layers.size());
  std::vector<std::vector<int>> holders(static_cast<size_t>(layers));  // per layer, per worker: stage
  for (const VirtualWorker& vw : layout.workers) {
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      for (int l = vw.stages[k].layer_begin; l < vw.stages[k].layer_end; ++l) {
        holders[static_cast<size_t>(l)].push_back(static_cast<int>(k));
      }
    }
  }
  // A piece's bytes: the gradients of the part of the split its members hold (shard.hpp).
  const auto piece = [&](std::vector<int> ranks, double bytes) {
    const int buckets = std::max(1, static_cast<int>(std::ceil(bytes / layout.sync.bucket_bytes)));
    return Segment::Piece{std::move(ranks), bytes, buckets, {}};
  };
  for (int end = layers; end > 0;) {
    int begin = end - 1;
    while (begin > 0 && holders[static_cast<size_t>(begin - 1)] == holders[static_cast<size_t>(end - 1)]) --begin;
    Segment seg{begin, end, holders[static_cast<size_t>(end - 1)], {}};
    std::vector<int> degrees;
    for (size_t w = 0; w < layout.workers.size(); ++w) {
      degrees.push_back(layout.workers[w].tensor_of(static_cast<size_t>(seg.stage_of_worker[w])));
    }
    if (std::adjacent_find(degrees.begin(), degrees.end(), std::not_equal_to<>()) == degrees.end()) {
      // One degree t: rank j of every worker holds the same 1/t (all of a replicated layer).
      const int t = degrees.front();
      for (int j = 0; j < t; ++j) {
        const double bytes = part_params(net, begin, end, SplitPart::rank(j, t)) * grad_bytes_per_param;
        seg.pieces.push_back(piece(std::vector<int>(degrees.size(), j), bytes));
      }
    } else {
      // Different degrees (only tensor-parallel layers have parameters here: check_layout).
      for (Share& s : shares(degrees)) {
        const double bytes = part_params(net, begin, end, s.part) * grad_bytes_per_param;
        seg.pieces.push_back(piece(std::move(s.rank_of), bytes));
      }
    }
    split_expert_pieces(net, layout, seg);
    segments.push_back(std::move(seg));
    end = begin;
  }
  return segments;
}

void Builder::add_data_parallel_sync() {
  if (layout_.sync.kind == SyncKind::allreduce) {
    add_allreduce_sync();
  } else {
    add_parameter_server_sync();
  }
}

void Builder::add_allreduce_sync() {
  const std::map<int, int> last = last_compute_of_devices();
  const bool overlap = layout_.sync.overlap_grad_reduce;
  const std::map<std::tuple<int, int, int>, int> made = overlap ? last_backward_of_chunks() : decltype(made){};
  std::map<int, std::vector<int>> syncs_of_device;
  const int comm = stream("comm");
  // ZeRO 1 reduce-scatters these buckets instead (each replica keeps its shard's sum); from
  // stage 2 every pass's gradients are reduce-scattered as they come (plan_builder_zero.cpp).
  const CollectiveKind kind = zero_stage() >= 1 ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce;
  const CollectiveAlgorithm algorithm = zero_stage() >= 1 ? zero_algorithm() : layout_.sync.algorithm;
  if (zero_stage() >= 2) add_zero_reduce_scatters(syncs_of_device);
  // ZeRO 1 scatters what the tied embedding's two copies sum: they add first, whole (each
  // replica's shard of one copy is another range than of the other), and the buckets after.
  if (zero_stage() == 1) add_tied_embedding_sync(syncs_of_device);
  for (const Segment& seg : zero_stage() >= 2 ? std::vector<Segment>{} : data_parallel_segments(net_, layout_)) {
    const auto& [begin, end, stage_of_worker, pieces] = seg;
    for (size_t j = 0; j < pieces.size(); ++j) {
      const auto& [rank_of_worker, bytes, buckets, subset] = pieces[j];
      const std::vector<int> members = piece_workers(pieces[j], layout_.workers.size());
      std::vector<int> devices, grads;
      for (const int w : members) {
        const int d = device_of(w, stage_of_worker[static_cast<size_t>(w)], rank_of_worker[static_cast<size_t>(w)]);
        devices.push_back(d);
        // Folded: the replicas' devices stand in the ring, the built workers' alone have tasks.
        if (static_cast<size_t>(w) < built_workers()) grads.push_back(grad_of(d, stage_of_worker[static_cast<size_t>(w)]));
      }
      Task like = base_task(TaskKind::collective, devices[0], -1, -1, -1);
      like.layer_begin = begin;
      like.layer_end = end;
      const auto first = static_cast<size_t>(members.front());
      const std::string name = subset.empty() ? "dp l" + std::to_string(begin) + "-" + std::to_string(end - 1) + " t" +
                                                    std::to_string(j)
                                              : expert_piece_name(begin, end, members, stage_of_worker[first],
                                                                  rank_of_worker[first]);
      // With overlap, where in its chunk's last backward each worker's buckets are complete.
      std::vector<std::vector<double>> ready;
      for (const int w : members) {
        if (!overlap) break;
        const Stage& s = layout_.workers[static_cast<size_t>(w)].stages[static_cast<size_t>(stage_of_worker[static_cast<size_t>(w)])];
        ready.push_back(bucket_ready_fractions(net_, s.layer_begin, s.layer_end, begin, end, buckets));
      }
      // ZeRO 1's shares of each bucket (Sharding::shares; empty: equal).
      const std::vector<double> parts = zero_stage() >= 1 ? zero_parts(devices) : std::vector<double>{};
      for (int b = 0; b < buckets; ++b) {
        const auto tasks = add_collective(kind, algorithm, name, devices,
                                          bucket_bytes(bytes, layout_.gradient_element_bytes(), buckets, b),
                                          Purpose::data_parallel, comm, like, grads, grads, grads.size());
        plan_.collectives.back().parts = parts;
        for (size_t i = 0; i < tasks.size(); ++i) {  // tasks[i]: member i's (the built workers' alone when folded)
          auto& syncs = syncs_of_device[devices[i]];
          if (overlap) {
            // Each bucket waits for the part of the last backward that makes its gradients.
            const int from = made.at({devices[i], members[i], stage_of_worker[static_cast<size_t>(members[i])]});
            plan_.add_order(from, tasks[i], 0, ready[i][static_cast<size_t>(b)]);
          } else if (syncs.empty()) {
            // The gradient buffer is complete: the device's first sync waits for its last
            // compute, the later ones follow it on the comm stream.
            plan_.add_order(last.at(devices[i]), tasks[i]);
          }
          syncs.push_back(tasks[i]);
        }
      }
    }
  }
  if (zero_stage() != 1) add_tied_embedding_sync(syncs_of_device);
  const std::map<int, int> optimizers = add_optimizers(syncs_of_device);
  if (zero_stage() > 0) add_zero_gathers(optimizers);
}

// Tied input and output embeddings: the first and the last stage both hold the word
// embedding and add their gradients before the optimizer (after data-parallel sync), rank j
// with rank j at one degree, else in the pieces of their two degrees (see Share).
void Builder::add_tied_embedding_sync(std::map<int, std::vector<int>>& syncs_of_device) {
  const std::map<int, int> last = last_compute_of_devices();
  const int comm = stream("comm");
  const double grad_bytes_per_param = layout_.gradient_element_bytes();
  const size_t built = built_workers();
  for (size_t w = 0; w < built; ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    for (size_t k = 1; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      const int t0 = vw.tensor_of(0), tk = vw.tensor_of(k);
      const std::vector<Share> pieces = shares({t0, tk});
      std::vector<int> tied_layers;
      for (int l = s.layer_begin; l < s.layer_end; ++l) {
        if (net_.layers[static_cast<size_t>(l)].tied_params > 0) tied_layers.push_back(l);
      }
      if (tied_layers.empty()) continue;
      for (size_t j = 0; j < pieces.size(); ++j) {
        const int first = device_of(static_cast<int>(w), 0, pieces[j].rank_of[0]);
        const int holder = device_of(static_cast<int>(w), static_cast<int>(k), pieces[j].rank_of[1]);
        double tied = 0;  // the piece's rows of the tied matrix
        for (const int l : tied_layers) tied += tied_part_params(net_, l, pieces[j].part);
        // From ZeRO 2 each replica sums its own share of the tied gradients.
        const std::vector<double> parts = zero_stage() >= 2 ? zero_parts(replicas(0, pieces[j].rank_of[0])) : std::vector<double>{};
        const double share = zero_stage() < 2 ? 1
                             : parts.empty()  ? 1 / static_cast<double>(layout_.workers.size())
                                              : parts[w];
        const double bytes = tied * grad_bytes_per_param * share;
        if (first == holder) continue;
        const std::vector<int> devices{first, holder};
        const std::vector<int> grads{grad_of(first, 0), grad_of(holder, static_cast<int>(k))};
        Task like = base_task(TaskKind::collective, first, static_cast<int>(w), -1, -1);
        like.layer_begin = 0;
        like.layer_end = 1;
        const auto tasks = add_collective(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                          "embedding w" + std::to_string(w) + " t" + std::to_string(j), devices,
                                          bytes, Purpose::embedding, comm, like, grads, grads);
        for (size_t i = 0; i < devices.size(); ++i) {
          auto& syncs = syncs_of_device[devices[i]];
          // Its gradients are complete after the device's last compute. Without overlap the
          // data-parallel syncs before it on the comm stream waited for that already.
          if (syncs.empty() || layout_.sync.overlap_grad_reduce) plan_.add_order(last.at(devices[i]), tasks[i]);
          syncs.push_back(tasks[i]);
        }
      }
    }
  }
}

// The optimizer step: after the device's last gradient and all its synchronisation. Adam:
// ~12 FLOPs per parameter; reads and writes weights, gradients, master copy and two
// moments: memory bound on every GPU.
std::vector<std::vector<int>> gradient_norm_workers(const Layout& layout, int zero_stage, size_t workers) {
  const bool everyone = zero_stage > 0 && !layout.folded;
  const int ep = layout.experts.parallel, context = std::max(1, layout.size(Axis::context));
  const bool groups = !everyone && ep > 1 && !layout.folded;
  const auto all = static_cast<int>(layout.workers.size());
  std::vector<std::vector<int>> out;
  for (int w = 0; w < static_cast<int>(workers) && !(everyone && w > 0); ++w) {
    if (everyone) {
      std::vector<int>& members = out.emplace_back();
      for (int v = 0; v < all; ++v) members.push_back(v);
    } else if (groups) {
      if (expert_rank(w, context, ep) == 0) out.push_back(expert_group(w, all / context, context, ep));  // (its first worker's)
    } else {
      out.push_back({w});
    }
  }
  return out;
}

std::map<int, int> Builder::add_optimizers(const std::map<int, std::vector<int>>& syncs_of_device) {
  const std::map<int, int> last = last_compute_of_devices();
  // Megatron's gradient clipping (clips_gradient_norm): each device's sum of squares,
  // all-reduced (one fp32, a tree: a latency) over its virtual worker's devices once their
  // gradients are synchronised; every optimizer of the worker waits for it. A worker of one
  // device needs none. Under ZeRO a worker's replicas each hold a shard of its gradients: one
  // all-reduce over every worker's devices (Megatron's distributed optimizer), except folded,
  // where worker 0's stands for it (a latency: the tree is a level or two shallower). Under
  // expert parallelism the norm spans an expert group's workers, which hold the group's experts
  // between them (Megatron's norm over the expert-parallel group), one all-reduce a group.
  // Each device's part is a read of the gradients its optimizer steps (Megatron's
  // multi_tensor_l2norm, exec/training_optimizer.cpp's local_sum_squares): the memory traffic
  // of its all-reduce task, before the message, or where it has none, of its optimizer step.
  std::map<int, int> norm_of_device, optimizer_of;
  const bool everyone = zero_stage() > 0 && !plan_.layout.folded;
  const bool clips = clips_gradient_norm(net_, layout_);
  const size_t built = !clips ? 0 : plan_.layout.folded ? built_workers() : layout_.workers.size();
  // Under ZeRO its replica's shard alone (shard_params_ is the whole otherwise, summed alike).
  const auto stepped_params = [&](int device) {
    return zero_stage() > 0 ? shard_params_[static_cast<size_t>(device)] : device_params(device);
  };
  const double gradient_bytes = layout_.gradient_element_bytes();
  for (const std::vector<int>& members : gradient_norm_workers(layout_, zero_stage(), built)) {
    const int w = members.front();
    std::vector<int> devices;
    for (const int v : members) {
      for (const auto& rank : layout_.workers[static_cast<size_t>(v)].ranks) {
        for (const int d : rank) {
          if (last.count(d)) devices.push_back(d);
        }
      }
    }
    if (devices.size() < 2) continue;
    const Task like = base_task(TaskKind::collective, devices[0], w, -1, -1);
    const auto tasks = add_collective(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                      everyone ? std::string("norm") : "norm w" + std::to_string(w), devices, 4,
                                      Purpose::gradient_norm, compute_stream_, like, {}, {});
    for (size_t i = 0; i < tasks.size(); ++i) {
      norm_of_device[devices[i]] = tasks[i];
      plan_.task(tasks[i]).memory_bytes = stepped_params(devices[i]) * gradient_bytes;
      plan_.task(tasks[i]).worker = plan_.task(last.at(devices[i])).worker;
      plan_.add_order(last.at(devices[i]), tasks[i]);
      const auto syncs = syncs_of_device.find(devices[i]);
      if (syncs != syncs_of_device.end() && !syncs->second.empty()) plan_.add_order(syncs->second.back(), tasks[i]);
    }
  }
  for (const auto& [device, last_task] : last) {
    const int w = plan_.task(last_task).worker;
    const double params = stepped_params(device);
    // The norm's read where no all-reduce task carries it (a worker of one device).
    const double norm_bytes = clips && !norm_of_device.count(device) ? params * gradient_bytes : 0;
    // The step's first task and the one after which the device's weights are updated.
    int first = -1, done = -1;
    if (layout_.offload.optimizer) {
      std::tie(first, done) = add_offloaded_step(device, w, params);
      plan_.task(plan_.program(device, stream("host")).back()).memory_bytes += norm_bytes;  // (its host step's)
    } else {
      Task opt = base_task(TaskKind::optimizer, device, w, -1, -1);
      opt.flops = kAdamFlopsPerParam * params;
      opt.memory_bytes = adam_bytes_per_param(layout_.kernels) * params + norm_bytes;
      const auto d = static_cast<size_t>(device);
      const int state = tensor(TensorKind::optimizer_state, device, params * model::adam_state_bytes(layout_.precision),
                               {static_cast<std::int64_t>(params)}, model::Precision::fp32);
      std::vector<int> reads = grads_[d], writes = weights_[d];
      reads.push_back(state);
      writes.push_back(state);
      first = done = plan_.add_task(opt, reads, writes);
    }
    optimizer_of[device] = done;
    plan_.add_order(last_task, first);
    // Its syncs run in order on the comm stream: waiting for the last waits for them all.
    const auto syncs = syncs_of_device.find(device);
    if (syncs != syncs_of_device.end() && !syncs->second.empty()) plan_.add_order(syncs->second.back(), first);
    if (const auto norm = norm_of_device.find(device); norm != norm_of_device.end()) plan_.add_order(norm->second, first);
  }
  return optimizer_of;
}

// Parameters on a device: its chunks' layers, split over the tensor-parallel group.
double Builder::device_params(int device) const {
  double params = 0;
  for (const int id : weights_[static_cast<size_t>(device)]) {
    params += static_cast<double>(plan_.tensor(id).shape.front());
  }
  return params;
}

void Builder::add_parameter_server_sync() {
  const std::vector<int>& server_of = layout_.sync.layer_server;
  if (server_of.size() != net_.layers.size()) {
    throw InputError("<layout>", 0, "sync.layer_server", "expected one server device per layer");
  }
  for (int s : server_of) {
    if (s < 0 || s >= cluster_.device_count()) {
      throw InputError("<layout>", 0, "sync.layer_server", "server device " + std::to_string(s) + " does not exist");
    }
  }
  const double e = model::element_bytes(layout_.precision);
  const std::map<int, int> last = last_compute_of_devices();
  std::map<int, std::vector<int>> pushes_to_server, buffers_of_server;  // server -> recv/local tasks, tensors
  struct Pull {
    int server, device, w, stage, j;
    double bytes;
  };
  std::vector<Pull> pulls;
  for (size_t w = 0; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      // This chunk's layers, grouped by the server that hosts them. Each layer adds what it
      // adds to the chunk's parameters, so a tied embedding held once by a chunk that has both
      // ends of the network is pushed once (the pushes add up to the chunk's gradients); under
      // expert parallelism a MoE layer adds its dense part and its expert rank's experts.
      const int t = vw.tensor_of(k);
      const int held = expert_share(experts_, layout_, static_cast<int>(w)).held;
      for (int j = 0; j < t; ++j) {
        std::map<int, double> params_per_server;  // rank j's shard of them (shard.hpp)
        for (int l = s.layer_begin; l < s.layer_end; ++l) {
          params_per_server[server_of[static_cast<size_t>(l)]] +=
              layer_part_params(net_, l, s.layer_begin, SplitPart::rank(j, t)) -
              expert_params_elsewhere(net_, l, l + 1, held, t);
        }
        const int device = device_of(static_cast<int>(w), static_cast<int>(k), j);
        for (const auto& [server, params] : params_per_server) {
          if (params <= 0) continue;
          const int producer = last.at(device);
          if (server == device) {
            pushes_to_server[server].push_back(producer);
          } else {
            const Task like = base_task(TaskKind::send, device, static_cast<int>(w), static_cast<int>(k), -1);
            const int buffer = tensor(TensorKind::pushed_grad, server, params * e, {static_cast<std::int64_t>(params)},
                                      layout_.precision);
            const auto [send, recv] = add_transfer(device, server, "push", params * e, Purpose::ps_push, like,
                                                   grad_of(device, static_cast<int>(k)), buffer);
            plan_.add_order(producer, send);  // the gradient buffer is complete
            pushes_to_server[server].push_back(recv);
            buffers_of_server[server].push_back(buffer);
          }
          pulls.push_back({server, device, static_cast<int>(w), static_cast<int>(k), j, params * e});
        }
      }
    }
  }
  // One update per server and iteration, on its own stream so it overlaps the server's
  // pipeline work; then the pulls back to every worker device.
  const int ps_stream = stream("ps");
  std::map<int, std::pair<int, int>> update_of;  // server -> (update task, its state tensor)
  for (const auto& [server, inputs] : pushes_to_server) {
    Task u = base_task(TaskKind::optimizer, server, -1, -1, -1);
    u.stream = ps_stream;
    double params = 0;
    for (size_t l = 0; l < server_of.size(); ++l) {
      if (server_of[l] == server) params += params_per_device(net_, static_cast<int>(l), static_cast<int>(l) + 1, 1);
    }
    u.flops = kAdamFlopsPerParam * params;
    u.memory_bytes = adam_bytes_per_param(layout_.kernels) * params;
    const int state = tensor(TensorKind::optimizer_state, server, params * model::adam_state_bytes(layout_.precision),
                             {static_cast<std::int64_t>(params)}, model::Precision::fp32);
    std::vector<int> reads = buffers_of_server[server];
    reads.push_back(state);
    const int id = plan_.add_task(u, reads, std::vector<int>{state});
    for (int in : inputs) {
      if (plan_.task(in).kind != TaskKind::recv) plan_.add_order(in, id);
    }
    for (int b : buffers_of_server[server]) set_free_after(b, id);
    update_of[server] = {id, state};
  }
  for (const Pull& p : pulls) {
    const auto [update, state] = update_of.at(p.server);
    int arrived = update;
    if (p.server != p.device) {
      const Task like = base_task(TaskKind::recv, p.server, p.w, p.stage, -1);
      const auto [send, recv] = add_transfer(p.server, p.device, "pull", p.bytes, Purpose::ps_pull, like, state,
                                             weight_of(p.device, p.stage));
      plan_.add_order(update, send);  // the server's weights are updated
      // ... and are not overwritten by the next update while they are being sent.
      plan_.add_order(send, update, 1);
      arrived = recv;
    }
    // Wave-synchronous parallel: iteration i + D + 1 of this chunk needs these weights.
    plan_.add_order(arrived, op(p.w, p.stage, 0, OpKind::F, p.j).task, layout_.sync.staleness + 1);
  }
}

}  // namespace hetflow::partition::builder
