#include "model/precision.hpp"

#include <stdexcept>

namespace hetflow::model {

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
  }
  return "fp32";
}

Precision parse_precision(std::string_view text) {
  if (text == "fp32") return Precision::fp32;
  if (text == "fp16") return Precision::fp16;
  if (text == "bf16") return Precision::bf16;
  throw std::invalid_argument("expected one of fp32, fp16, bf16, found '" + std::string(text) + "'");
}

}  // namespace hetflow::model
