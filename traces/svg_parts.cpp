#include "traces/svg_parts.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/units.hpp"

namespace hetflow::traces {

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

double tick_step(double span, int target) {
  const double raw = span / std::max(target, 1);
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= raw * 0.999) return m * decade;
  }
  return 10 * decade;
}

namespace svg {

std::string num(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", std::abs(value) < 0.05 ? 0.0 : value);
  return buffer;
}

namespace {
// The length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  return n;
}
}  // namespace

std::string clip(const std::string& text, size_t max_chars) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    const bool bad = n == 0 || (n == 1 && (c < 0x20 || c == 0x7F));
    chars.push_back(bad ? std::string("?") : text.substr(i, n));
    i += bad ? 1 : n;
  }
  if (chars.size() > max_chars && max_chars > 0) chars.resize(max_chars - 1), chars.push_back("\u2026");
  std::string out;
  for (const std::string& c : chars) out += c;
  return out;
}

Builder::Builder(int width_px, int height_px) {
  const std::string w = std::to_string(width_px), h = std::to_string(height_px);
  out_ = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w +
         "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  rect(0, 0, width_px, height_px, "#ffffff");
}

void Builder::rect(double x, double y, double w, double h, const std::string& fill, const std::string& stroke,
                   const std::string& title, const std::string& css_class) {
  out_ += "<rect";
  if (!css_class.empty()) out_ += " class=\"" + css_class + "\"";
  out_ += " x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) + "\" fill=\"" +
          fill + "\"";
  if (stroke != "none") out_ += " stroke=\"" + stroke + "\" stroke-width=\"0.8\"";
  if (title.empty()) {
    out_ += "/>\n";
  } else {
    out_ += "><title>" + xml_escape(title) + "</title></rect>\n";
  }
}

void Builder::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width) {
  out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) +
          "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"/>\n";
}

void Builder::text(const Text& at, const std::string& content) {
  out_ += "<text x=\"" + num(at.x) + "\" y=\"" + num(at.y) + "\" font-size=\"" + num(at.size) + "\" fill=\"" +
          at.fill + "\"";
  if (at.anchor != "start") out_ += " text-anchor=\"" + at.anchor + "\"";
  if (at.bold) out_ += " font-weight=\"bold\"";
  out_ += ">" + xml_escape(content) + "</text>\n";
}

std::string Builder::finish() { return std::move(out_) + "</svg>\n"; }

double heading(Builder& b, const std::string& title, const std::string& subtitle) {
  b.text({.x = 16, .y = 24, .size = 15, .bold = true}, title);
  b.text({.x = 16, .y = 42, .size = 11.5, .fill = "#555"}, subtitle);
  return 52;
}

namespace {
constexpr double kSwatch = 14, kLegendRow = 18, kCharWidth = 6.2;  // at font size 11
double item_width(const LegendItem& item) { return kSwatch + 6 + kCharWidth * static_cast<double>(item.label.size()) + 18; }
}  // namespace

double legend_height(const std::vector<LegendItem>& items, double x0, double x1) {
  double x = x0, rows = 1;
  for (const LegendItem& item : items) {
    if (x > x0 && x + item_width(item) > x1) x = x0, ++rows;
    x += item_width(item);
  }
  return rows * kLegendRow;
}

double legend(Builder& b, const std::vector<LegendItem>& items, double x0, double x1, double y) {
  double x = x0;
  for (const LegendItem& item : items) {
    if (x > x0 && x + item_width(item) > x1) x = x0, y += kLegendRow;
    b.rect(x, y, kSwatch, 10, item.fill, item.stroke);
    b.text({.x = x + kSwatch + 5, .y = y + 9, .size = 11}, item.label);
    x += item_width(item);
  }
  return y + kLegendRow;
}

std::string title_of(const Trace& trace, const std::string& what) {
  std::string title = what + ": " + (trace.plan.empty() ? std::string("(unnamed plan)") : clip(trace.plan, 80));
  title += "  \u2014  " + (trace.source.empty() ? std::string("unknown source") : clip(trace.source, 20));
  if (!trace.compute.empty()) title += " (compute " + clip(trace.compute, 12) + ")";
  if (!trace.fingerprint.empty()) title += ", plan " + clip(trace.fingerprint, 40);
  return title;
}

std::string subtitle_of(const Trace& trace, const TimelineView& view) {
  (void)trace;
  std::string s = view.first_iteration == view.last_iteration
                      ? "iteration " + std::to_string(view.first_iteration)
                      : "iterations " + std::to_string(view.first_iteration) + "-" + std::to_string(view.last_iteration);
  s += view.trace_first_iteration == 0 ? " of " + std::to_string(view.trace_last_iteration + 1LL)
                                       : " of " + std::to_string(view.trace_first_iteration) + "-" +
                                             std::to_string(view.trace_last_iteration);
  if (view.iterations_cut) s += " (the first that fit " + std::to_string(kDefaultMaxEvents) + " events)";
  s += ";  ";
  if (view.sampled) {
    s += "SAMPLED: " + std::to_string(view.devices.size()) + " of " + std::to_string(view.trace_devices) +
         " devices, evenly spaced ids";
  } else {
    s += std::to_string(view.devices.size()) + (view.devices.size() == 1 ? " device" : " devices");
  }
  s += ";  " + model::units::human_time_s(view.end_s - view.start_s) + " drawn";
  return s;
}

}  // namespace svg
}  // namespace hetflow::traces
