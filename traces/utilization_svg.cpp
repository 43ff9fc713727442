// utilization_svg: per device, the drawn iterations' time split into compute / exposed
// communication / idle (traces/figures.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "traces/figures.hpp"
#include "traces/svg_parts.hpp"
#include "traces/timeline_svg.hpp"

namespace hetflow::traces {

namespace {

const char* kBusy = "#4e79a7";
const char* kComm = "#f28e2b";
const char* kIdle = "#ececec";

std::string percent(double share) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", 100 * share);
  return buffer;
}

}  // namespace

std::vector<UtilizationShare> utilization_shares(const Trace& trace, const TimelineView& view) {
  // The drawn iterations' window, split as every report splits it (figures.hpp).
  const Window window = iteration_window(iteration_ends_s(trace), view.first_iteration, view.last_iteration);
  const std::vector<DeviceTime> times = device_times(trace, window);
  const double span = window.length_s();
  std::vector<UtilizationShare> shares;
  for (int d : view.devices) {
    UtilizationShare s;
    if (span > 0 && static_cast<size_t>(d) < times.size()) {
      const DeviceTime& t = times[static_cast<size_t>(d)];
      s.busy = t.compute_s / span;
      s.communicating = t.exposed_comm_s / span;
      s.idle = t.idle_s / span;
    }
    shares.push_back(s);
  }
  return shares;
}

std::string utilization_svg(const Trace& trace, const TimelineOptions& options) {
  const TimelineView view = timeline_view(trace, options);
  const std::vector<UtilizationShare> shares = utilization_shares(trace, view);
  const auto n = static_cast<double>(view.devices.size());
  const double bar_h = std::clamp(std::round(240 / n), 10.0, 22.0), gap = std::max(3.0, std::round(bar_h * 0.3));
  const double name_size = std::min(12.0, bar_h * 0.8), width = std::clamp(options.width_px, 400, 20000);
  size_t longest = 8;
  std::vector<std::string> names;
  for (int d : view.devices) {
    const auto i = static_cast<size_t>(d);
    names.push_back(svg::clip(i < trace.device_names.size() && !trace.device_names[i].empty() ? trace.device_names[i]
                                                                                            : "device " + std::to_string(d),
                              40));
    longest = std::max(longest, names.back().size());
  }
  const double x0 = std::clamp(static_cast<double>(longest) * name_size * 0.6 + 24, 90.0, 320.0);
  const double x1 = width - 250;  // the percentages are written right of the bars
  const std::vector<svg::LegendItem> items = {{kBusy, "none", "computing (F, B, W, optimizer)"},
                                              {kComm, "none", "exposed communication (moving data, not computing)"},
                                              {kIdle, "none", "idle"}};
  const double top = 52 + svg::legend_height(items, 16, width - 16) + 8;
  const double bottom = top + n * (bar_h + gap);
  svg::Builder b(static_cast<int>(width), static_cast<int>(std::ceil(bottom + 40)));
  svg::heading(b, svg::title_of(trace, "utilization"), svg::subtitle_of(trace, view));
  svg::legend(b, items, 16, width - 16, 52);
  for (int p = 0; p <= 100; p += 25) b.line(x0 + (x1 - x0) * p / 100, top - 4, x0 + (x1 - x0) * p / 100, bottom, "#dddddd");
  double y = top;
  for (size_t i = 0; i < shares.size(); ++i) {
    const UtilizationShare& s = shares[i];
    b.text({.x = x0 - 6, .y = y + bar_h / 2 + name_size * 0.35, .size = name_size, .anchor = "end"}, names[i]);
    double x = x0;
    for (const auto& [share, colour] : {std::pair{s.busy, kBusy}, {s.communicating, kComm}, {s.idle, kIdle}}) {
      const double w = share * (x1 - x0);
      if (w > 0) b.rect(x, y, w, bar_h, colour, "none", names[i] + ": " + percent(share), "bar");
      const double size = std::min(10.5, bar_h * 0.75);
      if (w >= 44 && bar_h >= 10) {
        b.text({.x = x + w / 2, .y = y + bar_h / 2 + size * 0.36, .size = size, .anchor = "middle",
                .fill = colour == kIdle ? "#444444" : "#ffffff"},
               percent(share));
      }
      x += w;
    }
    b.text({.x = x1 + 10, .y = y + bar_h / 2 + 4, .size = std::min(11.0, name_size), .fill = "#333"},
           "compute " + percent(s.busy) + " \u00b7 comm " + percent(s.communicating) + " \u00b7 idle " + percent(s.idle));
    y += bar_h + gap;
  }
  b.line(x0, bottom, x1, bottom, "#444");
  for (int p = 0; p <= 100; p += 25) {
    b.text({.x = x0 + (x1 - x0) * p / 100, .y = bottom + 16, .size = 10.5, .anchor = "middle", .fill = "#444"},
           std::to_string(p) + "%");
  }
  b.text({.x = x1, .y = bottom + 32, .size = 10.5, .anchor = "end", .fill = "#444"}, "share of the drawn iterations' time");
  return b.finish();
}

}  // namespace hetflow::traces
