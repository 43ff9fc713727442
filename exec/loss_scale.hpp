#pragma once
// Loss scaling for training whose GEMMs multiply fp16 operands: the loss's gradient is
// multiplied by a scale S before the backward, so small gradients stay representable in
// fp16, and the weight gradients are divided by S before the optimizer. Megatron's two
// scalers, with its option names and semantics (megatron/core/optimizer/grad_scaler.py):
//  - constant (--loss-scale S);
//  - dynamic (--initial-loss-scale, default 2^32; --min-loss-scale, 1; --loss-scale-window,
//    1000; --hysteresis, 2): a step whose gradients are not finite is skipped; after
//    `hysteresis` such steps without a good window between, S halves (not below the
//    minimum); after `window` good steps in a row, S doubles and the hysteresis resets.
// Scales are powers of two, so scaling and unscaling are exact in fp32 (barring overflow and
// subnormals): a constant scale trains to the same bits as none. They stay within
// [2^-126, 2^126], so that 1/S is a normal fp32 too: a dynamic scale stops growing there
// (Megatron's has no bound; it would overflow its gradients first).
namespace hetflow::exec {

constexpr double kMinLossScale = 1.1754943508222875e-38;  // 2^-126
constexpr double kMaxLossScale = 8.507059173023462e+37;   // 2^126

struct LossScaleOptions {
  double loss_scale = 0;            // constant scale; 0: none, or dynamic
  bool dynamic = false;             // dynamic scaling (when loss_scale is 0)
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool active() const { return loss_scale > 0 || dynamic; }
};

class LossScaler {
 public:
  // What a training checkpoint keeps of a scaler (exec/training_checkpoint.hpp).
  struct State {
    bool dynamic = false;
    double scale = 1;
    int growth_tracker = 0;      // good steps since the scale last changed
    int hysteresis_tracker = 2;  // non-finite steps left before it halves
  };
  explicit LossScaler(const LossScaleOptions& o = {});
  // The scaler of `o` as a run left it in `state` (a resumed run's). A constant scale is the
  // options'; a state without dynamic scaling starts a dynamic scaler afresh.
  LossScaler(const LossScaleOptions& o, const State& state);
  State state() const { return {dynamic_, scale_, growth_tracker_, hysteresis_tracker_}; }
  double scale() const { return scale_; }
  // After a step: whether its gradients were not finite (the step is then skipped).
  void update(bool found_inf);

 private:
  bool dynamic_ = false;
  double scale_ = 1, min_ = 1;
  int window_ = 1000, hysteresis_ = 2;
  int growth_tracker_ = 0, hysteresis_tracker_ = 2;
};

}  // namespace hetflow::exec
