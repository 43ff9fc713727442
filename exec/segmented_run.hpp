#pragma once
// A run cut into segments, with something done between them: a training checkpoint every N
// steps (`hetflow run --save-interval`), say. Each segment is one run_plan (exec/engine.hpp)
// of the same plan on the same back end, its iterations numbered on from the segment before
// (EngineOptions::first_iteration), so whatever the back end keeps between iterations (a
// Training's weights, moments, counters and pulled weights) carries over as in one run.
//
// What it promises:
//  - The same iterations run as in one run of the plan, with the same numbers: a real-math
//    training cut anywhere reaches the bits of the run that was not cut. What differs is
//    the time: every task of the iterations before a cut ends before any after it starts (a
//    drain, as a synchronous checkpoint has), and the back end is prepared again.
//  - `between(iterations_done)` runs on the calling thread after each cut's segment
//    completed, never during one; under mpirun every rank calls it at the same cut (so it
//    must not throw on one rank alone). A segment that does not complete ends the run (no
//    later `between`), and so does a signal (EngineOptions::interrupt) that came while
//    `between` ran: the next segment does not start.
//  - The result reads as one run's: the trace's events on one timeline where each segment
//    starts where the one before ended (the time `between` took is left out and listed in
//    `pauses`), each device's memory the most of any segment, wall_s and task_instances the
//    segments' sums, a failing segment's error, stall and signal. A trace that stops short
//    says so and counts the iterations the whole run was to have.
//  - Progress (EngineOptions::on_progress) counts the whole run: iterations, completed
//    instances and elapsed time (pauses included) go on from segment to segment.
#include <functional>
#include <vector>

#include "exec/backend.hpp"
#include "exec/engine.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

// Time spent between two segments.
struct Pause {
  int after_iterations = 0;  // the iterations run before it (counted from the run's first)
  double s = 0;              // wall seconds `between` took
};

struct SegmentedResult {
  RunResult run;              // as one run's (see above)
  std::vector<Pause> pauses;  // one per cut reached, in order
};

// Runs `options.iterations` (0: the plan's) iterations of `plan`, cut after each count of
// iterations in `cuts` (ascending, each within (0, iterations): others are ignored), calling
// `between` at each. Throws what run_plan throws for a plan it cannot run, InputError for
// cuts out of order, and whatever `between` throws.
SegmentedResult run_in_segments(const partition::Plan& plan, Backend& backend, const EngineOptions& options,
                                const std::vector<int>& cuts, const std::function<void(int iterations_done)>& between);

}  // namespace hetflow::exec
