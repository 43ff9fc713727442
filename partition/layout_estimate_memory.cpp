// estimate_layout's memory: a rank's stashes and every device's headroom
// (partition/layout_estimate_detail.hpp).
#include <algorithm>
#include <limits>
#include <map>

#include "partition/layout_estimate_detail.hpp"
#include "partition/memory.hpp"

namespace hetflow::partition::estimate_detail {

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

RankStashes rank_stashes(const std::vector<ScheduledOp>& program, const std::vector<double>& stash_bytes,
                         double scratch_bytes, bool splits_backward, bool offloaded) {
  RankStashes out;
  const double peak = activation_peak_bytes(program, stash_bytes, scratch_bytes, splits_backward);
  const double largest = stash_bytes.empty() ? 0 : *std::max_element(stash_bytes.begin(), stash_bytes.end());
  // Offloaded, a pass's own stash, the largest, while it runs; the plan adds the copies in
  // flight around it (up to two more), which depend on how copies and passes interleave.
  const double own = std::min(peak, largest + scratch_bytes);
  if (offloaded) {
    out.device = own;
    out.in_copies = 2 * largest;
    out.host = activation_peak_bytes(program, stash_bytes, 0, splits_backward);  // every stash in flight
  } else {
    out.device = peak;
    out.if_offloaded = own + 2 * largest;
  }
  return out;
}

Headroom headroom_of(const std::vector<DeviceMemory>& memory, const std::vector<bool>& computes,
                     const std::vector<double>& in_copies, const std::vector<double>& if_offloaded,
                     const CostModel& cost, bool offloads) {
  Headroom h;
  h.bytes = h.with_copies = h.stashes_offloaded = h.host = std::numeric_limits<double>::infinity();
  for (size_t d = 0; d < memory.size(); ++d) {
    const DeviceMemory& m = memory[d];
    if (!computes[d] || !(m.capacity_bytes > 0)) continue;
    const double free = m.capacity_bytes - m.total_bytes();
    if (free < h.bytes) {
      h.bytes = free;
      h.tightest = static_cast<int>(d);
    }
    h.with_copies = std::min(h.with_copies, free - in_copies[d]);
    h.stashes_offloaded = std::min(h.stashes_offloaded, free + m.activations_bytes + m.gathered_bytes - if_offloaded[d]);
  }
  if (offloads) {
    std::map<int, double> host;  // node -> its devices' host bytes
    for (size_t d = 0; d < memory.size(); ++d) host[cost.node_of(static_cast<int>(d))] += memory[d].host_bytes;
    for (const auto& [node, bytes] : host) h.host = std::min(h.host, cost.cluster().host(node).memory_bytes - bytes);
  }
  return h;
}

void hold_own_experts(const Layout& layout, double params, DeviceMemory& m) {
  if (layout.experts.parallel <= 1) return;
  m.weights_bytes = params * model::element_bytes(layout.precision);
  m.gradients_bytes = params * layout.gradient_element_bytes();
  if (m.optimizer_bytes > 0) m.optimizer_bytes = params * model::adam_state_bytes(layout.precision);
  if (layout.offload.optimizer) m.host_bytes = params * offload_host_bytes_per_param(layout);
}

}  // namespace hetflow::partition::estimate_detail
