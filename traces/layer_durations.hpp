#pragma once
// Measured compute durations attributed to the layers they computed, so that another plan of
// the same network (another schedule, micro-batch size or count, other stage cuts, data
// parallelism) can be replayed with them: `hetflow replay TRACE --plan A --as-plan B`.
//
// How a measured task is split (each compute task's mean duration over the iterations after
// the first, all of it: on a measured device fixed costs come with layers, not tasks; the
// mean, since durations add up to iteration times):
//  - a task's FLOPs are split over its layers as the plan builder counts them (a layer's
//    forward or backward FLOPs per sample, divided by the tensor-parallel degree where the
//    layer is split), and layers that compute the same thing (kind, shape, FLOPs: the blocks
//    of a decoder) share one time per FLOP, fitted over every task by least squares on
//    relative error: work(task) = sum over classes of FLOPs(task, class) x rate(class);
//    classes that always appear together get equal rates, and none is negative;
//  - a backward's recomputation is timed at the forward rates, the rest of it fitted;
//  - the optimizer step (no layers) by its time per FLOP on the GPU type.
// Rates are kept per (GPU type, phase: forward or backward work, layer). A task of the other
// plan takes the sum over its layers of FLOPs x rate, at the micro-batch size measured; at
// another micro-batch size each rate changes as the calibration's time per FLOP does for a
// task of the measured size grown or shrunk in proportion (flat by default: time scales with
// FLOPs). A layer or GPU type never measured leaves the whole task to the cost model (counted
// in `modelled_tasks`).
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "model/calibration.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

struct LayerRates {
  enum Phase { forward_work = 0, backward_work = 1 };
  struct Rate {
    double s_per_flop = 0;
    double task_flops = 0;  // the size of the tasks it was measured in (median)
  };
  std::map<std::tuple<std::string, int, int>, Rate> layer;  // (GPU type, phase, layer)
  std::map<std::string, Rate> optimizer;                    // per GPU type
  int micro_batch_size = 1;                                 // the measured plan's
  int measured_tasks = 0;                                   // compute tasks of the trace used
};

// Throws InputError (naming `trace_name`) when the trace is not the plan's or has no compute
// task with FLOPs that ran to completion.
LayerRates attribute_to_layers(const Trace& trace, const partition::Plan& plan, const std::string& trace_name);

struct TransferredDurations {
  std::vector<double> task_s;  // per task of the target plan (one iteration); -1 for non-compute
  int measured_tasks = 0;      // compute tasks timed from measured layers
  int modelled_tasks = 0;      // left to the cost model (a layer or GPU type never measured)
};

// The target plan's compute task durations from the rates. `cost` is the target's cost
// model (with the calibration whose overheads and curves apply).
TransferredDurations transfer_durations(const LayerRates& rates, const partition::Plan& target,
                                        const partition::CostModel& cost, const model::Calibration& calibration);

}  // namespace hetflow::traces
