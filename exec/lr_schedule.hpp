#pragma once
// The learning rate step by step: Megatron's OptimizerParamScheduler, iteration-based, with
// its option names (--lr-decay-style, --lr-warmup-iters, --lr-decay-iters, --min-lr) and
// semantics. Step n (the number of optimizer steps taken before it, skipped ones not
// counted, as Megatron advances its scheduler only after a successful step) trains at:
//  - warm-up, n <= warmup_iters (when warmup_iters > 0): lr * n / warmup_iters, so the
//    first step's rate is 0 (Megatron's --lr-warmup-init 0);
//  - constant: lr;
//  - after decay_iters: min_lr;
//  - otherwise, with r = (n - warmup_iters) / (decay_iters - warmup_iters):
//    linear min_lr + (lr - min_lr)(1 - r); cosine min_lr + (lr - min_lr)(1 + cos(pi r)) / 2;
//    inverse-square-root max(min_lr, lr sqrt(max(W, 1)) / sqrt(max(N, 1))), W and N the
//    warm-up and the steps taken counted in samples (Megatron counts its schedule in samples:
//    B of them a step, B the global batch), which only matters without a warm-up:
//    lr / sqrt(n B) then.
#include <string>
#include <string_view>

namespace hetflow::exec {

struct LrSchedule {
  enum class Style { constant, linear, cosine, inverse_square_root };
  Style style = Style::constant;
  double lr = 3e-4;  // the peak (Megatron's --lr)
  double min_lr = 0;
  long long warmup_iters = 0;
  long long decay_iters = 0;  // when the decay ends (> warmup_iters unless constant)
  long long samples_per_step = 1;  // the global batch: inverse-square-root counts samples

  double at(long long step) const;  // the rate of step `step` (0 = the first)
  // Throws InputError (file "<command line>", the option's name) when the settings cannot
  // make a schedule: min_lr above lr, decay_iters not after warmup_iters.
  void check() const;
  // "constant", or e.g. "cosine to 3e-05 by step 100, after 10 of warm-up from 0".
  std::string describe() const;
};

std::string_view to_string(LrSchedule::Style style);  // Megatron's spelling: "inverse-square-root"
// Megatron's spelling read into `style`; false when `name` is not a style.
bool parse_lr_style(std::string_view name, LrSchedule::Style& style);

}  // namespace hetflow::exec
