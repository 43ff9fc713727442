#include "tools/progress.hpp"

#include <unistd.h>

#include <cmath>

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

}  // namespace hetflow::tools
