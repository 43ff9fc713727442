#pragma once
// Where a steady-state iteration's time goes on the devices that compute, from a trace
// (simulated or measured) and its plan: compute by operation, communication not hidden
// behind compute by purpose, and idle time, adding up to the iteration time. Compute,
// exposed communication and idle are traces/figures.hpp's, over the steady state (the end of
// iteration 0 to the end of the last). Compute is split by operation as the cost model
// splits each task (CostModel::task_compute_parts_s: the operations of a decoder under
// operation costs, else the task's kind), in proportion, so a measured task keeps its
// measured duration; every pass of an operation counts under its name ("qkv (data)" is
// "qkv"). Figures are per iteration, mean over computing devices.
#include <string>
#include <utility>
#include <vector>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

struct Breakdown {
  int devices = 0;                 // computing devices averaged over
  double iteration_time_s = 0;     // compute + exposed communication + idle
  double compute_s = 0;
  std::vector<std::pair<std::string, double>> compute_by_operation_s;  // largest first
  double exposed_comm_s = 0;
  std::vector<std::pair<std::string, double>> exposed_comm_by_purpose_s;  // largest first
  double idle_s = 0;
};

// Leaves out the first `warmup` iterations as compute_metrics does (all but the last at most).
Breakdown compute_breakdown(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost,
                            int warmup = 1);

}  // namespace hetflow::traces
