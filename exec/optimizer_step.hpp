#pragma once
// The optimizer step of real training (torchtitan's optimizer and learning-rate scheduler
// seam), as both the devices' optimizer tasks and the parameter servers take it:
//  - the loss scale each iteration's gradients carry (constant, or dynamic: the scaler
//    after the iteration before), and the verdict on a step (exec/loss_scale.hpp): skipped
//    when its gradients' global norm is not finite;
//  - clipping by the global norm (torch.nn.utils.clip_grad_norm_'s factor);
//  - the learning rate after a number of steps taken (Megatron's schedule, counted in the
//    run's global batches, so skipped steps do not advance it);
//  - AdamW with decoupled weight decay on parameters of two or more dimensions.
// The global norm itself comes from the plan's collective or exec/global_norm.hpp.
//
// Thread-safe: every device's optimizer task of an iteration asks for the same verdict; the
// first records it, the others must agree (the norm is global).
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "exec/decoder_ops.hpp"
#include "exec/loss_scale.hpp"
#include "exec/lr_schedule.hpp"

namespace hetflow::exec {

// Megatron's option names and defaults, except the learning rate (Megatron has none).
struct OptimizerOptions {
  double lr = 3e-4;  // the peak of the schedule below (the rate, when constant)
  LrSchedule::Style lr_decay_style = LrSchedule::Style::constant;
  double min_lr = 0;
  long long lr_warmup_iters = 0, lr_decay_iters = 0;
  // The schedule of a run whose steps take `samples_per_step` samples (its global batch).
  LrSchedule schedule(long long samples_per_step = 1) const {
    return {lr_decay_style, lr, min_lr, lr_warmup_iters, lr_decay_iters, samples_per_step};
  }
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double weight_decay = 0.01;  // on parameters of two or more dimensions only
  double clip_grad = 1.0;      // global gradient norm limit; 0 = off
  LossScaleOptions loss_scale;  // none unless asked (exec/loss_scale.hpp)
  // DeepSeek-V3's auxiliary-loss-free balancing (Megatron-Core's
  // --moe-router-bias-update-rate): a sigmoid router's bias moves this much a step, up for
  // each expert that took fewer than the mean of the step's tokens, down for more.
  double moe_router_bias_update_rate = 1e-3;
};

class OptimizerStep {
 public:
  // Throws InputError for a schedule that cannot be computed (LrSchedule::check).
  // `staleness`: how many iterations a worker may run ahead of the slowest (WSP), so how long
  // verdicts are kept.
  OptimizerStep(OptimizerOptions options, long long samples_per_step, int staleness);

  const OptimizerOptions& options() const { return options_; }
  bool scaling() const { return options_.loss_scale.active(); }
  // Whether a step needs the global gradient norm (clipping or loss scaling).
  bool needs_norm() const { return options_.clip_grad > 0 || scaling(); }

  // The loss scale `iteration`'s gradients carry (1 without scaling). PlanError when the
  // verdict of the iteration before is not known yet: its optimizer has not run.
  double scale_of(int iteration) const;

  struct Verdict {
    bool skip = false;  // gradients not finite: leave the weights, zero the gradients
    float clip = 1;     // the gradients' factor after unscaling
  };
  // The step of `iteration` whose unscaled gradients have global norm `norm`. Every caller of
  // an iteration gets the same verdict; Error when they disagree (a norm that is not global)
  // or when the iteration before has none yet.
  Verdict judge(int iteration, double norm);

  // The rate of a step after `steps_taken` steps (in double; applied rounded to fp32).
  double lr(long long steps_taken) const { return schedule_.at(steps_taken); }
  // One AdamW step of n parameters on `ops`' memory: step `step` (from 1) at rate `lr`.
  void adamw(const DecoderOps& ops, float* params, const float* grads, float* m, float* v, size_t n, double lr,
             bool decays, int step) const;
  // The same on host arrays (a parameter server's).
  void adamw_host(float* params, const float* grads, float* m, float* v, size_t n, double lr, bool decays,
                  int step) const;
  // A balancing bias's step (ParamSlot::balancing) on host arrays: params += rate sign(loads),
  // `loads` each expert's tokens below the mean (any positive multiple of them).
  void balance_host(float* params, const float* loads, size_t n) const;
  // The same on `ops`' memory.
  void balance(const DecoderOps& ops, float* params, const float* loads, size_t n) const;

  double loss_scale() const;  // after the last verdict
  // A resumed run (exec/training_checkpoint.hpp): the scaler as the run before left it, and
  // the steps it took (learning_rates() counts them). Before the first verdict.
  void resume(const LossScaler::State& scaler, long long steps_taken);
  LossScaler::State scaler_state() const;  // after the last verdict
  // The rate each of `iterations` ran at, given which were skipped (NaN for those).
  std::vector<double> learning_rates(const std::vector<int>& iterations, const std::set<int>& skipped) const;

 private:
  OptimizerOptions options_;
  LrSchedule schedule_;
  int staleness_ = 0;
  long long steps_before_ = 0;  // taken by the runs this one resumes
  mutable std::mutex mutex_;
  std::map<int, LossScaler> scaler_after_;  // -1: before the first
  std::map<int, bool> skipped_;             // recent iterations' verdicts
};

}  // namespace hetflow::exec
