#pragma once
// GPU types: published peak specs of real parts, plus any a cluster file defines.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/precision.hpp"

namespace hetflow::model {

// Intra-node link technology a GPU usually comes with.
enum class LinkKind { pcie, nvlink, nvswitch };
std::string_view to_string(LinkKind k);
LinkKind parse_link_kind(std::string_view text);  // throws std::invalid_argument

// One GPU type. Peak rates are dense (no structured sparsity), from the vendor's data sheet.
struct GpuSpec {
  std::string name;                     // catalog key, e.g. "V100-32"
  std::string description;              // one line for `hetflow list`
  double fp16_flops_per_s = 0;          // dense FP16 peak, tensor cores where the part has them
  double bf16_flops_per_s = 0;          // dense BF16 peak; 0 = no BF16 arithmetic on this part
  double fp32_flops_per_s = 0;          // plain FP32 (CUDA cores, not TF32)
  double memory_bytes = 0;              // device memory
  double memory_bandwidth_bytes_per_s = 0;
  LinkKind usual_link = LinkKind::pcie;  // the interconnect it usually ships with
  double usual_link_bandwidth_bytes_per_s = 0;  // per GPU, one direction

  // Peak arithmetic rate for a run at this precision. A part without BF16 units runs bf16
  // at its FP32 rate (emulated, as frameworks do), never faster.
  double peak_flops_per_s(Precision p) const;

  bool operator==(const GpuSpec&) const = default;
};

// The built-in catalog, in a stable order. Each entry's source is cited in gpu_catalog.cpp.
const std::vector<GpuSpec>& builtin_gpus();

// Case-insensitive lookup in the built-in catalog; nullptr when unknown.
const GpuSpec* find_builtin_gpu(std::string_view name);

// Up to `count` names from `known` closest to `name` (edit distance, case-insensitive),
// for "unknown GPU type 'V10', did you mean V100-16, V100-32?" messages.
std::vector<std::string> nearest_names(std::string_view name, const std::vector<std::string>& known,
                                       size_t count = 3);
// The one of `known` that `name` most likely misspells: the nearest within a third of its
// length in edits (at least 1, at most 3; case-insensitive), not equal to it; none otherwise.
// "pipline" -> "pipeline", "bandwith" -> "bandwidth", "plot" -> none.
std::optional<std::string> likely_misspelling(std::string_view name, const std::vector<std::string>& known);

}  // namespace hetflow::model
