#include "exec/loss_scale.hpp"

#include <algorithm>

namespace hetflow::exec {

LossScaler::LossScaler(const LossScaleOptions& o)
    : dynamic_(o.loss_scale <= 0 && o.dynamic),
      scale_(o.loss_scale > 0 ? o.loss_scale : o.dynamic ? o.initial_loss_scale : 1),
      min_(o.min_loss_scale),
      window_(o.loss_scale_window),
      hysteresis_(o.hysteresis),
      hysteresis_tracker_(o.hysteresis) {}

LossScaler::LossScaler(const LossScaleOptions& o, const State& state) : LossScaler(o) {
  if (!dynamic_ || !state.dynamic) return;  // (a constant scale is the options'; a run that had none starts afresh)
  scale_ = std::clamp(state.scale, min_, kMaxLossScale);
  growth_tracker_ = std::clamp(state.growth_tracker, 0, std::max(0, window_ - 1));
  hysteresis_tracker_ = std::min(state.hysteresis_tracker, hysteresis_);
}

void LossScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, min_);
    return;
  }
  if (++growth_tracker_ == window_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ = std::min(scale_ * 2, kMaxLossScale);
  }
}

}  // namespace hetflow::exec
