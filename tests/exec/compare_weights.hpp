#pragma once
// Compares two sets of trained weights tensor by tensor: ||a - b|| / ||b|| for each, the
// measure the distributed-vs-one-device and the PyTorch tests bound.
//
// One slice is measured apart: the key part of GPT-2's c_attn bias. Adding a constant to
// every key shifts all of a query's scores equally and softmax ignores it, so that bias's
// true gradient is exactly zero; what it receives is rounding noise, which Adam normalises
// into updates of lr |g| / (|g| + eps) a step, far below lr when |g| is far below eps. Its
// error is reported as the largest absolute difference instead of a relative one (relative
// to noise means nothing); tests bound it by 1% of what real gradients would move it.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "exec/safetensors.hpp"

namespace hetflow::test_support {

struct WeightsDifference {
  double whole_relative = 0;  // ||a - b|| / ||b|| over all of the model (the key bias slice left out)
  double worst_relative = 0;  // of the tensor that differs most (the key bias slice left out)
  std::string worst;          // the tensor it is
  double key_bias_abs = 0;    // largest |a - b| in GPT-2's key bias slices
  bool same_names = true;
};

inline WeightsDifference compare_weights(const exec::SafetensorsFile& a, const exec::SafetensorsFile& b) {
  WeightsDifference out;
  std::map<std::string, const exec::NamedTensor*> by_name;
  for (const auto& t : b.tensors) by_name[t.name] = &t;
  out.same_names = a.tensors.size() == b.tensors.size();
  double all_diff = 0, all_norm = 0;
  for (const auto& t : a.tensors) {
    const auto found = by_name.find(t.name);
    if (found == by_name.end() || found->second->shape != t.shape) {
      out.same_names = false;
      continue;
    }
    const auto& other = found->second->data;
    const bool key_bias = t.name.find("attn.c_attn.bias") != std::string::npos;
    const size_t third = t.data.size() / 3;
    auto relative = [&](size_t begin, size_t end) {
      double diff = 0, norm = 0;
      for (size_t i = begin; i < end; ++i) {
        diff += std::pow(static_cast<double>(t.data[i]) - other[i], 2);
        norm += std::pow(static_cast<double>(other[i]), 2);
      }
      all_diff += diff;
      all_norm += norm;
      return std::sqrt(diff / std::max(norm, 1e-300));
    };
    double r = 0;
    if (key_bias) {
      r = std::max(relative(0, third), relative(2 * third, t.data.size()));
      for (size_t i = third; i < 2 * third; ++i) {
        out.key_bias_abs = std::max(out.key_bias_abs, std::abs(static_cast<double>(t.data[i]) - other[i]));
      }
    } else {
      r = relative(0, t.data.size());
    }
    if (r > out.worst_relative) {
      out.worst_relative = r;
      out.worst = t.name;
    }
  }
  out.whole_relative = std::sqrt(all_diff / std::max(all_norm, 1e-300));
  return out;
}

}  // namespace hetflow::test_support
