#pragma once
// Pictures of a trace as standalone SVG (plain text, no scripts, no external fonts or files):
//  - timeline_svg: the pipeline drawn as the GPipe and Megatron papers draw schedules. One row
//    per device (its name on the left), one lane per stream in the row (the "compute" stream
//    first, communication streams below it, thinner); one box per event on its lane, from
//    start_s to end_s. Forward, backward and weight-gradient (W) boxes take their micro-batch's
//    colour from a fixed 10-colour qualitative palette (cycling): forward solid, backward a
//    darker shade, W a light tint with an outline in the micro-batch colour. The optimizer,
//    transfers and collectives are neutral greys. The micro-batch number is written in a box
//    wide enough to hold it. The background is white, so idle time shows as white gaps. A time
//    axis in seconds (ticks at 1-2-5 steps), a title (plan, source, fingerprint), a subtitle
//    (which iterations and devices are drawn) and a legend.
//  - utilization_svg: a horizontal bar per device, stacked compute / exposed communication /
//    idle shares of the drawn iterations' window, with percentages: the figures of
//    traces/figures.hpp (compute is the utilisation the summary shows), so iterations 1 to
//    the last draw exactly the steady state the summary and the breakdown report.
// Both are pure functions of the trace and the options: the same input gives the same bytes.
// Text from the trace (plan, device and stream names) is XML-escaped. The <svg> element's
// width and height are whole pixels (what a renderer's PNG measures at 96 dpi).
// Beyond `max_devices` devices, rows are sampled evenly (first and last kept) and the subtitle
// says so. A trace with no events, an event with device < 0 or an iteration range that selects
// no event is refused with InputError (file "<trace>"; the command names the real file);
// anything read_trace_csv accepts is drawn.
#include <optional>
#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace hetflow::traces {

// Iterations first..last, inclusive; last < 0 means the last in the trace.
struct IterationRange {
  int first = 0;
  int last = -1;
};

struct TimelineOptions {
  // Unset: every iteration, unless the trace holds more than kDefaultMaxEvents events; then
  // the first iterations whose events fit (at least one), and the subtitle says so.
  std::optional<IterationRange> iterations;
  int max_devices = 64;  // more devices than this: rows sampled evenly
  int width_px = 1400;   // of the whole picture
};

inline constexpr size_t kDefaultMaxEvents = 40000;

// What a picture draws, as both functions choose it.
struct TimelineView {
  int first_iteration = 0, last_iteration = 0;  // drawn, inclusive
  int trace_first_iteration = 0, trace_last_iteration = 0;  // in the whole trace
  bool iterations_cut = false;                  // the default choice stopped short of the last
  int trace_devices = 0;                        // device ids 0 .. trace_devices - 1
  std::vector<int> devices;                     // drawn, in increasing id order
  bool sampled = false;                         // devices.size() < trace_devices
  double start_s = 0, end_s = 0;                // span of the drawn events
  size_t events = 0;                            // drawn (on drawn devices, in drawn iterations)
};

TimelineView timeline_view(const Trace& trace, const TimelineOptions& options = {});

std::string timeline_svg(const Trace& trace, const TimelineOptions& options = {});

// A device's shares of the drawn iterations' window (figures.hpp: from the end of the
// iteration before the first drawn to the end of the last); they sum to 1 (all 0 when the
// window is empty).
struct UtilizationShare {
  double busy = 0, communicating = 0, idle = 0;
};
// One per view.devices entry, in that order.
std::vector<UtilizationShare> utilization_shares(const Trace& trace, const TimelineView& view);

std::string utilization_svg(const Trace& trace, const TimelineOptions& options = {});

// What the pictures are made of, exposed for tests.
std::string xml_escape(const std::string& text);
// A tick step of 1, 2 or 5 x 10^k such that `span` holds about `target` ticks (span > 0).
double tick_step(double span, int target);

}  // namespace hetflow::traces
