#include "partition/layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/error.hpp"

namespace hetflow::partition {

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "none";
}

std::string_view to_string(SyncKind s) {
  switch (s) {
    case SyncKind::allreduce: return "allreduce";
    case SyncKind::ps: return "ps";
    case SyncKind::wsp: return "wsp";
  }
  return "allreduce";
}

Recompute parse_recompute(std::string_view text) {
  if (text == "none") return Recompute::none;
  if (text == "selective") return Recompute::selective;
  if (text == "full") return Recompute::full;
  throw std::invalid_argument("expected none, selective or full, found '" + std::string(text) + "'");
}

std::string_view to_string(ZeroShares s) { return s == ZeroShares::memory ? "memory" : "equal"; }

ZeroShares parse_zero_shares(std::string_view text) {
  if (text == "equal") return ZeroShares::equal;
  if (text == "memory") return ZeroShares::memory;
  throw std::invalid_argument("expected equal or memory, found '" + std::string(text) + "'");
}

std::string_view to_string(ContextComm c) { return c == ContextComm::ring ? "ring" : "allgather"; }

ContextComm parse_context_comm(std::string_view text) {
  if (text == "allgather") return ContextComm::all_gather;
  if (text == "ring") return ContextComm::ring;
  throw std::invalid_argument("expected allgather or ring, found '" + std::string(text) + "'");
}

SyncKind parse_sync(std::string_view text) {
  if (text == "allreduce") return SyncKind::allreduce;
  if (text == "ps") return SyncKind::ps;
  if (text == "wsp") return SyncKind::wsp;
  throw std::invalid_argument("expected allreduce, ps or wsp, found '" + std::string(text) + "'");
}

int Layout::size(Axis a) const {
  if (a == Axis::expert) return experts.parallel;
  for (const LayoutAxis& x : axes) {
    if (x.axis == a) return x.size;
  }
  return 1;
}

void Layout::set_size(Axis a, int n) {
  if (a == Axis::expert) {
    experts.parallel = n;
    return;
  }
  for (LayoutAxis& x : axes) {
    if (x.axis == a) {
      x.size = n;
      return;
    }
  }
  if (a == Axis::context) {
    auto tensor = std::find_if(axes.begin(), axes.end(), [](const LayoutAxis& x) { return x.axis == Axis::tensor; });
    axes.insert(tensor == axes.end() ? axes.end() : tensor + 1, {a, n});
    return;
  }
  axes.push_back({a, n});
}

std::vector<LayoutAxis> Layout::fitted_axes() const {
  size_t depth = 1;
  for (const VirtualWorker& w : workers) depth = std::max(depth, w.ranks.size());
  std::vector<LayoutAxis> fitted = axes;
  for (LayoutAxis& x : fitted) {
    switch (x.axis) {
      case Axis::data: x.size = std::max(1, static_cast<int>(workers.size()) / std::max(1, size(Axis::context))); break;
      case Axis::pipeline: x.size = static_cast<int>(depth); break;
      case Axis::tensor: x.size = largest_tensor(); break;
      case Axis::context: break;  // as given: the workers alone do not say how they group
      case Axis::expert: break;   // (never listed)
    }
  }
  return fitted;
}

void Layout::fit_axes() { axes = fitted_axes(); }

void Layout::fit_outer_axes() {
  const int t = size(Axis::tensor);
  fit_axes();
  set_size(Axis::tensor, t);
}

void check_axes(const Layout& layout) {
  try {
    parse_axis_order(axis_order_text(layout.axes));
  } catch (const std::invalid_argument& e) {
    throw InputError("<layout>", 0, "axes", e.what());
  }
  const std::vector<LayoutAxis> fitted = layout.fitted_axes();
  for (size_t i = 0; i < fitted.size(); ++i) {
    if (layout.axes[i].size == fitted[i].size) continue;
    const char* what[] = {layout.size(Axis::context) > 1 ? "the virtual workers over the context size" : "the virtual workers",
                           "the most ranks a worker has", "the most devices a rank has", "as given", "as given"};
    throw InputError("<layout>", 0, "axes[" + std::to_string(i) + "].size",
                     "expected " + std::to_string(fitted[i].size) + " (" + std::string(to_string(fitted[i].axis)) + ": " +
                         what[static_cast<size_t>(fitted[i].axis)] + "), found " + std::to_string(layout.axes[i].size));
  }
}

int Layout::samples_per_iteration() const {
  int total = 0;
  for (const VirtualWorker& w : workers) total += w.microbatches * micro_batch_size;
  return total / std::max(1, size(Axis::context));
}

std::vector<AxisCoords> Layout::device_coords(int devices) const {
  std::vector<AxisCoords> coords(static_cast<size_t>(std::max(devices, 0)));
  const size_t context = static_cast<size_t>(std::max(1, size(Axis::context)));
  const size_t ep = static_cast<size_t>(std::max(1, experts.parallel));
  for (size_t w = 0; w < workers.size(); ++w) {
    for (size_t r = 0; r < workers[w].ranks.size(); ++r) {
      const std::vector<int>& rank = workers[w].ranks[r];
      for (size_t j = 0; j < rank.size(); ++j) {
        const int d = rank[j];
        if (d < 0 || d >= devices || coords[static_cast<size_t>(d)][Axis::data] >= 0) continue;
        AxisCoords& c = coords[static_cast<size_t>(d)];
        c[Axis::data] = static_cast<int>(w / context);
        c[Axis::pipeline] = static_cast<int>(r);
        c[Axis::tensor] = static_cast<int>(j);
        c[Axis::context] = static_cast<int>(w % context);
        c[Axis::expert] = static_cast<int>(w / context % ep);  // (expert_shard.hpp's expert_rank)
      }
    }
  }
  return coords;
}

bool Layout::uniform_tensor() const {
  for (const VirtualWorker& w : workers) {
    for (const auto& rank : w.ranks) {
      if (static_cast<int>(rank.size()) != size(Axis::tensor)) return false;
    }
  }
  return true;
}

int Layout::largest_tensor() const {
  size_t t = 1;
  for (const VirtualWorker& w : workers) {
    for (const auto& rank : w.ranks) t = std::max(t, rank.size());
  }
  return static_cast<int>(t);
}

}  // namespace hetflow::partition
