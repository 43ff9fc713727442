#pragma once
// What a plan's communication adds up to: the bytes each communicator carries in one
// iteration. The conservation check compares it with what a back end's trace says it carried
// (traces/traffic.hpp): the same count, made from what ran.
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

// Per communicator (index into Plan::communicators): each member's collective task counts its
// collective's bytes (partition/collective.hpp's convention), each send and each receive its
// transfer's bytes, on the channel's communicator.
std::vector<double> planned_bytes_per_communicator(const Plan& plan);

// The communicator a transfer or collective task uses (-1 for compute tasks).
int communicator_of(const Plan& plan, const Task& task);

}  // namespace hetflow::partition
