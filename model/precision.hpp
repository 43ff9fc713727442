#pragma once
// Numeric precision of a training run: what one weight, gradient and activation element costs.
#include <string>
#include <string_view>

namespace hetflow::model {

// fp32: everything in 32-bit. fp16/bf16: mixed precision (16-bit weights, gradients and
// activations; fp32 master weights and optimizer state), as in Megatron-LM and DeepSpeed.
enum class Precision { fp32, fp16, bf16 };

// Bytes of one activation / weight / gradient element at this precision (4 or 2).
constexpr double element_bytes(Precision p) { return p == Precision::fp32 ? 4.0 : 2.0; }

// Adam's state per parameter: two fp32 moments, plus an fp32 master copy of the weights in
// mixed precision (12 B); fp32 training updates the weights in place (8 B).
constexpr double adam_state_bytes(Precision p) { return p == Precision::fp32 ? 8.0 : 12.0; }

std::string_view to_string(Precision p);
// Throws std::invalid_argument naming the accepted values.
Precision parse_precision(std::string_view text);

}  // namespace hetflow::model
