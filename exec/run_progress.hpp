#pragma once
// Where a run stands, as the engine (exec/engine.hpp) reports it while it runs
// (EngineOptions::on_progress): enough for a progress line ("step 2/4: 37/120 tasks") without
// the observer touching the engine's state.
namespace hetflow::exec {

struct RunProgress {
  int iteration = 0;             // the first iteration this process has not finished (0-based)
  int iterations = 0;            // the iterations the run has (warm-up included)
  long long iteration_done = 0;  // task instances of `iteration` completed on this process's devices
  long long iteration_tasks = 0;  // task instances of one iteration on this process's devices
  long long completed = 0;       // task instances completed on this process's devices, all iterations
  double elapsed_s = 0;          // wall time since the run's start
  double last_iteration_s = 0;   // wall time of iteration - 1 (its end minus the one before's); 0 before the first ends
};

}  // namespace hetflow::exec
