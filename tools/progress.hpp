#pragma once
// The progress line of a long simulation: on a terminal, one line on stderr rewritten in
// place ("simulating: 41% of tasks, 3.2 s simulated, 1.2M activities (350K/s), 4.1 s
// elapsed") from the first second on, and erased when the run ends; nothing when stderr is
// not a terminal, so logs and pipes stay quiet.
#include <cstdio>
#include <functional>
#include <string>

#include "sim/simulator.hpp"

namespace hetflow::tools {

// The line's text for one report.
std::string progress_text(const sim::Progress& p);

class ProgressLine {
 public:
  // Reports to `stream` when it is a terminal; `force` shows it anywhere (tests).
  explicit ProgressLine(std::FILE* stream = stderr, bool force = false);
  ~ProgressLine();  // erases the line if one was shown
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // What to put in SimOptions::on_progress: empty when nothing is to be shown.
  std::function<void(const sim::Progress&)> reporter();

 private:
  void show(const sim::Progress& p);
  std::FILE* stream_;
  bool enabled_;
  bool shown_ = false;
};

}  // namespace hetflow::tools
