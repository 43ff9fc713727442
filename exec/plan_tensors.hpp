#pragma once
// Finding a task's tensors by kind: how the executor tells a pass's weight, activation or
// gradient among what the plan says it reads and writes.
#include <span>

#include "partition/plan.hpp"

namespace hetflow::exec {

// The first of `ids` whose tensor is of `kind`, or -1.
inline int tensor_of_kind(const partition::Plan& plan, std::span<const int> ids, partition::TensorKind kind) {
  for (const int t : ids) {
    if (plan.tensor(t).kind == kind) return t;
  }
  return -1;
}

}  // namespace hetflow::exec
