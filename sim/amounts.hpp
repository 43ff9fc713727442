#pragma once
// What SimGrid is given must be an amount it can hold: a finite number of flops for a compute
// task, a byte count that fits 64 bits for a message. A plan's quantities are finite but may
// be as large as a double goes; the simulation refuses them before it starts, naming the task,
// rather than let the engine abort inside a running actor.
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "sim/simulator.hpp"

namespace hetflow::sim {

// Throws PlanError naming the first task whose amount SimGrid cannot hold, and Error for
// replayed durations (SimOptions::compute_s) of the wrong count or out of range.
void check_amounts(const partition::Plan& plan, const partition::CostModel& cost, const SimOptions& options);

}  // namespace hetflow::sim
