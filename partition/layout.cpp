#include "partition/layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

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

SyncKind parse_sync(std::string_view text) {
  if (text == "allreduce") return SyncKind::allreduce;
  if (text == "ps") return SyncKind::ps;
  if (text == "wsp") return SyncKind::wsp;
  throw std::invalid_argument("expected allreduce, ps or wsp, found '" + std::string(text) + "'");
}

int Layout::samples_per_iteration() const {
  int total = 0;
  for (const VirtualWorker& w : workers) total += w.microbatches * micro_batch_size;
  return total;
}

std::vector<AxisCoords> Layout::device_coords(int devices) const {
  std::vector<AxisCoords> coords(static_cast<size_t>(std::max(devices, 0)));
  for (size_t w = 0; w < workers.size(); ++w) {
    for (size_t r = 0; r < workers[w].ranks.size(); ++r) {
      const std::vector<int>& rank = workers[w].ranks[r];
      for (size_t j = 0; j < rank.size(); ++j) {
        const int d = rank[j];
        if (d < 0 || d >= devices || coords[static_cast<size_t>(d)].data >= 0) continue;
        coords[static_cast<size_t>(d)] = {static_cast<int>(w), static_cast<int>(r), static_cast<int>(j)};
      }
    }
  }
  return coords;
}

bool Layout::uniform_tensor() const {
  for (const VirtualWorker& w : workers) {
    for (const auto& rank : w.ranks) {
      if (static_cast<int>(rank.size()) != tensor) return false;
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
