#include "traces/timeline_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

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
  const bool pass = e.kind == "forward" || e.kind == "backward" || e.kind == "backward_weight";
  if (pass) {
    const std::string base = e.microbatch >= 0 ? kPalette[e.microbatch % kPaletteSize] : "#9a9a9a";
    if (e.kind == "forward") return {base, "none", e.microbatch >= 0};
    if (e.kind == "backward") return {darker(base), "none", e.microbatch >= 0};
    return {lighter(base), darker(base), e.microbatch >= 0};
  }
  if (e.kind == "optimizer") return {kOptimizer};
  if (e.kind == "collective") return {kCollective};
  if (e.kind == "send" || e.kind == "recv") return {kTransfer};
  return {kOther, "#808080"};
}

std::string tooltip(const Event& e, const std::string& device) {
  const std::string letter = e.kind == "forward" ? "F" : e.kind == "backward" ? "B" : e.kind == "backward_weight" ? "W" : "";
  std::string s = letter.empty() ? e.kind : letter + std::to_string(e.microbatch);
  if (e.kind == "send" || e.kind == "recv" || e.kind == "collective") s += " " + e.purpose + " " + model::units::human_bytes(e.bytes);
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

// Lanes of one device: "compute" first, then its other streams by name.
std::vector<std::string> lanes_of(const std::vector<const Event*>& events) {
  std::vector<std::string> lanes;
  for (const Event* e : events) {
    if (std::find(lanes.begin(), lanes.end(), e->stream) == lanes.end()) lanes.push_back(e->stream);
  }
  std::sort(lanes.begin(), lanes.end(), [](const std::string& a, const std::string& b) {
    return (a == "compute") != (b == "compute") ? a == "compute" : a < b;
  });
  if (lanes.empty() || lanes.front() != "compute") lanes.insert(lanes.begin(), "compute");
  return lanes;
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
  int devices = static_cast<int>(trace.device_names.size());
  for (const Event& e : trace.events) {
    if (e.device < 0) throw InputError("<trace>", 0, "device", "expected a device id >= 0, found " + std::to_string(e.device));
    if (e.iteration < 0) {
      throw InputError("<trace>", 0, "iteration", "expected an iteration >= 0, found " + std::to_string(e.iteration));
    }
    devices = std::max(devices, e.device + 1);
    ++per_iteration[e.iteration];
  }
  v.trace_devices = devices;
  v.trace_iterations = per_iteration.rbegin()->first + 1;
  if (options.iterations) {
    v.first_iteration = options.iterations->first;
    v.last_iteration = options.iterations->last < 0 ? v.trace_iterations - 1 : options.iterations->last;
    const auto hit = per_iteration.lower_bound(v.first_iteration);
    if (v.first_iteration < 0 || v.last_iteration < v.first_iteration || hit == per_iteration.end() ||
        hit->first > v.last_iteration) {
      throw InputError("<trace>", 0, "iterations",
                       "the trace has iterations 0-" + std::to_string(v.trace_iterations - 1) + "; " +
                           std::to_string(v.first_iteration) + ":" + std::to_string(v.last_iteration) +
                           " selects none of its events");
    }
  } else {
    size_t total = 0;
    v.first_iteration = per_iteration.begin()->first;
    v.last_iteration = v.first_iteration;
    for (const auto& [iteration, count] : per_iteration) {
      if (total > 0 && total + count > kDefaultMaxEvents) break;
      total += count;
      v.last_iteration = iteration;
    }
    v.iterations_cut = v.last_iteration < v.trace_iterations - 1;
  }
  const int shown = std::clamp(options.max_devices, 1, std::max(devices, 1));
  v.sampled = shown < devices;
  for (int i = 0; i < shown; ++i) {
    v.devices.push_back(shown == 1 ? 0 : static_cast<int>(std::lround(static_cast<double>(i) * (devices - 1) / (shown - 1))));
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
    microbatches = std::max(microbatches, e.microbatch + 1);
  }
  // Sizes: lanes shrink as devices grow, so 4 devices read large and 64 still fit a screen.
  const auto n = static_cast<double>(view.devices.size());
  const double lane_h = std::clamp(std::round(240 / n), 10.0, 26.0), comm_h = std::max(4.0, std::round(lane_h * 0.4));
  const double gap = std::max(3.0, std::round(lane_h * 0.3)), name_size = std::min(12.0, lane_h * 0.8);
  size_t longest = 8;
  for (int d : view.devices) longest = std::max(longest, svg::clip(device_name(trace, d), 40).size());
  const double width = std::max(options.width_px, 400);
  const double x0 = std::clamp(static_cast<double>(longest) * name_size * 0.6 + 24, 90.0, 320.0), x1 = width - 24;
  const std::vector<svg::LegendItem> items = timeline_legend(microbatches);
  const double top = 52 + svg::legend_height(items, 16, width - 16) + 8;
  double rows_h = 0;
  for (int d : view.devices) rows_h += lane_h + comm_h * static_cast<double>(lanes_of(by_device[d]).size() - 1) + gap;
  const double height = std::ceil(top + rows_h + 44);

  svg::Builder b(static_cast<int>(width), static_cast<int>(height));
  svg::heading(b, svg::title_of(trace, "timeline"), svg::subtitle_of(trace, view));
  svg::legend(b, items, 16, width - 16, 52);
  const double span = view.end_s > view.start_s ? view.end_s - view.start_s : 1;
  const auto x_of = [&](double t) { return x0 + (t - view.start_s) / span * (x1 - x0); };
  // Grid lines at the ticks, behind the rows.
  const double step = tick_step(span, std::max(2, static_cast<int>((x1 - x0) / 110)));
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  std::vector<double> ticks;
  for (double k = std::ceil(view.start_s / step - 1e-9); k * step <= view.start_s + span * (1 + 1e-9); ++k) ticks.push_back(k * step);
  const double bottom = top + rows_h;
  for (double t : ticks) b.line(x_of(t), top - 4, x_of(t), bottom, "#ececec");

  double y = top;
  for (int d : view.devices) {
    const std::vector<const Event*>& events = by_device[d];
    const std::vector<std::string> lanes = lanes_of(events);
    std::map<std::string, std::pair<double, double>> lane_at;  // stream -> (y, height)
    double lane_y = y;
    for (const std::string& s : lanes) {
      const double h = s == lanes.front() ? lane_h : comm_h;
      lane_at[s] = {lane_y, h};
      b.rect(x0, lane_y, x1 - x0, h, "none", "#d9d9d9");
      if (s != lanes.front() && comm_h >= 7) {
        b.text({.x = x0 - 6, .y = lane_y + h * 0.8, .size = std::min(9.0, comm_h), .anchor = "end", .fill = "#888"},
               svg::clip(s, 24));
      }
      lane_y += h;
    }
    b.text({.x = x0 - 6, .y = y + lane_h / 2 + name_size * 0.35, .size = name_size, .anchor = "end"},
           svg::clip(device_name(trace, d), 40));
    const std::string name = device_name(trace, d);
    for (const Event* e : events) {
      const auto [ly, lh] = lane_at[e->stream];
      const Look look = look_of(*e);
      const double w = std::max(1.0, x_of(e->end_s) - x_of(e->start_s)), x = std::min(x_of(e->start_s), x1 - w);
      b.rect(x, ly + 0.5, w, lh - 1, look.fill, look.stroke, tooltip(*e, name), "ev");
      const std::string label = std::to_string(e->microbatch);
      const double size = std::min(11.0, lh * 0.72);
      if (look.numbered && lh >= 9 && w >= static_cast<double>(label.size()) * size * 0.62 + 3) {
        b.text({.x = x + w / 2, .y = ly + lh / 2 + size * 0.36, .size = size, .anchor = "middle",
                .fill = dark(look.fill) ? "#ffffff" : "#222222"},
               label);
      }
    }
    y = lane_y + gap;
  }
  // The time axis.
  b.line(x0, bottom + 2, x1, bottom + 2, "#444");
  for (double t : ticks) {
    b.line(x_of(t), bottom + 2, x_of(t), bottom + 7, "#444");
    char label[48];
    std::snprintf(label, sizeof label, "%.*f", decimals, std::abs(t) < step * 1e-6 ? 0.0 : t);
    b.text({.x = x_of(t), .y = bottom + 19, .size = 10.5, .anchor = "middle", .fill = "#444"}, label);
  }
  b.text({.x = x1, .y = bottom + 35, .size = 10.5, .anchor = "end", .fill = "#444"}, "time (s)");
  return b.finish();
}

}  // namespace hetflow::traces
