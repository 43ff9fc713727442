#pragma once
// The analytic estimate of a plan: its critical path under the cost model, with no
// contention (every transfer gets its route's full bandwidth). Fast: one pass over the task
// graph in dependency order.
#include <vector>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "partition/task_order.hpp"

namespace hetflow::partition {

struct Estimate {
  // Steady state: (end of the last iteration - end of the first) / (iterations - 1) with
  // several iterations, else the makespan.
  double iteration_time_s = 0;
  double makespan_s = 0;
  // Idle share of the pipeline phase: per device and iteration, 1 - (its F/B/W time) / (the
  // span of its virtual worker's F/B/W tasks in that iteration), averaged over devices.
  // Equals (p-1)/(m+p-1) for GPipe and 1F1B with equal stages and free communication.
  double bubble_fraction = 0;
  double throughput_samples_per_s = 0;
  std::vector<double> busy_s;             // per device, per iteration: compute time (F/B/W, optimizer, TP)
  std::vector<double> peak_memory_bytes;  // per device, from the plan's memory model
  std::vector<double> task_start_s, task_end_s;  // per task
};

// Throws PlanError (naming the tasks on the cycle) when the plan deadlocks.
Estimate estimate_plan(const Plan& plan, const CostModel& cost);
// The same, reusing an order already computed (validation computes one).
Estimate estimate_plan(const Plan& plan, const CostModel& cost, const TaskOrder& order);

// Duration of one task's unit under the cost model: compute, transfer or collective.
double task_duration_s(const Plan& plan, const CostModel& cost, int task);

}  // namespace hetflow::partition
