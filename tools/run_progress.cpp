#include "tools/run_progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "model/units.hpp"

namespace hetflow::tools {

namespace u = model::units;

namespace {
constexpr double kLineEvery_s = 1.0;  // off a terminal: a log gains a line a second at most
}  // namespace

std::string run_progress_text(const exec::RunProgress& p, double predicted_s, double loss) {
  std::string text;
  if (p.iteration < p.iterations) {
    text = "step " + std::to_string(p.iteration + 1) + "/" + std::to_string(p.iterations) + ": " +
           std::to_string(p.iteration_done) + "/" + std::to_string(p.iteration_tasks) + " tasks, ";
  } else {
    text = "all " + std::to_string(p.iterations) + " steps done, ";
  }
  text += u::human_time_s(p.elapsed_s);
  text += predicted_s > 0 ? " of " + u::human_time_s(predicted_s) + " predicted" : " elapsed";
  if (p.iteration > 0) {
    text += "; step " + std::to_string(p.iteration) + " took " + u::human_time_s(p.last_iteration_s);
    if (!std::isnan(loss)) {
      std::ostringstream l;
      l << std::fixed << std::setprecision(6) << loss;
      text += ", loss " + l.str();
    }
  }
  return text;
}

RunProgressLine::RunProgressLine(double predicted_s, const exec::Training* training, bool here, bool asked,
                                 std::FILE* stream)
    : predicted_s_(predicted_s), training_(training), stream_(stream) {
  terminal_ = ::isatty(::fileno(stream)) == 1 && std::getenv("HETFLOW_NO_PROGRESS") == nullptr;
  enabled_ = here && (asked || terminal_);
}

RunProgressLine::~RunProgressLine() { finish(); }

std::function<void(const exec::RunProgress&)> RunProgressLine::reporter() {
  if (!enabled_) return {};
  return [this](const exec::RunProgress& p) { show(p); };
}

void RunProgressLine::finish() {
  if (shown_ && terminal_) std::fputs("\r\033[K", stream_);
  std::fflush(stream_);
  shown_ = false;
}

// (The engine calls this from one thread, never two at once.)
void RunProgressLine::show(const exec::RunProgress& p) {
  if (!terminal_ && last_line_s_ >= 0 && p.elapsed_s - last_line_s_ < kLineEvery_s) return;
  double loss = std::nan("");
  if (training_ != nullptr && p.iteration > 0) {
    const std::vector<double> losses = training_->losses();
    if (static_cast<size_t>(p.iteration) <= losses.size()) loss = losses[static_cast<size_t>(p.iteration) - 1];
  }
  const std::string text = run_progress_text(p, predicted_s_, loss);
  if (terminal_) {
    std::fputs(("\r\033[K" + text).c_str(), stream_);
  } else {
    std::fputs((text + "\n").c_str(), stream_);
    last_line_s_ = p.elapsed_s;
  }
  std::fflush(stream_);
  shown_ = true;
}

}  // namespace hetflow::tools
