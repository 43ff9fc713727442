#pragma once
// The pieces timeline_svg.cpp and utilization_svg.cpp draw with (internal to traces/): an SVG
// text builder that escapes what it is given and writes coordinates with one decimal, the
// heading both pictures share, and the time or percentage axis under the rows.
#include <string>
#include <vector>

#include "traces/timeline_svg.hpp"

namespace hetflow::traces::svg {

// "12.3": coordinates with one decimal, C locale whatever the process's.
std::string num(double value);
// A trace string cut to at most `max_chars` characters (an ellipsis marks the cut), its
// invalid UTF-8 and control characters replaced by '?'. Not yet escaped.
std::string clip(const std::string& text, size_t max_chars);

struct Text {
  double x = 0, y = 0, size = 11;
  std::string anchor = "start";  // start, middle, end
  std::string fill = "#222";
  bool bold = false;
};

class Builder {
 public:
  Builder(int width_px, int height_px);
  // fill and stroke are colours ("#4e79a7", "none"); title, when given, becomes a tooltip.
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& stroke = "none",
            const std::string& title = "", const std::string& css_class = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1);
  void text(const Text& at, const std::string& content);  // content is escaped here
  std::string finish();  // closes the <svg> element

 private:
  std::string out_;
};

// Title (bold) and subtitle lines at the top; returns the y below them.
double heading(Builder& b, const std::string& title, const std::string& subtitle);

struct LegendItem {
  std::string fill, stroke, label;
};
// Swatches with labels, flowing left to right and wrapping within [x0, x1]; returns the y below.
double legend(Builder& b, const std::vector<LegendItem>& items, double x0, double x1, double y);
// The height legend() takes for these items within [x0, x1].
double legend_height(const std::vector<LegendItem>& items, double x0, double x1);

// The title both pictures share: plan, source, fingerprint.
std::string title_of(const Trace& trace, const std::string& what);
// What the view draws: iterations, devices (sampled or not), span.
std::string subtitle_of(const Trace& trace, const TimelineView& view);

}  // namespace hetflow::traces::svg
