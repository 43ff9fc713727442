#include "exec/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::exec {

double LrSchedule::at(long long step) const {
  // Megatron's get_lr, in its order.
  if (warmup_iters > 0 && step <= warmup_iters) return lr * static_cast<double>(step) / static_cast<double>(warmup_iters);
  if (style == Style::constant) return lr;
  if (step > decay_iters) return min_lr;
  if (style == Style::inverse_square_root) {
    const double b = static_cast<double>(std::max<long long>(samples_per_step, 1));
    const double warmup = std::max(static_cast<double>(warmup_iters) * b, 1.0);
    const double n = std::max(static_cast<double>(step) * b, 1.0);
    return std::max(min_lr, lr * std::sqrt(warmup) / std::sqrt(n));
  }
  const double ratio = static_cast<double>(step - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  const double coeff = style == Style::linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (lr - min_lr);
}

void LrSchedule::check() const {
  auto fail = [](const char* option, const std::string& why) { throw InputError("<command line>", 0, option, why); };
  if (warmup_iters < 0) fail("--lr-warmup-iters", "expected a whole number >= 0");
  if (!(min_lr >= 0) || !(min_lr <= lr)) {
    fail("--min-lr", "expected a rate from 0 to --lr (" + model::units::format_number(lr) + "), found " +
                         model::units::format_number(min_lr));
  }
  if (style != Style::constant && decay_iters <= warmup_iters) {
    fail("--lr-decay-iters", "expected more steps (" + std::to_string(decay_iters) + ") than --lr-warmup-iters (" +
                                 std::to_string(warmup_iters) + ") for a " + std::string(to_string(style)) + " decay");
  }
}

std::string LrSchedule::describe() const {
  std::string text(to_string(style));
  if (style == Style::inverse_square_root) {
    text += ", not below " + model::units::format_number(min_lr) + ", then " + model::units::format_number(min_lr) +
            " after step " + std::to_string(decay_iters);
  } else if (style != Style::constant) {
    text += " to " + model::units::format_number(min_lr) + " by step " + std::to_string(decay_iters);
  }
  if (warmup_iters > 0) text += ", after " + std::to_string(warmup_iters) + " of warm-up from 0";
  return text;
}

std::string_view to_string(LrSchedule::Style style) {
  switch (style) {
    case LrSchedule::Style::constant: return "constant";
    case LrSchedule::Style::linear: return "linear";
    case LrSchedule::Style::cosine: return "cosine";
    case LrSchedule::Style::inverse_square_root: return "inverse-square-root";
  }
  return "constant";
}

bool parse_lr_style(std::string_view name, LrSchedule::Style& style) {
  for (const auto s : {LrSchedule::Style::constant, LrSchedule::Style::linear, LrSchedule::Style::cosine,
                       LrSchedule::Style::inverse_square_root}) {
    if (name == to_string(s)) {
      style = s;
      return true;
    }
  }
  return false;
}

}  // namespace hetflow::exec
