#pragma once
// The figures every report of a trace shows, each defined here once: the summary of
// `simulate` and `run`, `--breakdown`, the `--metrics` CSV, `timeline --utilization` and
// `search`'s table all compute them with these functions (the README's "What the figures
// mean" says the same in words).
//
//  - An iteration ends when its last task ends, never before the iteration before it; its
//    window runs from the end of the iteration before (0 for the first) to its own end. The
//    steady state is the window of the iterations after the warm-up.
//  - In a window each instant of a device is one of three, in this order: compute while a
//    compute task runs (a forward, backward or W pass, the optimizer step); else input wait
//    (below); else exposed communication while a transfer or collective runs (tensor-parallel
//    ones too: nothing computes then), shared equally among the purposes active then; else
//    idle (pipeline bubbles and every other wait). Tasks are clipped to the window, so the
//    parts add up to its length exactly; idle_s counts input wait among its own.
//  - Input wait: while a device's next forward waits for its load (the data loader's
//    micro-batch, partition/loading.hpp) and nothing computes on the device. From when the
//    task before that forward on its stream ended (or the load started, if later) to when
//    the load ended (or the forward started, if earlier): partition::input_wait_span, which
//    the estimate uses too. It comes before communication: a transfer that runs while the
//    device waits for its input would hide behind the forward with a faster loader, so a
//    faster loader, not faster communication, gives that time back. A load itself is neither
//    compute nor communication: it runs on the host's loader.
//  - Utilisation is a device's compute time over the window: compute occupancy, not "busy
//    with anything".
//  - The computing devices are those that run a pass anywhere in the trace; means "over
//    computing devices" are over them, every window alike.
//  - MFU is the model's FLOPs (forward and backward passes, recomputation excluded) per
//    second over the sum of every device's peak at the run's precision.
//  - The bubble fraction is the pipeline's own measure (partition::BubbleMeter): per stage
//    device and iteration, the share of its virtual worker's pass span with neither a pass of
//    its own nor its input wait, so passes, input wait and bubble add up to the span. It
//    counts exposed communication and the optimizer inside the span as bubble and waits
//    outside it not at all, so it is not the idle share.
#include <map>
#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace hetflow::traces {

// When each iteration of the trace ends (index = iteration), non-decreasing.
std::vector<double> iteration_ends_s(const Trace& trace);

// A span of time [from_s, to_s].
struct Window {
  double from_s = 0, to_s = 0;
  double length_s() const { return to_s > from_s ? to_s - from_s : 0; }
};

// The window of iterations first..last (inclusive) given their ends; empty when out of range.
Window iteration_window(const std::vector<double>& ends_s, int first, int last);

// One device's time in a window, split as the header says.
struct DeviceTime {
  double compute_s = 0;
  double exposed_comm_s = 0;
  double idle_s = 0;
  double input_wait_s = 0;  // of idle_s: waiting for a load while nothing computed
  std::map<std::string, double> exposed_comm_by_purpose_s;  // partition::to_string(Purpose) -> s
};

// Per device of the trace (index = device id).
std::vector<DeviceTime> device_times(const Trace& trace, Window window);

// A span in which a device's next forward waited for its load (partition::input_wait_span),
// whatever else ran then; `iteration` is the forward's.
struct InputWait {
  int device = 0, iteration = 0;
  Window window;
};
// Every one in the trace, device by device; empty when it has no loads.
std::vector<InputWait> input_waits(const Trace& trace);

// Per device: whether it runs a pass (forward, backward, W) anywhere in the trace.
std::vector<bool> computing_devices(const Trace& trace);

// Model FLOPs per second over the peak; 0 when time or peak is not positive.
double mfu(double model_flops, double time_s, double peak_flops_per_s);

}  // namespace hetflow::traces
