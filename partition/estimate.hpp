#pragma once
// The analytic estimate of a plan: its critical path under the cost model, with no
// contention (every transfer gets its route's full bandwidth), over all its iterations. Fast:
// one pass over the task graph in dependency order per iteration. A load task lasts its
// steady-state time at its share of the loader (partition/loading.hpp, load_time_s), so an
// input-bound plan's critical path runs along its load streams at the loader's rate.
#include <vector>

#include "partition/collective_steps.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "partition/task_order.hpp"

namespace hetflow::partition {

struct Estimate {
  // Steady state: (end of the last iteration - end of the first) / (iterations - 1) with
  // several iterations, else the makespan.
  double iteration_time_s = 0;
  double makespan_s = 0;
  // See BubbleMeter (input wait excluded). Equals (p-1)/(m+p-1) for GPipe and 1F1B with
  // equal stages and free communication.
  double bubble_fraction = 0;
  // Per iteration in the steady state, mean over the devices that run passes: the time a
  // device waits for its load (input_wait_span); 0 where the plan has no load tasks.
  double input_wait_s = 0;
  double throughput_samples_per_s = 0;
  double throughput_tokens_per_s = 0;
  // The GPUs' own rate: the same critical path with load tasks that take no time (what the
  // plan would do with an unbounded loader); the figures above where the plan has no loads.
  double compute_iteration_time_s = 0;
  double compute_throughput_samples_per_s = 0;
  std::vector<double> busy_s;             // per device, per iteration: compute time (F/B/W, optimizer)
  std::vector<double> peak_memory_bytes;  // per device, from the plan's memory model
};

// Throws PlanError (naming the tasks on the cycle) when the plan deadlocks.
Estimate estimate_plan(const Plan& plan, const CostModel& cost);
// The same, reusing an order already computed (validation computes one).
Estimate estimate_plan(const Plan& plan, const CostModel& cost, const TaskOrder& order);

// Duration of one task's unit under the cost model: compute (with the collectives inside it),
// transfer, collective or load (load_time_s).
double task_duration_s(const Plan& plan, const CostModel& cost, int task);
// The time a compute task spends in its in-task collectives (Plan::inside), one after another
// on its stream: each collective's messages, all of which the task performs; a message that
// overlaps the work (Collective::until) only what outlasts its part of the task's compute.
double in_task_time_s(const Plan& plan, const CostModel& cost, int task);

// What the collective steps and the cost model need of one of the plan's collectives.
CollectiveSpec collective_spec(const Plan& plan, const Collective& collective);

// The bubble metric, one definition for the estimate and for measured or simulated traces:
// per device that runs pipeline compute and per iteration, 1 - (its F/B/W time + its input
// wait inside the span) / (the span of its virtual worker's F/B/W tasks in that iteration),
// averaged over both. A wait for the data loader (input_wait_span, partition/loading.hpp) is
// the loader's, not the pipeline's: a device's passes, its input wait and its bubble add up
// to the span. Idle time downstream of a late input (a later stage waiting for an activation)
// stays bubble: only the device that loads waits for input.
class BubbleMeter {
 public:
  BubbleMeter(const Plan& plan, int iterations);
  // A pipeline compute task (forward, backward, backward_weight) of `device` ran then.
  void add(int device, int iteration, double start_s, double end_s);
  // `device` waited for the load of one of its forwards of `iteration` then (the part
  // inside the span counts; a wait overlaps none of the device's passes).
  void add_input_wait(int device, int iteration, double from_s, double to_s);
  // Averaged over iterations in [first_iteration, end_iteration) (end -1: to the last).
  double fraction(int first_iteration = 0, int end_iteration = -1) const;

 private:
  struct Wait {
    int device, iteration;
    double from_s, to_s;
  };
  int iterations_;
  std::vector<int> worker_of_;                     // per device, -1 outside every worker
  std::vector<double> busy_;                       // per device and iteration
  std::vector<double> span_begin_, span_end_;      // per worker and iteration
  std::vector<Wait> waits_;                        // clipped to the span when the span is known
};

}  // namespace hetflow::partition
