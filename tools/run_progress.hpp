#pragma once
// The progress line of `hetflow run`, fed by the engine (EngineOptions::on_progress): where the
// run is inside its step, against the time predicted before it started,
//   step 2/4: 37/120 tasks, 5.1 s of 12 s predicted; step 1 took 2.4 s, loss 5.432100
// On a terminal one line on stderr rewritten in place and erased when the run ends; with
// --progress also off a terminal, as a line of its own at most once a second (a log, a pipe, a
// test waiting for the run to be under way); otherwise nothing, so logs and pipes stay quiet.
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "exec/run_progress.hpp"
#include "exec/training.hpp"

namespace hetflow::tools {

// The line's text. predicted_s <= 0: no prediction; loss NaN: none.
std::string run_progress_text(const exec::RunProgress& p, double predicted_s, double loss);

class RunProgressLine {
 public:
  // Shown when `here` (rank 0 of a run over ranks) and either `asked` (--progress) or
  // `stream` is a terminal and HETFLOW_NO_PROGRESS is unset. `training` (null: no loss) gives
  // the loss of the step that ended; it must outlive the run.
  RunProgressLine(double predicted_s, const exec::Training* training, bool here, bool asked, std::FILE* stream = stderr);
  ~RunProgressLine();  // finish()
  RunProgressLine(const RunProgressLine&) = delete;
  RunProgressLine& operator=(const RunProgressLine&) = delete;

  // What to put in EngineOptions::on_progress: empty when nothing is to be shown.
  std::function<void(const exec::RunProgress&)> reporter();
  // Erases a line shown on a terminal (before the report is printed).
  void finish();

 private:
  void show(const exec::RunProgress& p);
  double predicted_s_;
  const exec::Training* training_;
  std::FILE* stream_;
  bool enabled_ = false;
  bool terminal_ = false;
  bool shown_ = false;
  double last_line_s_ = -1;  // off a terminal: when the last line was written
};

}  // namespace hetflow::tools
