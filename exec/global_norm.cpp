#include "exec/global_norm.hpp"

#include <chrono>
#include <cmath>
#include <string>

namespace hetflow::exec {

GlobalNorm::GlobalNorm(int parts, int parts_here, const Ranks* ranks, std::vector<int> among)
    : parts_(parts), parts_here_(parts_here), ranks_(ranks), among_(std::move(among)) {}

double GlobalNorm::meet(TaskContext& task, const std::atomic<bool>& stop, int device, double sum_of_squares) {
  std::unique_lock lock(mutex_);
  auto& parts = parts_of_[task.iteration];
  parts[device] = sum_of_squares;
  cv_.notify_all();
  if (ranks_ != nullptr && static_cast<int>(parts.size()) == parts_here_) {
    // This rank's parts are all here: trade them for the other ranks'.
    std::vector<std::byte> mine;
    for (const auto& [d, part] : parts) {
      put(mine, d);
      put(mine, part);
    }
    lock.unlock();
    task.waiting_for("the global gradient norm: the parts of ranks " + std::to_string(among_.front()) + ".." +
                     std::to_string(among_.back()));
    const auto all = ranks_->exchange(among_, mine, stop);
    lock.lock();
    for (size_t r = 0; r < all.size(); ++r) {
      if (among_[r] == ranks_->rank()) continue;
      ByteReader in(all[r]);
      while (!in.done()) {
        const int d = in.get<int>();
        parts[d] = in.get<double>();
      }
    }
    cv_.notify_all();
  }
  while (static_cast<int>(parts.size()) < parts_) {
    task.waiting_for("the global gradient norm: " + std::to_string(parts.size()) + " of " + std::to_string(parts_) +
                     " devices' parts");
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (stop.load()) throw Stopped();
  }
  double sum = 0;
  for (const auto& [d, part] : parts) sum += part;  // in device order: reproducible
  if (++reads_[task.iteration] == parts_here_) {     // every caller here has its norm
    parts_of_.erase(task.iteration);
    reads_.erase(task.iteration);
  }
  return std::sqrt(sum);
}

size_t GlobalNorm::in_flight() const {
  std::lock_guard lock(mutex_);
  return parts_of_.size();
}

}  // namespace hetflow::exec
