#include "exec/copy_reuse.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "model/error.hpp"
#include "partition/run_graph.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

using partition::TaskKind;

namespace {

// Task instances of two unrolled iterations as events, the start and the end of each, with
// the edges that order them; a topological position for each event prunes the searches (an
// event after the target in that order cannot lead to it).
class HappensBefore {
 public:
  explicit HappensBefore(const partition::Plan& plan) : graph_(plan), n_(plan.tasks.size()) {
    std::vector<std::pair<size_t, size_t>> edges;
    const auto edge = [&](size_t from, size_t to) { edges.emplace_back(from, to); };
    for (size_t i = 0; i < 2; ++i) {
      for (size_t t = 0; t < n_; ++t) {
        edge(node(i, t, kStart), node(i, t, kEnd));
        for (const partition::RunGraph::Successor& s : graph_.successors(static_cast<int>(t))) {
          if (i + static_cast<size_t>(s.offset) <= 1) {
            edge(node(i, t, kEnd), node(i + static_cast<size_t>(s.offset), static_cast<size_t>(s.task), kStart));
          }
        }
        // A receive ends only after its send has started. (Not the reverse: NCCL completes a
        // send smaller than its buffers before the receive is posted.)
        if (const int partner = graph_.partner(static_cast<int>(t));
            partner >= 0 && plan.task(static_cast<int>(t)).kind == TaskKind::send) {
          edge(node(i, t, kStart), node(i, static_cast<size_t>(partner), kEnd));
        }
      }
      for (const auto& device : plan.programs) {  // program order, into the next iteration
        for (const partition::StreamProgram& program : device) {
          for (size_t k = 0; k + 1 < program.tasks.size(); ++k) {
            edge(node(i, static_cast<size_t>(program.tasks[k]), kEnd), node(i, static_cast<size_t>(program.tasks[k + 1]), kStart));
          }
          if (i == 0 && !program.tasks.empty()) {
            edge(node(0, static_cast<size_t>(program.tasks.back()), kEnd), node(1, static_cast<size_t>(program.tasks.front()), kStart));
          }
        }
      }
      // A member of a collective ends only after the members whose data it needs have started:
      // every other for an all-reduce, all-gather or reduce-scatter; the root for a
      // broadcast's receivers; every other for a reduce's root (the others may be done first).
      // Through one rendezvous event per collective, so a large group costs its size, not its
      // square.
      for (size_t c = 0; c < plan.collectives.size(); ++c) {
        const partition::Collective& collective = plan.collectives[c];
        const size_t meet = rendezvous(i, c), root = static_cast<size_t>(std::max(0, collective.root));
        for (size_t m = 0; m < collective.tasks.size(); ++m) {
          if (collective.tasks[m] < 0) continue;
          const auto task = static_cast<size_t>(collective.tasks[m]);
          const bool is_root = m == root;
          if (collective.kind != partition::CollectiveKind::broadcast || is_root) edge(node(i, task, kStart), meet);
          if (collective.kind != partition::CollectiveKind::reduce || is_root) edge(meet, node(i, task, kEnd));
        }
      }
    }
    const size_t events = 4 * n_ + 2 * plan.collectives.size();
    begin_.assign(events + 1, 0);
    for (const auto& [from, to] : edges) ++begin_[from + 1];
    for (size_t e = 0; e < events; ++e) begin_[e + 1] += begin_[e];
    next_.resize(edges.size());
    std::vector<size_t> fill(begin_.begin(), begin_.end() - 1);
    for (const auto& [from, to] : edges) next_[fill[from]++] = to;
    // Kahn's order; events on a cycle (a plan that deadlocks) keep the last position, which
    // prunes nothing.
    std::vector<size_t> in(events, 0);
    for (const size_t to : next_) ++in[to];
    position_.assign(events, events);
    std::vector<size_t> ready;
    for (size_t e = 0; e < events; ++e) {
      if (in[e] == 0) ready.push_back(e);
    }
    for (size_t k = 0; !ready.empty(); ++k) {
      const size_t e = ready.back();
      ready.pop_back();
      position_[e] = k;
      for (size_t j = begin_[e]; j < begin_[e + 1]; ++j) {
        if (--in[next_[j]] == 0) ready.push_back(next_[j]);
      }
    }
    seen_.assign(events, 0);
  }

  int partner(int task) const { return graph_.partner(task); }

  // Whether the end of any of `from` in iteration 0 happens before the start of any of
  // `targets` in iteration 1.
  bool ordered(const std::vector<int>& from, const std::vector<int>& targets) {
    if (++round_ == 0) {  // (the marks wrapped: clear them)
      std::fill(seen_.begin(), seen_.end(), 0);
      round_ = 1;
    }
    size_t last = 0;  // no path goes past the latest target
    for (const int t : targets) last = std::max(last, position_[node(1, static_cast<size_t>(t), kStart)]);
    std::vector<size_t> stack;
    const auto visit = [&](size_t e) {
      if (seen_[e] != round_ && position_[e] <= last) {
        seen_[e] = round_;
        stack.push_back(e);
      }
    };
    for (const int f : from) visit(node(0, static_cast<size_t>(f), kEnd));
    while (!stack.empty()) {
      const size_t e = stack.back();
      stack.pop_back();
      for (const int t : targets) {
        if (e == node(1, static_cast<size_t>(t), kStart)) return true;
      }
      for (size_t j = begin_[e]; j < begin_[e + 1]; ++j) visit(next_[j]);
    }
    return false;
  }

 private:
  static constexpr size_t kStart = 0, kEnd = 1;
  size_t node(size_t iteration, size_t task, size_t event) const { return (iteration * n_ + task) * 2 + event; }
  size_t rendezvous(size_t iteration, size_t collective) const { return 4 * n_ + 2 * collective + iteration; }

  partition::RunGraph graph_;
  size_t n_;
  std::vector<size_t> begin_, next_, position_;  // edges as compressed rows; topological positions
  std::vector<std::uint32_t> seen_;
  std::uint32_t round_ = 0;
};

}  // namespace

bool one_device_copy_under_real_math(const partition::Plan& plan, int tensor) {
  const int producer = plan.tensor(tensor).producer;
  if (producer < 0) return true;
  const partition::Task& t = plan.task(producer);
  return !(t.kind == TaskKind::recv &&
           (t.purpose == partition::Purpose::ps_push || t.purpose == partition::Purpose::ps_pull));
}

std::vector<CopyReuseHazard> copy_reuse_hazards(const partition::Plan& plan,
                                                const std::function<bool(int tensor)>& one_copy) {
  std::vector<std::vector<int>> readers(plan.tensors.size());
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    for (const int r : plan.reads(static_cast<int>(t))) {
      if (r >= 0 && static_cast<size_t>(r) < readers.size()) readers[static_cast<size_t>(r)].push_back(static_cast<int>(t));
    }
  }
  HappensBefore order(plan);
  std::vector<CopyReuseHazard> out;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const partition::Tensor& tensor = plan.tensors[t];
    if (partition::is_persistent(tensor.kind) || tensor.producer < 0) continue;
    if (one_copy && !one_copy(static_cast<int>(t))) continue;
    const int producer = tensor.producer;
    // Where the write of the next iteration's instance may begin (see the header).
    std::vector<int> writes_after = {producer};
    if (plan.task(producer).kind == TaskKind::recv) {
      if (const int send = order.partner(producer); send >= 0) writes_after.push_back(send);
    }
    for (const int reader : readers[t]) {
      if (reader == producer) continue;  // program order
      // A send has read its tensor once either side has ended (the bytes have arrived).
      std::vector<int> done = {reader};
      if (plan.task(reader).kind == TaskKind::send) {
        if (const int recv = order.partner(reader); recv >= 0) done.push_back(recv);
      }
      if (!order.ordered(done, writes_after)) out.push_back({static_cast<int>(t), producer, reader});
    }
  }
  return out;
}

void require_no_copy_reuse_hazards(const partition::Plan& plan, const std::function<bool(int tensor)>& one_copy,
                                   const std::string& holder) {
  const std::vector<CopyReuseHazard> hazards = copy_reuse_hazards(plan, one_copy);
  if (hazards.empty()) return;
  std::string what = holder + " keeps one copy of each tensor for every iteration, and the plan does not order " +
                     std::to_string(hazards.size()) + " of its reads before the next iteration's write: ";
  for (size_t k = 0; k < hazards.size() && k < 3; ++k) what += (k > 0 ? "; " : "") + describe(plan, hazards[k]);
  if (hazards.size() > 3) what += "; ...";
  throw PlanError(what);
}

std::string describe(const partition::Plan& plan, const CopyReuseHazard& h) {
  const partition::Tensor& t = plan.tensor(h.tensor);
  return "tensor " + std::to_string(h.tensor) + " (" + std::string(partition::to_string(t.kind)) + " on " +
         plan.device_name(t.device) + "): " + partition::describe_task(plan, h.producer) +
         " of iteration i + 1 may write it before " + partition::describe_task(plan, h.reader) +
         " of iteration i is done with it";
}

}  // namespace hetflow::exec
