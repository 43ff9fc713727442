#pragma once
// The progress line of a long simulation: on a terminal, one line on stderr rewritten in
// place ("simulating: 41% of tasks, 3.2 s simulated, 1.2M activities (350K/s), 4.1 s
// elapsed") from the first second on, and erased when the run ends; nothing when stderr is
// not a terminal, so logs and pipes stay quiet.
#include <cstdio>
#include <functional>
#include <string>

#include <chrono>

#include "search/search.hpp"
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

// The search's progress line, on a terminal from its first second on: while candidates are
// scored "searching: 412 of 1,200 candidates (350/s), 2 s left"; while finalists are
// simulated "simulating plan 3 (estimate 23.2 s, best so far 24.7 s): 41% of tasks, 4 s
// elapsed". Erased when the search ends.
std::string search_progress_text(const search::SimulationProgress& p, bool by_cost);

class SearchProgressLine {
 public:
  explicit SearchProgressLine(bool by_cost, std::FILE* stream = stderr, bool force = false);
  ~SearchProgressLine();  // erases the line if one was shown
  SearchProgressLine(const SearchProgressLine&) = delete;
  SearchProgressLine& operator=(const SearchProgressLine&) = delete;

  // What to put in search::Request::on_scoring and on_simulation: empty when nothing is to be shown.
  std::function<void(int, int)> scoring();
  std::function<void(const search::SimulationProgress&)> simulation();

 private:
  void show(const std::string& text);
  bool by_cost_;
  std::FILE* stream_;
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace hetflow::tools
