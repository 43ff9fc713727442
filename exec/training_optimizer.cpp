// exec::Training's optimizer step: AdamW over a device's chunks, the global gradient norm
// and clipping, the loss scale and the learning-rate schedule.
#include "exec/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "exec/training_chunk.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::exec {

using partition::TaskKind;
using partition::TensorKind;
using training_detail::tensor_of_kind;
using Floats = std::vector<float>;

double Training::global_norm(TaskContext& task, const std::atomic<bool>& stop, double local) {
  std::unique_lock lock(mutex_);
  auto& parts = norm_parts_[task.iteration];
  parts[task.spec->device] = local;
  norm_cv_.notify_all();
  if (ranks_ != nullptr && static_cast<int>(parts.size()) == local_optimizer_tasks_) {
    // This rank's parts are all here: trade them for the other ranks'. (One exchange at a
    // time per rank: the next iteration's waits for this one's norm.)
    std::vector<std::byte> mine;
    for (const auto& [device, part] : parts) {
      put(mine, device);
      put(mine, part);
    }
    lock.unlock();
    task.waiting_for("the global gradient norm: the parts of ranks " + std::to_string(norm_ranks_.front()) + ".." +
                     std::to_string(norm_ranks_.back()));
    const auto all = ranks_->exchange(norm_ranks_, mine, stop);
    lock.lock();
    for (size_t r = 0; r < all.size(); ++r) {
      if (norm_ranks_[r] == ranks_->rank()) continue;
      ByteReader in(all[r]);
      while (!in.done()) {
        const int device = in.get<int>();
        parts[device] = in.get<double>();
      }
    }
    norm_cv_.notify_all();
  }
  while (static_cast<int>(parts.size()) < optimizer_tasks_) {
    task.waiting_for("the global gradient norm: " + std::to_string(parts.size()) + " of " +
                     std::to_string(optimizer_tasks_) + " devices' parts");
    norm_cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (stop.load()) throw Stopped();
  }
  double sum = 0;
  for (const auto& [device, part] : parts) sum += part;  // in device order: reproducible
  if (++norm_reads_[task.iteration] == local_optimizer_tasks_) {  // every task here has its norm
    norm_parts_.erase(task.iteration);
    norm_reads_.erase(task.iteration);
  }
  return std::sqrt(sum);
}

size_t Training::norms_in_flight() const {
  std::lock_guard lock(mutex_);
  return norm_parts_.size();
}

void Training::optimizer(TaskContext& task, const std::atomic<bool>& stop) {
  std::vector<Chunk*> mine;
  if (task.spec->kind == TaskKind::host_optimizer) {
    // Offload: it writes the host state; the parameters it steps are its device's, which its
    // copy back then writes (plan_builder_offload.cpp).
    for (const auto& c : chunks_) {
      if (c->device == task.spec->device) mine.push_back(c.get());
    }
  } else {
    for (const int t : plan_.writes(task.task)) {
      if (auto c = chunk_of_tensor_.find(t); c != chunk_of_tensor_.end()) mine.push_back(c->second);
    }
  }
  float scale = 1;
  const double loss_scale = scale_of(task.iteration);
  const bool scaling = optimizer_.loss_scale.active();
  if (optimizer_.clip_grad > 0 || scaling) {
    // The plan's all-reduce summed the worker's parts (its replicas hold the same gradients);
    // a worker of one device holds every parameter itself. A plan without that collective
    // (a CNN's, an older one): the devices' parts meet here, worker 0's counted.
    const int device = task.spec->device;
    double norm = 0;
    if (has_norm_[static_cast<size_t>(device)]) {
      float square = 0;
      ops_of_(device).download(&square, norm_square_[static_cast<size_t>(device)].data(), 1);
      norm = std::sqrt(static_cast<double>(square));
    } else if (plan_has_norm_) {
      norm = std::sqrt(local_sum_squares(device, task.iteration));
    } else {
      const bool counts = task.spec->worker == 0 || zero_stage_ > 0;  // (sharded: every replica its shard)
      norm = global_norm(task, stop, counts ? local_sum_squares(device, task.iteration) : 0.0);
    }
    // (The norm is of the unscaled gradients: a scaled one could overflow where they do not.)
    if (scaling && record_step(task.iteration, norm)) {  // not finite: skip the step
      for (Chunk* c : mine) c->ops().zero(c->grads.data(), c->grads.size());
      return;
    }
    const double clip = optimizer_.clip_grad / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
    if (optimizer_.clip_grad > 0 && clip < 1) scale = static_cast<float>(clip);
  }
  for (Chunk* c : mine) {
    const int step = ++c->steps;  // AdamW's count: skipped steps do not count
    const double lr = schedule_.at(step - 1);  // nor does the schedule (Megatron's)
    if (loss_scale != 1) c->ops().scale(c->grads.data(), static_cast<float>(1 / loss_scale), c->grads.size());
    if (scale != 1) c->ops().scale(c->grads.data(), scale, c->grads.size());
    for (const ParamSlot& slot : c->math.params().slots) {
      c->each_owned(slot.offset, slot.offset + slot.count, [&](size_t o, size_t n) {  // (ZeRO: its shard)
        c->ops().adamw_update(c->params.data() + o, c->grads.data() + o, c->m.data() + o, c->v.data() + o, n,
                              static_cast<float>(lr), static_cast<float>(optimizer_.adam_beta1),
                              static_cast<float>(optimizer_.adam_beta2), static_cast<float>(optimizer_.adam_eps),
                              slot.decays ? static_cast<float>(optimizer_.weight_decay) : 0.0f, step);
      });
    }
    c->ops().zero(c->grads.data(), c->grads.size());
    // What others own is theirs to bring: the plan's all-gathers, before any pass reads it.
    if (!c->owned.empty()) set_unowned(*c, std::numeric_limits<float>::quiet_NaN());
  }
}

// A device's part of the squared gradient norm: every parameter it holds once (under ZeRO its
// shard: the replicas' parts meet in the plan's norm collective; the pieces of
// one Megatron splits on every rank, even where a split leaves one rank all of it and the
// others nothing; a replicated one on tensor rank 0 alone; a tied copy not at all; under
// expert parallelism routed experts on their holders, the rest on expert rank 0), after its
// data-parallel sync; of the unscaled gradients (divided by the loss scale squared, exactly:
// a power of four).
double Training::local_sum_squares(int device, int iteration) const {
  double local = 0;
  for (const auto& c : chunks_) {
    if (c->device != device) continue;
    for (const ParamSlot& slot : c->math.params().slots) {
      if (slot.tied_copy || (!slot.split && c->tp_rank != 0)) continue;
      // (Expert parallelism: the norm meets over the expert group, whose ranks each hold their
      // experts and a copy of the rest: the rest counts on rank 0. Under ZeRO it meets over
      // every replica, each with its own shard of the rest.)
      if (slot.expert < 0 && c->math.experts().rank != 0 && zero_stage_ == 0) continue;
      c->each_owned(slot.offset, slot.offset + slot.count,
                    [&](size_t o, size_t n) { local = c->ops().sum_of_squares(c->grads.data() + o, n, local); });
    }
  }
  const double scale = scale_of(iteration);
  return scale == 1 ? local : local / (scale * scale);
}

double Training::scale_of(int iteration) const {
  if (!optimizer_.loss_scale.active()) return 1;
  if (optimizer_.loss_scale.loss_scale > 0) return optimizer_.loss_scale.loss_scale;  // constant
  std::lock_guard lock(mutex_);
  const auto found = scaler_after_.find(iteration - 1);
  if (found == scaler_after_.end()) {
    throw PlanError("iteration " + std::to_string(iteration) + " computes before iteration " +
                    std::to_string(iteration - 1) + "'s loss scale is known (its optimizer has not run)");
  }
  return found->second.scale();
}

bool Training::record_step(int iteration, double scaled_norm) {
  const bool found_inf = !std::isfinite(scaled_norm);
  std::lock_guard lock(mutex_);
  if (const auto seen = skipped_.find(iteration); seen != skipped_.end()) {
    if (seen->second != found_inf) {
      throw Error("the devices disagree whether iteration " + std::to_string(iteration) +
                  "'s gradients are finite (a gradient norm that is not global?)");
    }
    return found_inf;
  }
  skipped_[iteration] = found_inf;
  if (found_inf) skipped_iterations_.insert(iteration);
  const auto before = scaler_after_.find(iteration - 1);
  if (before == scaler_after_.end()) {
    throw Error("iteration " + std::to_string(iteration) + "'s optimizer runs before iteration " +
                std::to_string(iteration - 1) + "'s");
  }
  LossScaler next = before->second;
  next.update(found_inf);
  scaler_after_[iteration] = next;
  // Steps this far back are done on every device (a worker lags by its staleness at most).
  scaler_after_.erase(scaler_after_.begin(), scaler_after_.lower_bound(iteration - staleness_ - 8));
  skipped_.erase(skipped_.begin(), skipped_.lower_bound(iteration - staleness_ - 8));
  return found_inf;
}

double Training::loss_scale() const {
  std::lock_guard lock(mutex_);
  return scaler_after_.rbegin()->second.scale();
}

int Training::skipped_steps() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(skipped_iterations_.size());
}

std::vector<double> Training::learning_rates() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  long long skipped_before = 0;  // (loss_parts_ is in iteration order)
  for (const auto& [iteration, parts] : loss_parts_) {
    if (skipped_iterations_.count(iteration)) {
      out.push_back(std::numeric_limits<double>::quiet_NaN());
      ++skipped_before;
      continue;
    }
    out.push_back(schedule_.at(iteration - skipped_before));  // the steps taken before it, as the optimizer counts
  }
  return out;
}

}  // namespace hetflow::exec
