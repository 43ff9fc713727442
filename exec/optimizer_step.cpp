#include "exec/optimizer_step.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "exec/backend.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"

namespace hetflow::exec {

OptimizerStep::OptimizerStep(OptimizerOptions options, long long samples_per_step, int staleness)
    : options_(options), schedule_(options.schedule(samples_per_step)), staleness_(staleness) {
  schedule_.check();  // (a decay style without a decay end would divide 0 by 0)
  scaler_after_[-1] = LossScaler(options_.loss_scale);
}

double OptimizerStep::scale_of(int iteration) const {
  if (!scaling()) return 1;
  if (options_.loss_scale.loss_scale > 0) return options_.loss_scale.loss_scale;  // constant
  std::lock_guard lock(mutex_);
  const auto found = scaler_after_.find(iteration - 1);
  if (found == scaler_after_.end()) {
    throw PlanError("iteration " + std::to_string(iteration) + " computes before iteration " +
                    std::to_string(iteration - 1) + "'s loss scale is known (its optimizer has not run)");
  }
  return found->second.scale();
}

OptimizerStep::Verdict OptimizerStep::judge(int iteration, double norm) {
  Verdict verdict;
  const double clip = options_.clip_grad / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
  if (options_.clip_grad > 0 && clip < 1) verdict.clip = static_cast<float>(clip);
  if (!scaling()) return verdict;
  const bool found_inf = !std::isfinite(norm);
  verdict.skip = found_inf;
  std::lock_guard lock(mutex_);
  if (const auto seen = skipped_.find(iteration); seen != skipped_.end()) {
    if (seen->second != found_inf) {
      throw Error("the devices disagree whether iteration " + std::to_string(iteration) +
                  "'s gradients are finite (a gradient norm that is not global?)");
    }
    return verdict;
  }
  skipped_[iteration] = found_inf;
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
  return verdict;
}

void OptimizerStep::adamw(const DecoderOps& ops, float* params, const float* grads, float* m, float* v, size_t n,
                          double lr, bool decays, int step) const {
  ops.adamw_update(params, grads, m, v, n, static_cast<float>(lr), static_cast<float>(options_.adam_beta1),
                   static_cast<float>(options_.adam_beta2), static_cast<float>(options_.adam_eps),
                   decays ? static_cast<float>(options_.weight_decay) : 0.0f, step);
}

void OptimizerStep::adamw_host(float* params, const float* grads, float* m, float* v, size_t n, double lr, bool decays,
                               int step) const {
  kernels::adamw_update(params, grads, m, v, static_cast<long>(n), static_cast<float>(lr),
                        static_cast<float>(options_.adam_beta1), static_cast<float>(options_.adam_beta2),
                        static_cast<float>(options_.adam_eps), decays ? static_cast<float>(options_.weight_decay) : 0.0f,
                        step);
}

void OptimizerStep::balance_host(float* params, const float* loads, size_t n) const {
  const auto rate = static_cast<float>(options_.moe_router_bias_update_rate);
  for (size_t i = 0; i < n; ++i) {
    const float sign = loads[i] > 0 ? 1.0f : loads[i] < 0 ? -1.0f : 0.0f;
    params[i] += rate * sign;
  }
}

void OptimizerStep::balance(const DecoderOps& ops, float* params, const float* loads, size_t n) const {
  std::vector<float> p(n), g(n);  // (a router's experts: a few floats a layer)
  ops.download(p.data(), params, n);
  ops.download(g.data(), loads, n);
  balance_host(p.data(), g.data(), n);
  ops.upload(params, p.data(), n);
}

void OptimizerStep::resume(const LossScaler::State& scaler, long long steps_taken) {
  std::lock_guard lock(mutex_);
  scaler_after_.clear();
  scaler_after_[-1] = LossScaler(options_.loss_scale, scaler);
  steps_before_ = steps_taken;
}

LossScaler::State OptimizerStep::scaler_state() const {
  std::lock_guard lock(mutex_);
  return scaler_after_.rbegin()->second.state();
}

double OptimizerStep::loss_scale() const {
  std::lock_guard lock(mutex_);
  return scaler_after_.rbegin()->second.scale();
}

std::vector<double> OptimizerStep::learning_rates(const std::vector<int>& iterations, const std::set<int>& skipped) const {
  std::vector<double> out;
  long long skipped_before = 0;
  for (const int iteration : iterations) {
    if (skipped.count(iteration)) {
      out.push_back(std::numeric_limits<double>::quiet_NaN());
      ++skipped_before;
      continue;
    }
    // The steps taken before it, as the optimizer counts (a resumed run's before it too).
    out.push_back(schedule_.at(steps_before_ + iteration - skipped_before));
  }
  return out;
}

}  // namespace hetflow::exec
