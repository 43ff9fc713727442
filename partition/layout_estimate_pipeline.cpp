// One run of a virtual worker's pipeline for estimate_layout (partition/layout_estimate_detail.hpp).
#include <algorithm>
#include <limits>
#include <string>

#include "model/error.hpp"
#include "partition/layout_estimate_detail.hpp"

namespace hetflow::partition::estimate_detail {

namespace {
constexpr double kNotYet = -1;
}  // namespace

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

}  // namespace hetflow::partition::estimate_detail
