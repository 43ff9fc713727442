// exec::Training's optimizer task: which chunks it steps, the global gradient norm they are
// clipped by (the plan's collective, or the devices meeting in GlobalNorm), and each chunk's
// AdamW step through OptimizerStep.
#include "exec/training.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "exec/plan_tensors.hpp"

namespace hetflow::exec {

using partition::TaskKind;

size_t Training::norms_in_flight() const { return norm_->in_flight(); }

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
  OptimizerStep::Verdict verdict;
  const double loss_scale = step_->scale_of(task.iteration);
  if (step_->needs_norm()) {
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
      norm = norm_->meet(task, stop, device, counts ? local_sum_squares(device, task.iteration) : 0.0);
    }
    // (The norm is of the unscaled gradients: a scaled one could overflow where they do not.)
    verdict = step_->judge(task.iteration, norm);
    if (verdict.skip) {  // not finite: skip the step, but for the routers' balancing biases
      log_->add_skipped(task.iteration);
      for (Chunk* c : mine) {
        step_balancing(*c);
        c->ops().zero(c->grads.data(), c->grads.size());
      }
      return;
    }
  }
  for (Chunk* c : mine) {
    const int step = ++c->steps;  // AdamW's count: skipped steps do not count
    const double lr = step_->lr(step - 1);  // nor does the schedule (Megatron's)
    if (loss_scale != 1) c->ops().scale(c->grads.data(), static_cast<float>(1 / loss_scale), c->grads.size());
    if (verdict.clip != 1) c->ops().scale(c->grads.data(), verdict.clip, c->grads.size());
    for (const ParamSlot& slot : c->math.params().slots) {
      c->each_owned(slot.offset, slot.offset + slot.count, [&](size_t o, size_t n) {  // (ZeRO: its shard)
        const size_t at = c->shard_at(o);  // (ZeRO: its moments, from stage 2 its gradients, the shard's alone)
        float* params = c->params.data() + c->index_in(c->params, o);
        if (!slot.balancing) {
          step_->adamw(c->ops(), params, c->grad_at(o), c->m.data() + at, c->v.data() + at, n, lr, slot.decays, step);
        }
      });
    }
    step_balancing(*c);
    c->ops().zero(c->grads.data(), c->grads.size());
    // What others own is theirs to bring: the plan's all-gathers, before any pass reads it.
    if (!c->owned.empty()) c->set_unowned(std::numeric_limits<float>::quiet_NaN());
  }
}

// The routers' balancing biases of a chunk (its shard, under ZeRO) stepped by the signs of
// the loads their gradient arrays hold: whether or not the rest of the step is skipped, as
// Megatron-Core updates them from the loads before its optimizer decides
// (finalize_model_grads). The loss scale and clipping, positive factors, leave the signs.
void Training::step_balancing(Chunk& c) {
  for (const ParamSlot& slot : c.math.params().slots) {
    if (!slot.balancing) continue;
    c.each_owned(slot.offset, slot.offset + slot.count, [&](size_t o, size_t n) {
      step_->balance(c.ops(), c.params.data() + c.index_in(c.params, o), c.grad_at(o), n);
    });
  }
}

// A device's part of the squared gradient norm: every parameter it holds once but a router's
// balancing bias, whose "gradient" is a count of tokens (under ZeRO its
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
      if (slot.tied_copy || slot.balancing || (!slot.split && c->tp_rank != 0)) continue;
      // (Expert parallelism: the norm meets over the expert group, whose ranks each hold their
      // experts and a copy of the rest: the rest counts on rank 0. Under ZeRO it meets over
      // every replica, each with its own shard of the rest.)
      if (slot.expert < 0 && c->math.experts().rank != 0 && zero_stage_ == 0) continue;
      c->each_owned(slot.offset, slot.offset + slot.count,
                    [&](size_t o, size_t n) { local = c->ops().sum_of_squares(c->grad_at(o), n, local); });
    }
  }
  const double scale = step_->scale_of(iteration);
  return scale == 1 ? local : local / (scale * scale);
}

double Training::loss_scale() const { return step_->loss_scale(); }

int Training::skipped_steps() const { return log_->skipped_steps(); }

std::vector<double> Training::learning_rates() const {
  return step_->learning_rates(log_->iterations(), log_->skipped());
}

}  // namespace hetflow::exec
