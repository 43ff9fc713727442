#include "traces/timeline_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "model/error.hpp"
#include "model/units.hpp"
#include "traces/svg_parts.hpp"

namespace hetflow::traces {

namespace {

// Tableau 10: a qualitative palette that stays apart in print and for common colour blindness.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kPaletteSize = 10;
const char* kOptimizer = "#4d4d4d";
const char* kCollective = "#8c8c8c";
const char* kTransfer = "#c4c4c4";
const char* kOther = "#e6e6e6";

struct Rgb {
  double r, g, b;
};
Rgb rgb(const std::string& hex) {
  const auto part = [&](int i) { return static_cast<double>(std::stoi(hex.substr(1 + 2 * i, 2), nullptr, 16)); };
  return {part(0), part(1), part(2)};
}
std::string hex(Rgb c) {
  char buffer[8];
  const auto byte = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 255.0))); };
  std::snprintf(buffer, sizeof buffer, "#%02x%02x%02x", byte(c.r), byte(c.g), byte(c.b));
  return buffer;
}
std::string darker(const std::string& c) {
  const Rgb v = rgb(c);
  return hex({v.r * 0.55, v.g * 0.55, v.b * 0.55});
}
std::string lighter(const std::string& c) {
  const Rgb v = rgb(c);
  return hex({v.r + (255 - v.r) * 0.62, v.g + (255 - v.g) * 0.62, v.b + (255 - v.b) * 0.62});
}
bool dark(const std::string& c) {
  const Rgb v = rgb(c);
  return 0.299 * v.r + 0.587 * v.g + 0.114 * v.b < 140;
}

struct Look {
  std::string fill, stroke = "none";
  bool numbered = false;  // write the micro-batch number in the box
};

Look look_of(const Event& e) {
  using partition::TaskKind;
  switch (e.kind) {
    case TaskKind::forward:
    case TaskKind::backward:
    case TaskKind::backward_weight: {
      const std::string base = e.microbatch >= 0 ? kPalette[e.microbatch % kPaletteSize] : "#9a9a9a";
      if (e.kind == TaskKind::forward) return {base, "none", e.microbatch >= 0};
      if (e.kind == TaskKind::backward) return {darker(base), "none", e.microbatch >= 0};
      return {lighter(base), darker(base), e.microbatch >= 0};
    }
    case TaskKind::optimizer:
    case TaskKind::host_optimizer: return {kOptimizer};
    case TaskKind::collective: return {kCollective};
    case TaskKind::send:
    case TaskKind::recv:
    case TaskKind::to_host:
    case TaskKind::to_device: return {kTransfer};
    case TaskKind::load: return {kOther, "#808080"};
  }
  return {kOther, "#808080"};
}

std::string tooltip(const Event& e, const std::string& device) {
  using partition::TaskKind;
  const std::string letter = e.kind == TaskKind::forward ? "F" : e.kind == TaskKind::backward ? "B" : e.kind == TaskKind::backward_weight ? "W" : "";
  std::string s = letter.empty() ? std::string(partition::to_string(e.kind)) : letter + std::to_string(e.microbatch);
  if (!partition::is_compute(e.kind)) s += " " + std::string(partition::to_string(e.purpose)) + " " + model::units::human_bytes(e.bytes);
  if (e.stage >= 0) s += ", stage " + std::to_string(e.stage);
  s += ", iteration " + std::to_string(e.iteration) + ", task " + std::to_string(e.task) + " on " + device + " (" +
       e.stream + "): " + model::units::human_time_s(e.end_s - e.start_s) + " from " +
       model::units::format_number(e.start_s) + " s";
  return svg::clip(s, 300);
}

std::string device_name(const Trace& trace, int device) {
  const auto d = static_cast<size_t>(device);
  return d < trace.device_names.size() && !trace.device_names[d].empty() ? trace.device_names[d]
                                                                          : "device " + std::to_string(device);
}

bool drawn(const TimelineView& view, const Event& e) {
  return e.iteration >= view.first_iteration && e.iteration <= view.last_iteration &&
         std::binary_search(view.devices.begin(), view.devices.end(), e.device);
}

// Lanes of one device: "compute" first, then its other streams by name; beyond kMaxLanes,
// the remaining streams share the last lane (a parameter server talks to every worker).
constexpr size_t kMaxLanes = 12;
struct Lanes {
  std::vector<std::string> labels;
  std::map<std::string, size_t> of_stream;
};
Lanes lanes_of(const std::vector<const Event*>& events) {
  std::set<std::string> streams;
  for (const Event* e : events) streams.insert(e->stream);
  std::vector<std::string> names = {"compute"};
  for (const std::string& s : streams) {
    if (s != "compute") names.push_back(s);
  }
  const size_t kept = names.size() > kMaxLanes ? kMaxLanes - 1 : names.size();
  Lanes lanes;
  for (size_t i = 0; i < names.size(); ++i) lanes.of_stream[names[i]] = std::min(i, kept);
  lanes.labels.assign(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(kept));
  if (kept < names.size()) lanes.labels.push_back(std::to_string(names.size() - kept) + " more streams");
  return lanes;
}

// Where things go: the time axis maps [start_s, start_s + span_s] onto [x0, x1].
struct Frame {
  double x0, x1, start_s, span_s;
  double lane_h, comm_h, gap, name_size;
  double x(double t) const { return x0 + (t - start_s) / span_s * (x1 - x0); }
};

// Ticks at multiples of a 1-2-5 step inside the span (at most a few hundred, whatever the numbers).
std::vector<double> ticks_of(const Frame& f, double step) {
  std::vector<double> ticks;
  const double first = std::ceil(f.start_s / step - 1e-9), end = f.start_s + f.span_s * (1 + 1e-9);
  for (int i = 0; i < 500 && (first + i) * step <= end; ++i) {
    const double t = (first + i) * step;
    if (ticks.empty() || t > ticks.back()) ticks.push_back(t);
  }
  return ticks;
}

// One device's row from y down; returns the y below it.
double draw_row(svg::Builder& b, const Frame& f, double y, const std::string& name, const std::vector<const Event*>& events) {
  const Lanes lanes = lanes_of(events);
  std::vector<std::pair<double, double>> lane_at;  // (y, height) per lane
  double lane_y = y;
  for (const std::string& label : lanes.labels) {
    const double h = lane_at.empty() ? f.lane_h : f.comm_h;
    b.rect(f.x0, lane_y, f.x1 - f.x0, h, "none", "#d9d9d9");
    if (!lane_at.empty() && f.comm_h >= 7) {
      b.text({.x = f.x0 - 6, .y = lane_y + h * 0.8, .size = std::min(9.0, f.comm_h), .anchor = "end", .fill = "#888"},
             svg::clip(label, 24));
    }
    lane_at.push_back({lane_y, h});
    lane_y += h;
  }
  b.text({.x = f.x0 - 6, .y = y + f.lane_h / 2 + f.name_size * 0.35, .size = f.name_size, .anchor = "end"},
         svg::clip(name, 40));
  for (const Event* e : events) {
    const auto [ly, lh] = lane_at[lanes.of_stream.at(e->stream)];
    const Look look = look_of(*e);
    const double w = std::max(1.0, f.x(e->end_s) - f.x(e->start_s)), x = std::min(f.x(e->start_s), f.x1 - w);
    b.rect(x, ly + 0.5, w, lh - 1, look.fill, look.stroke, tooltip(*e, name), "ev");
    const std::string label = std::to_string(e->microbatch);
    const double size = std::min(11.0, lh * 0.72);
    if (look.numbered && lh >= 9 && w >= static_cast<double>(label.size()) * size * 0.62 + 3) {
      b.text({.x = x + w / 2, .y = ly + lh / 2 + size * 0.36, .size = size, .anchor = "middle",
              .fill = dark(look.fill) ? "#ffffff" : "#222222"},
             label);
    }
  }
  return lane_y + f.gap;
}

std::vector<svg::LegendItem> timeline_legend(int microbatches) {
  std::vector<svg::LegendItem> items = {
      {kPalette[0], "none", "forward: solid"},
      {darker(kPalette[0]), "none", "backward: dark"},
      {lighter(kPalette[0]), darker(kPalette[0]), "weight gradient W: light, outlined"},
      {kOptimizer, "none", "optimizer"},
      {kCollective, "none", "collective"},
      {kTransfer, "none", "send / recv"},
      {"#ffffff", "#bbbbbb", "idle"}};
  for (int m = 0; m < std::min(microbatches, kPaletteSize); ++m) {
    items.push_back({kPalette[m], "none", m == 0 ? "micro-batch 0" : std::to_string(m)});
  }
  if (microbatches > kPaletteSize) items.push_back({"#ffffff", "none", "(colours repeat every 10)"});
  return items;
}

}  // namespace

TimelineView timeline_view(const Trace& trace, const TimelineOptions& options) {
  if (trace.events.empty()) throw InputError("<trace>", 0, "events", "the trace has no events; there is nothing to draw");
  TimelineView v;
  std::map<int, size_t> per_iteration;
  long long devices = static_cast<long long>(trace.device_names.size());
  for (const Event& e : trace.events) {
    if (e.device < 0) throw InputError("<trace>", 0, "device", "expected a device id >= 0, found " + std::to_string(e.device));
    devices = std::max(devices, e.device + 1LL);
    ++per_iteration[e.iteration];
  }
  v.trace_devices = static_cast<int>(std::min<long long>(devices, std::numeric_limits<int>::max()));
  v.trace_first_iteration = per_iteration.begin()->first;
  v.trace_last_iteration = per_iteration.rbegin()->first;
  if (options.iterations) {
    v.first_iteration = options.iterations->first;
    v.last_iteration = options.iterations->last < 0 ? v.trace_last_iteration : options.iterations->last;
    const auto hit = per_iteration.lower_bound(v.first_iteration);
    if (v.last_iteration < v.first_iteration || hit == per_iteration.end() || hit->first > v.last_iteration) {
      throw InputError("<trace>", 0, "iterations",
                       "the trace has iterations " + std::to_string(v.trace_first_iteration) + "-" +
                           std::to_string(v.trace_last_iteration) + "; " + std::to_string(v.first_iteration) + ":" +
                           (options.iterations->last < 0 ? "" : std::to_string(v.last_iteration)) +
                           " selects none of its events");
    }
  } else {
    size_t total = 0;
    v.first_iteration = v.last_iteration = v.trace_first_iteration;
    for (const auto& [iteration, count] : per_iteration) {
      if (total > 0 && total + count > kDefaultMaxEvents) break;
      total += count;
      v.last_iteration = iteration;
    }
    v.iterations_cut = v.last_iteration < v.trace_last_iteration;
  }
  const auto shown = static_cast<int>(std::clamp<long long>(options.max_devices, 1, devices));
  v.sampled = shown < devices;
  for (int i = 0; i < shown; ++i) {
    const double at = shown == 1 ? 0 : static_cast<double>(i) * static_cast<double>(devices - 1) / (shown - 1);
    v.devices.push_back(static_cast<int>(std::lround(at)));
  }
  bool first = true;
  for (const Event& e : trace.events) {
    if (e.iteration < v.first_iteration || e.iteration > v.last_iteration) continue;
    v.start_s = first ? e.start_s : std::min(v.start_s, e.start_s);
    v.end_s = first ? e.end_s : std::max(v.end_s, e.end_s);
    first = false;
    if (std::binary_search(v.devices.begin(), v.devices.end(), e.device)) ++v.events;
  }
  return v;
}

std::string timeline_svg(const Trace& trace, const TimelineOptions& options) {
  const TimelineView view = timeline_view(trace, options);
  std::map<int, std::vector<const Event*>> by_device;
  int microbatches = 0;
  for (const Event& e : trace.events) {
    if (!drawn(view, e)) continue;
    by_device[e.device].push_back(&e);
    microbatches = std::max(microbatches, std::min(e.microbatch, 1000) + 1);
  }
  // Sizes: lanes shrink as devices grow, so 4 devices read large and 64 still fit a screen.
  const auto n = static_cast<double>(view.devices.size());
  Frame f{};
  f.lane_h = std::clamp(std::round(240 / n), 10.0, 26.0), f.comm_h = std::max(4.0, std::round(f.lane_h * 0.4));
  f.gap = std::max(3.0, std::round(f.lane_h * 0.3)), f.name_size = std::min(12.0, f.lane_h * 0.8);
  size_t longest = 8;
  for (int d : view.devices) longest = std::max(longest, svg::clip(device_name(trace, d), 40).size());
  const double width = std::clamp(options.width_px, 400, 20000);
  f.x0 = std::clamp(static_cast<double>(longest) * f.name_size * 0.6 + 24, 90.0, 320.0), f.x1 = width - 24;
  f.start_s = view.start_s, f.span_s = view.end_s > view.start_s ? view.end_s - view.start_s : 1;
  const std::vector<svg::LegendItem> items = timeline_legend(microbatches);
  const double top = 52 + svg::legend_height(items, 16, width - 16) + 8;
  double bottom = top;
  for (int d : view.devices) bottom += f.lane_h + f.comm_h * static_cast<double>(lanes_of(by_device[d]).labels.size() - 1) + f.gap;

  svg::Builder b(static_cast<int>(width), static_cast<int>(std::ceil(bottom + 44)));
  svg::heading(b, svg::title_of(trace, "timeline"), svg::subtitle_of(trace, view));
  svg::legend(b, items, 16, width - 16, 52);
  const double step = tick_step(f.span_s, std::max(2, static_cast<int>((f.x1 - f.x0) / 110)));
  const std::vector<double> ticks = ticks_of(f, step);
  for (double t : ticks) b.line(f.x(t), top - 4, f.x(t), bottom, "#ececec");  // grid lines, behind the rows
  double y = top;
  for (int d : view.devices) y = draw_row(b, f, y, device_name(trace, d), by_device[d]);
  // The time axis.
  const int decimals = std::clamp(-static_cast<int>(std::floor(std::log10(step) + 1e-9)), 0, 12);
  b.line(f.x0, bottom + 2, f.x1, bottom + 2, "#444");
  for (double t : ticks) {
    b.line(f.x(t), bottom + 2, f.x(t), bottom + 7, "#444");
    char label[64];
    std::snprintf(label, sizeof label, "%.*f", decimals, std::abs(t) < step * 1e-6 ? 0.0 : t);
    b.text({.x = f.x(t), .y = bottom + 19, .size = 10.5, .anchor = "middle", .fill = "#444"}, label);
  }
  b.text({.x = f.x1, .y = bottom + 35, .size = 10.5, .anchor = "end", .fill = "#444"}, "time (s)");
  return b.finish();
}

}  // namespace hetflow::traces
