#include "partition/layout_estimate_zero.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "partition/link_sharing.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"
#include "partition/shard.hpp"

namespace hetflow::partition::estimate_detail {

ZeroSync::ZeroSync(const model::Network& network, const Layout& layout, const CostModel& cost, WorkMemo& memo,
                   bool shared)
    : network_(network), layout_(layout), stage_(builder::zero_stage(layout)) {
  builder::check_zero(layout);
  if (stage_ == 0) return;
  pass_gathers_.reshard = layout.sync.zero.reshard_after_forward;
  const VirtualWorker& first = layout.workers.front();
  const double e = model::element_bytes(layout.precision), g = layout.gradient_element_bytes();
  const size_t workers = layout.workers.size();
  // Under expert parallelism the pieces the builder reduce-scatters and gathers.
  const std::vector<builder::Segment> segments =
      layout.experts.parallel > 1 ? builder::data_parallel_segments(network, layout) : std::vector<builder::Segment>{};
  for (size_t k = 0; k < first.stages.size(); ++k) {
    const Stage& s = first.stages[k];
    const int t = first.tensor_of(k);
    const std::vector<double>& params = memo.of(s, t, 0).params;
    // The chunk's pieces run at once (every tensor rank's ring over the replicas).
    SharedPhase gathers(cost, shared), scatters(cost, shared);
    std::vector<std::vector<Piece>>& chunk = pieces_.emplace_back(static_cast<size_t>(t));
    std::vector<std::vector<std::pair<int, int>>> items(static_cast<size_t>(t));  // (gather, scatter) per piece
    for (size_t j = 0; j < static_cast<size_t>(t); ++j) {
      // (members, gradient bytes, the stage-1 gathers' buckets)
      std::vector<std::tuple<std::vector<int>, double, int>> cut;
      for (const builder::Segment& seg : segments) {
        if (seg.begin != s.layer_begin || seg.end != s.layer_end) continue;
        for (const builder::Segment::Piece& piece : seg.pieces) {
          if (piece.rank_of_worker.front() != static_cast<int>(j)) continue;
          cut.emplace_back(builder::piece_workers(piece, workers), piece.bytes, piece.buckets);
        }
      }
      if (cut.empty()) {
        // Stage 1 gathers back each bucket its reduce-scatters scattered, counted in gradient
        // bytes (Builder::add_zero_gathers): as many collectives, one after another.
        const int buckets = std::max(1, static_cast<int>(std::ceil(params[j] * g / layout.sync.bucket_bytes)));
        cut.emplace_back(builder::piece_workers({}, workers), params[j] * g, buckets);
      }
      for (const auto& [members, grad_bytes, buckets] : cut) {
        Piece& piece = chunk[j].emplace_back();
        CollectiveSpec c;
        c.algorithm = builder::zero_algorithm(layout);
        for (const int w : members) {
          piece.workers.push_back(static_cast<size_t>(w));
          c.devices.push_back(device_of(static_cast<size_t>(w), k, j));
        }
        c.parts = builder::zero_parts(layout, cost.cluster(), c.devices);  // (shares by memory)
        if (members.size() == workers) parts_[{s.layer_begin, j}] = c.parts;
        c.kind = CollectiveKind::all_gather;
        c.bytes = grad_bytes / g * e;
        c.messages = stage_ == 1 ? buckets : builder::zero_messages(network, layout, s.layer_begin, s.layer_end, c.bytes);
        const int gather = c.bytes > 0 && c.devices.size() > 1 ? gathers.add(c) : -1;
        c.kind = CollectiveKind::reduce_scatter;
        c.bytes = grad_bytes;
        c.messages = builder::zero_messages(network, layout, s.layer_begin, s.layer_end, c.bytes);
        items[j].emplace_back(gather, c.bytes > 0 && c.devices.size() > 1 ? scatters.add(c) : -1);
      }
    }
    const std::vector<double> gather_s = gathers.times_s(), scatter_s = scatters.times_s();
    std::vector<double>& to_gather = pass_gathers_.gather_s.emplace_back(static_cast<size_t>(t), 0.0);
    for (size_t j = 0; j < static_cast<size_t>(t); ++j) {
      for (size_t i = 0; i < chunk[j].size(); ++i) {
        const auto [gather, scatter] = items[j][i];
        if (gather >= 0) chunk[j][i].gather_s = gather_s[static_cast<size_t>(gather)];
        if (scatter >= 0) chunk[j][i].scatter_s = scatter_s[static_cast<size_t>(scatter)];
      }
      // Stage 3's passes wait for their pieces' gathers, one after another on the gather stream
      // (Builder::pass_params): the dense part's, and under expert parallelism their own expert
      // rank's (the slowest rank's: the estimate times every worker's passes alike).
      double experts = 0;
      for (const Piece& piece : chunk[j]) {
        if (piece.workers.size() == workers) {
          to_gather[j] += piece.gather_s;
        } else {
          experts = std::max(experts, piece.gather_s);
        }
      }
      to_gather[j] += experts;
    }
  }
}

int ZeroSync::device_of(size_t w, size_t k, size_t j) const {
  const VirtualWorker& vw = layout_.workers[w];
  return vw.ranks[static_cast<size_t>(vw.stages[k].rank)][j];
}

double ZeroSync::optimizer_params(const Stage& s, const WorkMemo::Entry& chunk, size_t j, int w) const {
  if (stage_ == 0) return chunk.params[j];
  const auto parts = parts_.find({s.layer_begin, j});
  return builder::zero_own(layout_, chunk.params[j], chunk.experts[j], w,
                           parts == parts_.end() ? std::vector<double>{} : parts->second);
}

double ZeroSync::tied_share(size_t w, int j) const {
  if (stage_ < 2) return 1;
  const auto parts = parts_.find({layout_.workers.front().stages.front().layer_begin, static_cast<size_t>(j)});
  if (parts == parts_.end() || parts->second.empty()) return 1 / static_cast<double>(layout_.workers.size());
  return parts->second[w];
}

void ZeroSync::sharded_memory(WorkMemo& memo, int w, const std::vector<Stage>& chunks, int t, int j,
                              const Stashes& stashes, DeviceMemory& m) const {
  if (stage_ == 0) return;
  const double e = model::element_bytes(layout_.precision), g = layout_.gradient_element_bytes();
  const bool kept = stage_ >= 3 && !layout_.sync.zero.reshard_after_forward;
  double weights = 0, grads = 0, stepped = 0;
  std::vector<double> weight_unit, grad_unit;  // per chunk: the whole copies one pass holds (Builder::unit_params)
  for (const Stage& s : chunks) {
    const WorkMemo::Entry& entry = memo.of(s, t, w);
    const double whole = entry.params[static_cast<size_t>(j)], own = optimizer_params(s, entry, static_cast<size_t>(j), w);
    weights += stage_ >= 3 ? own : whole;
    grads += stage_ >= 2 ? own : whole;
    stepped += own;
    double unit = whole;
    if (stage_ == 2) unit = std::min(whole, layout_.sync.bucket_bytes / g);
    if (stage_ >= 3 && !kept) {
      double layer = 0;
      for (int l = s.layer_begin; l < s.layer_end; ++l) {
        layer = std::max(layer, layer_part_params(network_, l, s.layer_begin, SplitPart::rank(j, t)));
      }
      // Under expert parallelism each piece holds its share of the largest layer (Builder::pass_params).
      const double full = part_params(network_, s.layer_begin, s.layer_end, SplitPart::rank(j, t));
      unit = whole == full ? std::min(unit, layer) : whole * std::min(1.0, layer / std::max(1.0, full));
    }
    weight_unit.push_back(stage_ >= 3 ? unit * e : 0);
    grad_unit.push_back(stage_ >= 2 ? unit * g : 0);
  }
  m.weights_bytes = weights * e;
  m.gradients_bytes = grads * g;
  if (m.optimizer_bytes > 0) m.optimizer_bytes = stepped * model::adam_state_bytes(layout_.precision);
  if (layout_.offload.optimizer) m.host_bytes = stepped * offload_host_bytes_per_param(layout_);
  m.gathered_bytes = 0;
  if (stage_ < 2 || stashes.program == nullptr) return;
  // Kept gathered: each chunk's copy from its first pass to its last, its gradients from the
  // first pass that makes them to the last.
  const std::vector<ScheduledOp>& program = *stashes.program;
  const OpKind makes = stashes.splits_backward ? OpKind::W : OpKind::B;
  const size_t n = chunks.size();
  std::vector<size_t> first_pass(n, program.size()), last_pass(n, 0), first_made(n, program.size()), last_made(n, 0);
  for (size_t i = 0; i < program.size(); ++i) {
    const auto c = static_cast<size_t>(program[i].chunk);
    if (program[i].kind != OpKind::W) {
      first_pass[c] = std::min(first_pass[c], i);
      last_pass[c] = i;
    }
    if (program[i].kind == makes) {
      first_made[c] = std::min(first_made[c], i);
      last_made[c] = i;
    }
  }
  double held = 0, peak = -1;
  for (size_t i = 0; i < program.size(); ++i) {
    const ScheduledOp& op = program[i];
    const auto c = static_cast<size_t>(op.chunk);
    const double stash = (*stashes.stash_bytes)[c];
    if (op.kind == OpKind::F) held += stash;
    const double during = held + (op.kind == OpKind::B ? stashes.scratch_bytes : 0);
    double whole = 0;
    if (kept) {
      for (size_t k = 0; k < n; ++k) {
        if (first_pass[k] <= i && i <= last_pass[k]) whole += weight_unit[k];
        if (first_made[k] <= i && i <= last_made[k]) whole += grad_unit[k];
      }
    } else {
      if (op.kind != OpKind::W) whole += weight_unit[c];
      if (op.kind == makes) whole += grad_unit[c];
    }
    if (during + whole > peak) {
      peak = during + whole;
      m.activations_bytes = during;
      m.gathered_bytes = whole;
    }
    if ((op.kind == OpKind::B) != stashes.splits_backward && op.kind != OpKind::F) held -= stash;
  }
}

void ZeroSync::reduce_scatter(const std::vector<WorkerRun>& runs, const RankPrograms& programs,
                              std::vector<double>& comm_free) const {
  if (stage_ < 2) return;
  const bool once = stage_ == 3 && !layout_.sync.zero.reshard_after_forward;
  const VirtualWorker& first = layout_.workers.front();
  const auto p = static_cast<int>(programs.size());
  const auto m = static_cast<size_t>(first.microbatches);
  bool split = false;  // the pass that makes the gradients: W where backward is split, else B
  for (const auto& program : programs) {
    for (const ScheduledOp& op : program) split = split || op.kind == OpKind::W;
  }
  const OpKind makes = split ? OpKind::W : OpKind::B;
  for (int r = 0; r < p; ++r) {
    const auto& program = programs[static_cast<size_t>(r)];
    std::map<int, int> last_mb;  // per chunk: the micro-batch whose pass makes its gradients last
    for (const ScheduledOp& op : program) {
      if (op.kind == makes) last_mb[op.chunk * p + r] = op.microbatch;
    }
    for (const ScheduledOp& op : program) {
      const int k = op.chunk * p + r;
      if (op.kind != makes || (once && op.microbatch != last_mb[k])) continue;
      const auto kk = static_cast<size_t>(k);
      for (size_t j = 0; j < pieces_[kk].size(); ++j) {
        for (const Piece& piece : pieces_[kk][j]) {
          // Once every member's pass has made its gradients (kept gathered, its last pass: the
          // chunk's passes run in order on the device) and its comm stream is free.
          double start = 0;
          for (const size_t w : piece.workers) {
            const auto d = static_cast<size_t>(device_of(w, kk, j));
            start = std::max({start, comm_free[d], runs[w].made_end[kk * m + static_cast<size_t>(op.microbatch)]});
          }
          for (const size_t w : piece.workers) comm_free[static_cast<size_t>(device_of(w, kk, j))] = start + piece.scatter_s;
        }
      }
    }
  }
}

void ZeroSync::gather_after_optimizers(std::vector<double>& stream_free, std::vector<double>& comm_free,
                                       double& makespan) const {
  if (stage_ < 1 || stage_ > 2) return;
  std::map<int, double> last;  // per device: its last all-gather's end
  const size_t chunks = layout_.workers.front().stages.size();
  for (size_t k = chunks; k-- > 0;) {  // as the gradients came
    for (size_t j = 0; j < pieces_[k].size(); ++j) {
      for (const Piece& piece : pieces_[k][j]) {
        double start = 0;
        for (const size_t w : piece.workers) {
          const auto d = static_cast<size_t>(device_of(w, k, j));
          start = std::max({start, comm_free[d], stream_free[d]});  // stream_free: its optimizer's end
        }
        const double end = start + piece.gather_s;
        for (const size_t w : piece.workers) {
          const int d = device_of(w, k, j);
          comm_free[static_cast<size_t>(d)] = end;
          last[d] = end;
        }
        makespan = std::max(makespan, end);
      }
    }
  }
  for (const auto& [d, end] : last) stream_free[static_cast<size_t>(d)] = std::max(stream_free[static_cast<size_t>(d)], end);
}

}  // namespace hetflow::partition::estimate_detail
