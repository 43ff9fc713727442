// One run of a virtual worker's pipeline for estimate_layout (partition/layout_estimate_detail.hpp).
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "model/error.hpp"
#include "partition/layout_estimate_detail.hpp"

namespace hetflow::partition::estimate_detail {

namespace {

constexpr double kNotYet = -1;

// A rank's ZeRO-3 all-gathers in gather-stream order (the order of their first readers in its
// program, as the builder makes them): the chunk each brings and its first reader's place in
// the program; per operation, the gather it reads (-1: none, a W).
struct GatherOrder {
  std::vector<size_t> chunk, first_reader;
  std::vector<int> read_by;
};

GatherOrder gather_order(const std::vector<ScheduledOp>& program, int p, int r, bool reshard) {
  GatherOrder out;
  std::map<std::tuple<size_t, int, int>, int> index;  // (chunk, micro-batch, pass); (chunk, -1, -1) kept gathered
  for (size_t i = 0; i < program.size(); ++i) {
    const ScheduledOp& op = program[i];
    if (op.kind == OpKind::W) {
      out.read_by.push_back(-1);
      continue;
    }
    const auto k = static_cast<size_t>(op.chunk * p + r);
    const auto key = reshard ? std::make_tuple(k, op.microbatch, static_cast<int>(op.kind)) : std::make_tuple(k, -1, -1);
    const auto [at, added] = index.try_emplace(key, static_cast<int>(out.chunk.size()));
    if (added) {
      out.chunk.push_back(k);
      out.first_reader.push_back(i);
    }
    out.read_by.push_back(at->second);
  }
  return out;
}

class Gathers;

// One worker's pipeline, placed operation by operation as its inputs (and gathers) come.
class PipelineRun {
 public:
  PipelineRun(const Layout& layout, const PipelineInput& in, bool gathers);
  // Places what it can of rank r's program; whether it placed anything.
  bool advance(int r, Gathers* gathers);
  bool done() const { return left_ == 0; }
  WorkerRun finish();

  // What the gathers wait for: where operation i of rank r started and ended (kNotYet
  // before), its collectives before the compute, and the device's stream at the start.
  double start_of(int r, size_t i) const { return start_of_[static_cast<size_t>(r)][i]; }
  double end_of(int r, size_t i) const { return end_of_[static_cast<size_t>(r)][i]; }
  double before_of(int r, size_t i) const;
  const PipelineStart& from() const { return in_.from; }

 private:
  const Layout& layout_;
  const PipelineInput& in_;
  const std::vector<Chunk>& chunks_;
  const RankPrograms& programs_;
  int p_;
  size_t count_, mbs_;
  std::vector<double> end_f_, end_b_, input_at_, grad_at_;
  std::vector<double> channel_free_;  // per sending rank and direction
  std::vector<double> rank_free_;
  WorkerRun run_;
  std::vector<std::vector<double>> compute_s_;  // the bubble's busy time
  std::vector<int> last_b_;                     // per chunk: the micro-batch of its last B, which sums the gains
  bool splits_backward_ = false;                // W ops make the gradients, not B
  std::vector<size_t> next_;
  double span_begin_ = std::numeric_limits<double>::infinity(), span_end_ = 0;
  std::vector<bool> started_;  // per rank: its first operation placed
  size_t left_ = 0;
  std::vector<std::vector<double>> start_of_, end_of_;  // per rank and operation, with gathers
  // Activation offload (Builder::offload_stash, prefetch_stash): per chunk and micro-batch
  // whether its stash leaves and when it is in host memory; per rank its copy streams and the
  // ends of the last two tasks on its compute stream (gathers, then passes) this iteration.
  std::vector<char> offloaded_;
  std::vector<double> host_ready_;
  std::vector<double> to_host_free_, to_device_free_;
  struct LastTwo {  // the ends of the last two tasks on a rank's compute stream
    double previous = 0, last = 0;
    int count = 0;
    void push(double end) {
      previous = last;
      last = end;
      ++count;
    }
  };
  std::vector<LastTwo> compute_ends_;
};

// ZeRO-3's gathers of a group of workers run together: each gather's end per tensor rank,
// computed once every worker's replica is ready for it (ZeroGathers).
class Gathers {
 public:
  Gathers(const ZeroGathers& z, const RankPrograms& programs, std::vector<PipelineRun>& runs) : z_(z), runs_(runs) {
    const int p = static_cast<int>(programs.size());
    for (int r = 0; r < p; ++r) orders_.push_back(gather_order(programs[static_cast<size_t>(r)], p, r, z.reshard));
    end_.resize(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) end_[static_cast<size_t>(r)].resize(orders_[static_cast<size_t>(r)].chunk.size());
  }
  int read_by(int r, size_t i) const { return orders_[static_cast<size_t>(r)].read_by[i]; }
  // Gather g of rank r's end per tensor rank, or nullptr while some replica is not ready for it.
  const std::vector<double>* end(int r, int g) {
    std::vector<double>& out = end_[static_cast<size_t>(r)][static_cast<size_t>(g)];
    if (!out.empty()) return &out;
    const GatherOrder& order = orders_[static_cast<size_t>(r)];
    const std::vector<double>& time = z_.gather_s[order.chunk[static_cast<size_t>(g)]];
    std::vector<double> ready(time.size(), 0);
    if (g > 0) {
      const std::vector<double>& previous = end_[static_cast<size_t>(r)][static_cast<size_t>(g) - 1];
      if (previous.empty()) return nullptr;  // gathers are asked for in their stream's order
      ready = previous;
    }
    for (const PipelineRun& run : runs_) {
      double at = 0;
      if (g == 0) {  // the device's last optimizer, where an iteration came before
        const auto& free = run.from().device_free;
        for (size_t j = 0; r < static_cast<int>(free.size()) && j < ready.size(); ++j) {
          ready[j] = std::max(ready[j], free[static_cast<size_t>(r)][j]);
        }
        continue;
      }
      // Prefetched one ahead: after the compute-stream task before the previous gather's first
      // reader, which is the reader's own input all-gather where it has one.
      const size_t i = order.first_reader[static_cast<size_t>(g) - 1];
      if (run.before_of(r, i) > 0) {
        if (run.start_of(r, i) == kNotYet) return nullptr;
        at = run.start_of(r, i) + run.before_of(r, i);
      } else {
        if (i == 0) continue;  // the first task of the iteration's compute stream
        if (run.end_of(r, i - 1) == kNotYet) return nullptr;
        at = run.end_of(r, i - 1);
      }
      for (double& x : ready) x = std::max(x, at);
    }
    out.resize(time.size());
    for (size_t j = 0; j < time.size(); ++j) out[j] = ready[j] + time[j];
    return &out;
  }

 private:
  const ZeroGathers& z_;
  std::vector<PipelineRun>& runs_;
  std::vector<GatherOrder> orders_;
  std::vector<std::vector<std::vector<double>>> end_;  // per rank, gather and tensor rank
};

PipelineRun::PipelineRun(const Layout& layout, const PipelineInput& in, bool gathers)
    : layout_(layout),
      in_(in),
      chunks_(*in.chunks),
      programs_(*in.programs),
      p_(static_cast<int>(in.programs->size())),
      count_(in.chunks->size()),
      mbs_(static_cast<size_t>(in.microbatches)),
      end_f_(count_ * mbs_, kNotYet),
      end_b_(count_ * mbs_, kNotYet),
      input_at_(count_ * mbs_, kNotYet),
      grad_at_(count_ * mbs_, kNotYet),
      channel_free_(in.from.channel_free),
      rank_free_(in.from.rank_free) {
  channel_free_.resize(static_cast<size_t>(p_) * 2, 0);
  rank_free_.resize(static_cast<size_t>(p_), 0);
  run_.busy.resize(static_cast<size_t>(p_));
  run_.made_start.resize(count_);
  run_.made_s.resize(count_);
  run_.made_end.assign(count_ * mbs_, kNotYet);
  compute_s_.resize(static_cast<size_t>(p_));
  for (int r = 0; r < p_; ++r) {
    const size_t t = chunks_[static_cast<size_t>(r)].devices->size();
    run_.busy[static_cast<size_t>(r)].assign(t, 0);
    compute_s_[static_cast<size_t>(r)].assign(t, 0);
  }
  last_b_.assign(count_, -1);
  for (int r = 0; r < p_; ++r) {
    for (const ScheduledOp& op : programs_[static_cast<size_t>(r)]) {
      if (op.kind == OpKind::B) last_b_[static_cast<size_t>(op.chunk * p_ + r)] = op.microbatch;
      splits_backward_ = splits_backward_ || op.kind == OpKind::W;
    }
  }
  if (layout.offload.activations) {
    offloaded_.assign(count_ * mbs_, 0);
    host_ready_.assign(count_ * mbs_, kNotYet);
    for (int r = 0; r < p_; ++r) {
      const auto& program = programs_[static_cast<size_t>(r)];
      for (size_t i = 0; i < program.size(); ++i) {
        const ScheduledOp& op = program[i];
        const size_t k = static_cast<size_t>(op.chunk * p_ + r);
        if (op.kind != OpKind::F || k >= count_ || !(chunks_[k].stash_copy_s > 0)) continue;
        offloaded_[k * mbs_ + static_cast<size_t>(op.microbatch)] = stash_leaves(program, i);
      }
    }
    to_host_free_ = in.from.to_host_free;
    to_device_free_ = in.from.to_device_free;
    to_host_free_.resize(static_cast<size_t>(p_), 0);
    to_device_free_.resize(static_cast<size_t>(p_), 0);
    compute_ends_.resize(static_cast<size_t>(p_));
  }
  next_.assign(static_cast<size_t>(p_), 0);
  started_.assign(static_cast<size_t>(p_), false);
  for (const auto& program : programs_) {
    left_ += program.size();
    if (gathers) {
      start_of_.emplace_back(program.size(), kNotYet);
      end_of_.emplace_back(program.size(), kNotYet);
    }
  }
}

double PipelineRun::before_of(int r, size_t i) const {
  const ScheduledOp& op = programs_[static_cast<size_t>(r)][i];
  const Chunk& c = chunks_[static_cast<size_t>(op.chunk * p_ + r)];
  return op.kind == OpKind::F ? c.f_before_s : op.kind == OpKind::B ? c.b_before_s : 0;
}

bool PipelineRun::advance(int r, Gathers* gathers) {
  const auto& program = programs_[static_cast<size_t>(r)];
  bool moved = false;
  size_t& i = next_[static_cast<size_t>(r)];
  for (; i < program.size(); ++i) {
    const ScheduledOp& op = program[i];
    const size_t k = static_cast<size_t>(op.chunk * p_ + r);
    const size_t at = k * mbs_ + static_cast<size_t>(op.microbatch);
    if (k >= count_) throw PlanError("estimate_layout: the schedule names chunk " + std::to_string(k) + " of " + std::to_string(count_));
    double ready = 0, compute_ready = 0;  // the latter: the compute's own wait, after any gathers
    if (op.kind == OpKind::F) {
      ready = k == 0 ? 0 : input_at_[at];
      if (op.microbatch == 0 && k < in_.from.first_forward.size()) compute_ready = in_.from.first_forward[k];
    } else if (op.kind == OpKind::B) {
      ready = k + 1 == count_ ? end_f_[at] : grad_at_[at];
    } else {
      ready = end_b_[at];
    }
    if (ready < 0) break;  // waits for another rank
    const Chunk& c = chunks_[k];
    const double start = std::max(rank_free_[static_cast<size_t>(r)], ready);
    if (gathers != nullptr) {
      start_of_[static_cast<size_t>(r)][i] = start;
      const int g = gathers->read_by(r, i);
      if (g >= 0) {
        const std::vector<double>* gathered = gathers->end(r, g);
        if (gathered == nullptr) break;  // waits for a replica
        compute_ready = std::max(compute_ready, largest(*gathered));
      }
    }
    const auto& compute = op.kind == OpKind::F ? c.f_compute_s : op.kind == OpKind::B ? c.b_compute_s : c.w_compute_s;
    const double before = op.kind == OpKind::F ? c.f_before_s : op.kind == OpKind::B ? c.b_before_s : 0;
    if (!offloaded_.empty() && op.kind == OpKind::B && offloaded_[at]) {
      // The stash back (Builder::prefetch_stash) once it is out, after the copy before it on
      // the stream, and once the compute-stream task two before this pass's compute ends:
      // with a gather of its own, the previous pass; else the one before that (its gather,
      // or the pass before it). The compute waits for it.
      if (host_ready_[at] < 0) throw PlanError("estimate_layout: a backward before its forward on rank " + std::to_string(r));
      const LastTwo& ends = compute_ends_[static_cast<size_t>(r)];
      const double after_task = before > 0 ? ends.last : ends.count >= 2 ? ends.previous : 0;
      double& free = to_device_free_[static_cast<size_t>(r)];
      free = std::max({free, host_ready_[at], after_task}) + c.stash_copy_s;
      compute_ready = std::max(compute_ready, free);
    }
    double after = op.kind == OpKind::F ? c.f_after_s : op.kind == OpKind::B ? c.b_after_s : 0;
    if (op.kind == OpKind::B && op.microbatch == last_b_[k]) after += c.last_b_after_s;
    // The gathers run as soon as the input is there; the compute waits for its weights too.
    const double compute_start = std::max(start + before, compute_ready);
    const double end = compute_start + largest(compute) + after;
    rank_free_[static_cast<size_t>(r)] = end;
    if (!offloaded_.empty()) {
      LastTwo& ends = compute_ends_[static_cast<size_t>(r)];
      if (before > 0) ends.push(start + before);
      ends.push(end);
      if (op.kind == OpKind::F && offloaded_[at]) {  // its stash out at once (Builder::offload_stash)
        double& free = to_host_free_[static_cast<size_t>(r)];
        free = std::max(free, end) + c.stash_copy_s;
        host_ready_[at] = free;
      }
    }
    if (gathers != nullptr) end_of_[static_cast<size_t>(r)][i] = end;
    span_begin_ = std::min(span_begin_, compute_start);
    if (!started_[static_cast<size_t>(r)] && before == 0 && static_cast<size_t>(r) < in_.from.device_free.size()) {
      for (const double free : in_.from.device_free[static_cast<size_t>(r)]) {
        span_begin_ = std::min(span_begin_, std::max({free, ready, compute_ready}));
      }
    }
    started_[static_cast<size_t>(r)] = true;
    for (size_t j = 0; j < c.devices->size(); ++j) {
      run_.busy[static_cast<size_t>(r)][j] += before + compute[j] + after;
      compute_s_[static_cast<size_t>(r)][j] += compute[j];
      span_end_ = std::max(span_end_, compute_start + compute[j]);
    }
    const auto send = [&](int dir, double transfer_s, size_t to, std::vector<double>& arrived) {
      double& free = channel_free_[static_cast<size_t>(r) * 2 + static_cast<size_t>(dir)];
      if (transfer_s <= 0) {
        arrived[to] = end;
        return;
      }
      free = std::max(free, end) + transfer_s;
      arrived[to] = free;
    };
    if (op.kind == OpKind::F) {
      end_f_[at] = end;
      if (k + 1 < count_) send(0, c.to_next_s, at + mbs_, input_at_);
    } else if (op.kind == OpKind::B) {
      end_b_[at] = end;
      if (k > 0) send(1, c.to_previous_s, at - mbs_, grad_at_);
    }
    if (op.kind != OpKind::F) {  // the chunk's gradients so far: the last one completes them
      // (A part of the pass is a part of its work with the collectives inside it, spread
      // over it, as the plan's estimate releases a bucket.)
      run_.made_start[k].assign(c.devices->size(), compute_start);
      run_.made_s[k] = compute;
      for (double& s : run_.made_s[k]) s += after;
      if ((op.kind == OpKind::W) == splits_backward_) run_.made_end[at] = end;
    }
    --left_;
    moved = true;
  }
  return moved;
}

WorkerRun PipelineRun::finish() {
  run_.rank_end_s = rank_free_;
  run_.to_host_free = std::move(to_host_free_);
  run_.to_device_free = std::move(to_device_free_);
  run_.channel_free = std::move(channel_free_);
  const double span = span_end_ - span_begin_;
  for (const auto& rank : compute_s_) {
    for (const double busy : rank) {
      if (span <= 0) break;
      run_.bubble_sum += 1 - busy / span;
      ++run_.bubble_count;
    }
  }
  return std::move(run_);
}

}  // namespace

// The same times for the same pipeline: workers whose chunks cost alike run alike.
bool same_timing(const std::vector<Chunk>& a, const std::vector<Chunk>& b) {
  const auto same = [](const Chunk& x, const Chunk& y) {
    return x.rank == y.rank && x.devices->size() == y.devices->size() && x.f_s == y.f_s && x.b_s == y.b_s &&
           x.w_s == y.w_s && x.f_compute_s == y.f_compute_s && x.b_compute_s == y.b_compute_s &&
           x.w_compute_s == y.w_compute_s && x.f_before_s == y.f_before_s && x.b_before_s == y.b_before_s &&
           x.f_after_s == y.f_after_s && x.b_after_s == y.b_after_s && x.last_b_after_s == y.last_b_after_s &&
           x.to_next_s == y.to_next_s &&
           x.to_previous_s == y.to_previous_s;
  };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same);
}

WorkerRun run_pipeline(const Layout& layout, const std::vector<Chunk>& chunks, const RankPrograms& programs, int m,
                       const PipelineStart& from) {
  return run_pipelines(layout, {PipelineInput{&chunks, &programs, m, from}}, nullptr).front();
}

std::vector<WorkerRun> run_pipelines(const Layout& layout, const std::vector<PipelineInput>& workers,
                                     const ZeroGathers* gathers) {
  std::vector<PipelineRun> runs;
  runs.reserve(workers.size());
  for (const PipelineInput& in : workers) runs.emplace_back(layout, in, gathers != nullptr);
  std::optional<Gathers> joint;
  if (gathers != nullptr && !workers.empty()) joint.emplace(*gathers, *workers.front().programs, runs);
  // Without gathers the workers never wait for each other: one after another.
  for (size_t w = 0; w < runs.size(); ++w) {
    while (!runs[w].done()) {
      bool moved = false;
      for (size_t x = joint ? 0 : w; x < (joint ? runs.size() : w + 1); ++x) {
        for (int r = 0; r < static_cast<int>(workers[x].programs->size()); ++r) moved = runs[x].advance(r, joint ? &*joint : nullptr) || moved;
      }
      if (!moved) throw PlanError("estimate_layout: the schedule " + layout.schedule + " deadlocks");
    }
  }
  std::vector<WorkerRun> out;
  out.reserve(runs.size());
  for (PipelineRun& run : runs) out.push_back(run.finish());
  return out;
}

}  // namespace hetflow::partition::estimate_detail
