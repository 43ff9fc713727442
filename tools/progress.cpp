#include "tools/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <iomanip>
#include <sstream>

#include "model/units.hpp"

namespace hetflow::tools {

namespace u = model::units;

namespace {
constexpr double kQuietFor_s = 1.0;  // short runs show nothing
}  // namespace

std::string progress_text(const sim::Progress& p) {
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.activities) / p.elapsed_s : 0;
  return "simulating: " + std::to_string(static_cast<int>(std::floor(100 * p.fraction_done))) + "% of tasks, " +
         u::human_time_s(p.simulated_s) + " simulated, " + u::human_count(static_cast<double>(p.activities)) +
         " activities (" + u::human_count(rate) + "/s), " + u::human_time_s(p.elapsed_s) + " elapsed";
}

ProgressLine::ProgressLine(std::FILE* stream, bool force)
    : stream_(stream), enabled_(force || ::isatty(::fileno(stream)) == 1) {}

ProgressLine::~ProgressLine() {
  if (shown_) std::fputs("\r\033[K", stream_);
}

std::function<void(const sim::Progress&)> ProgressLine::reporter() {
  if (!enabled_) return {};
  return [this](const sim::Progress& p) { show(p); };
}

void ProgressLine::show(const sim::Progress& p) {
  if (p.elapsed_s < kQuietFor_s) return;
  std::fputs(("\r\033[K" + progress_text(p)).c_str(), stream_);
  std::fflush(stream_);
  shown_ = true;
}

std::string search_progress_text(const search::SimulationProgress& p, bool by_cost) {
  const auto figure = [by_cost](double v) {
    if (!by_cost) return u::human_time_s(v);
    std::ostringstream s;
    s << "$" << std::setprecision(3) << v;
    return s.str();
  };
  std::string text = "simulating plan " + std::to_string(p.index) + " (estimate " + figure(p.estimate);
  text += p.best > 0 ? ", best so far " + figure(p.best) + "): " : "): ";
  text += std::to_string(static_cast<int>(std::floor(100 * p.simulation.fraction_done))) + "% of tasks, " +
          u::human_time_s(p.simulation.elapsed_s) + " elapsed";
  return text;
}

SearchProgressLine::SearchProgressLine(bool by_cost, std::FILE* stream, bool force)
    : by_cost_(by_cost), stream_(stream), enabled_(force || ::isatty(::fileno(stream)) == 1),
      started_(std::chrono::steady_clock::now()) {}

SearchProgressLine::~SearchProgressLine() {
  if (shown_) std::fputs("\r\033[K", stream_);
}

std::function<void(int, int)> SearchProgressLine::scoring() {
  if (!enabled_) return {};
  return [this](int done, int total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (elapsed < kQuietFor_s || done >= total) return;
    const double rate = done / elapsed;
    char line[160];
    std::snprintf(line, sizeof line, "searching: %d of %d candidates (%.0f/s), %.0f s left", done, total, rate,
                  rate > 0 ? (total - done) / rate : 0.0);
    show(line);
  };
}

std::function<void(const search::SimulationProgress&)> SearchProgressLine::simulation() {
  if (!enabled_) return {};
  return [this](const search::SimulationProgress& p) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() < kQuietFor_s) return;
    show(search_progress_text(p, by_cost_));
  };
}

void SearchProgressLine::show(const std::string& text) {
  std::fputs(("\r\033[K" + text).c_str(), stream_);
  std::fflush(stream_);
  shown_ = true;
}

}  // namespace hetflow::tools
