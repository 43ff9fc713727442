// The campaign picture: plain SVG, no library.
#include "campaign/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace hetflow::campaign {

namespace {

constexpr double kWidth = 960, kHeight = 420;
constexpr double kLeft = 70, kRight = 150, kTop = 40, kBottom = 50;
constexpr const char* kCauseColour[kComponents] = {"#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#1f77b4"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string fixed(double v, int digits = 1) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

// 45000000 -> "45M", 2500 -> "2.5k".
std::string short_count(double v) {
  const auto trim = [](double x) {
    std::string t = fixed(x, 1);
    if (t.size() > 2 && t.substr(t.size() - 2) == ".0") t.resize(t.size() - 2);
    return t;
  };
  if (v >= 1e6) return trim(v / 1e6) + "M";
  if (v >= 1e3) return trim(v / 1e3) + "k";
  return trim(v);
}

}  // namespace

std::string progress_svg(const CampaignResult& result, double target_steps, const std::string& title) {
  std::ostringstream s;
  const RunResult& run = result.runs.front();
  const double end_s = std::max(run.wall_s, 1.0);
  double top_steps = std::max(run.steps, target_steps);
  for (const auto& [t, steps] : run.progress) top_steps = std::max(top_steps, steps);
  top_steps = std::max(top_steps, 1.0);
  // Round the axis up to 4 ticks of a round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten).
  const double magnitude = std::pow(10, std::floor(std::log10(top_steps / 4)));
  for (double f : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (4 * f * magnitude >= top_steps) {
      top_steps = 4 * f * magnitude;
      break;
    }
  }
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const bool days = end_s > 2 * 86400;
  const double unit_s = days ? 86400 : 3600;
  const auto x = [&](double t) { return kLeft + plot_w * t / end_s; };
  const auto y = [&](double steps) { return kTop + plot_h * (1 - steps / top_steps); };

  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << kLeft << "\" y=\"22\" font-size=\"14\">" << escape(title) << "</text>\n";
  // Axes and ticks.
  s << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << kLeft + plot_w << "\" y2=\""
    << kTop + plot_h << "\" stroke=\"black\"/>\n";
  s << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kTop + plot_h
    << "\" stroke=\"black\"/>\n";
  const double span = end_s / unit_s;
  const double step = span <= 10 ? 1 : span <= 40 ? 5 : span <= 120 ? 10 : std::ceil(span / 10);
  for (double u = 0; u <= span + 1e-9; u += step) {
    s << "<line x1=\"" << fixed(x(u * unit_s)) << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << fixed(x(u * unit_s))
      << "\" y2=\"" << kTop + plot_h + 5 << "\" stroke=\"black\"/><text x=\"" << fixed(x(u * unit_s))
      << "\" y=\"" << kTop + plot_h + 18 << "\" text-anchor=\"middle\">" << fixed(u, 0) << "</text>\n";
  }
  s << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 10 << "\" text-anchor=\"middle\">wall time ("
    << (days ? "days" : "hours") << ")</text>\n";
  for (int k = 0; k <= 4; ++k) {
    const double v = top_steps * k / 4;
    s << "<text x=\"" << kLeft - 6 << "\" y=\"" << fixed(y(v) + 4) << "\" text-anchor=\"end\">" << short_count(v)
      << "</text>\n";
  }
  s << "<text transform=\"translate(16," << kTop + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">steps trained</text>\n";
  if (target_steps > 0) {
    s << "<line x1=\"" << kLeft << "\" y1=\"" << fixed(y(target_steps)) << "\" x2=\"" << kLeft + plot_w << "\" y2=\""
      << fixed(y(target_steps)) << "\" stroke=\"#888\" stroke-dasharray=\"6,4\"/>\n";
  }
  // Failures: a tick per failure, coloured by cause, from the axis up.
  for (const Mark& m : run.marks) {
    if (m.kind != Mark::failure) continue;
    s << "<line x1=\"" << fixed(x(m.time_s)) << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << fixed(x(m.time_s))
      << "\" y2=\"" << kTop + plot_h - 14 << "\" stroke=\"" << kCauseColour[static_cast<int>(m.cause)]
      << "\" stroke-width=\"1.5\"/>\n";
  }
  // What a run without failures or checkpoints would have trained.
  const double ideal = end_s / result.healthy_iteration_s;
  const double ideal_end_s = ideal > top_steps ? top_steps * result.healthy_iteration_s : end_s;
  s << "<line x1=\"" << fixed(x(0)) << "\" y1=\"" << fixed(y(0)) << "\" x2=\"" << fixed(x(ideal_end_s)) << "\" y2=\""
    << fixed(y(std::min(ideal, top_steps))) << "\" stroke=\"#aaa\" stroke-dasharray=\"2,3\"/>\n";
  // Progress.
  s << "<polyline fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"1.5\" points=\"" << fixed(x(0)) << ","
    << fixed(y(0));
  for (const auto& [t, steps] : run.progress) s << " " << fixed(x(t)) << "," << fixed(y(steps));
  s << "\"/>\n";
  // Resumptions after a restart or a pause: small circles on the curve.
  size_t p = 0;
  for (const Mark& m : run.marks) {
    if (m.kind != Mark::resumed) continue;
    while (p + 1 < run.progress.size() && run.progress[p + 1].first <= m.time_s) ++p;
    const double steps = run.progress.empty() ? 0 : run.progress[p].second;
    s << "<circle cx=\"" << fixed(x(m.time_s)) << "\" cy=\"" << fixed(y(steps)) << "\" r=\"2\" fill=\"#2ca02c\"/>\n";
  }
  // Legend.
  double ly = kTop + 10;
  const double lx = kLeft + plot_w + 14;
  s << "<text x=\"" << lx << "\" y=\"" << ly << "\">failures:</text>\n";
  for (int i = 0; i < kComponents; ++i) {
    ly += 18;
    s << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 14 << "\" y2=\"" << ly - 4 << "\" stroke=\""
      << kCauseColour[i] << "\" stroke-width=\"3\"/><text x=\"" << lx + 20 << "\" y=\"" << ly << "\">"
      << to_string(static_cast<Component>(i)) << " (" << run.interruptions[static_cast<size_t>(i)] << ")</text>\n";
  }
  ly += 26;
  s << "<circle cx=\"" << lx + 7 << "\" cy=\"" << ly - 4 << "\" r=\"3\" fill=\"#2ca02c\"/><text x=\"" << lx + 20
    << "\" y=\"" << ly << "\">resumed</text>\n";
  ly += 18;
  s << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 14 << "\" y2=\"" << ly - 4
    << "\" stroke=\"#aaa\" stroke-dasharray=\"2,3\"/><text x=\"" << lx + 20 << "\" y=\"" << ly << "\">no failures</text>\n";
  if (target_steps > 0) {
    ly += 18;
    s << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 14 << "\" y2=\"" << ly - 4
      << "\" stroke=\"#888\" stroke-dasharray=\"4,3\"/><text x=\"" << lx + 20 << "\" y=\"" << ly << "\">target</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace hetflow::campaign
