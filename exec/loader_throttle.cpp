#include "exec/loader_throttle.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "model/units.hpp"
#include "partition/loading.hpp"

namespace hetflow::exec {

LoaderThrottle::LoaderThrottle(double s_per_sample) : s_per_sample_(s_per_sample) {
  if (!(s_per_sample >= 0) || !std::isfinite(s_per_sample)) {
    throw InputError("<options>", 0, "loader_throttle_s_per_sample", "expected a finite number of seconds >= 0");
  }
}

void LoaderThrottle::prepare(const partition::Plan& plan, const Ranks* ranks) {
  plan_ = &plan;
  node_of_.clear();
  for (const model::Device& d : plan.cluster.devices()) node_of_.push_back(d.node);
  const size_t nodes = std::max<size_t>(1, plan.cluster.nodes.size());
  std::vector<std::set<int>> owners(nodes);
  for (const partition::Task& t : plan.tasks) {
    if (t.kind != partition::TaskKind::load || t.device < 0 || static_cast<size_t>(t.device) >= node_of_.size()) continue;
    const int owner = ranks != nullptr && !ranks->alone() ? ranks->owner(t.device, plan.device_count()) : 0;
    owners[std::min(static_cast<size_t>(node_of_[static_cast<size_t>(t.device)]), nodes - 1)].insert(owner);
  }
  processes_.assign(nodes, 1);
  for (size_t n = 0; n < nodes; ++n) processes_[n] = std::max<int>(1, static_cast<int>(owners[n].size()));
  std::lock_guard lock(mutex_);
  free_at_s_.assign(nodes, 0.0);
}

void LoaderThrottle::wait(TaskContext& task, const std::atomic<bool>& stop) {
  if (s_per_sample_ <= 0 || plan_ == nullptr) return;
  const auto device = static_cast<size_t>(task.spec->device);
  const size_t node = std::min(device < node_of_.size() ? static_cast<size_t>(node_of_[device]) : 0, processes_.size() - 1);
  const double cost_s = partition::load_samples(*plan_, *task.spec) * s_per_sample_ * processes_[node];
  double done_s = 0;
  {
    std::lock_guard lock(mutex_);
    double& free_at = free_at_s_[node];
    done_s = std::max(free_at, task.now_s()) + cost_s;
    free_at = done_s;
  }
  task.waiting_for("the loader of node " + std::to_string(node) + ", throttled to " +
                   model::units::format_number(s_per_sample_) + " s a sample");
  for (double left = done_s - task.now_s(); left > 0; left = done_s - task.now_s()) {
    if (stop.load(std::memory_order_relaxed)) throw Stopped();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.5e-3)));
  }
}

}  // namespace hetflow::exec
