#pragma once
// Runs a plan on a SimGrid model of its cluster and returns what happened: a trace in the
// traces/ format, whether the run completed, and, when it did not, what stalled and where.
//
// SimGrid allows one simulation per process, so simulate() forks a child process for each
// run and reads its result back: callers (tests, sweeps, search) may call it as often as
// they like. simulate_here() is the in-process run that the child performs.
#include <functional>
#include <string>
#include <vector>

#include "model/calibration.hpp"
#include "model/cluster.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::sim {

// From `from_s` on, the device computes `factor` times slower (factor 2 = half speed, 0.5 =
// twice as fast). Several on one device multiply.
struct Straggler {
  int device = -1;
  double factor = 1;
  double from_s = 0;
};

// At `at_s`, a device (its host goes off: its actors die) or a link (comms on it fail).
struct Fault {
  int device = -1;        // >= 0: a device fails
  std::string link;       // otherwise: the name of a platform link (sim/platform_spec.hpp)
  double at_s = 0;
};

// Where a running simulation stands, reported every `progress_interval_s` of host time.
struct Progress {
  double simulated_s = 0;          // simulated clock
  double fraction_done = 0;        // task instances completed / all of them
  long long activities = 0;        // executions + communications issued so far
  double elapsed_s = 0;            // host time since the simulation started
};

struct SimOptions {
  model::Calibration calibration;
  std::vector<Straggler> stragglers;
  std::vector<Fault> faults;
  bool free_communication = false;  // every transfer and collective instantaneous (tests)
  // Ring all-reduce, reduce-scatter and all-gather as one transfer per member instead of
  // their 2(n-1) or n-1 steps. In the steps every member waits for its predecessor, so the
  // ring's slowest hop paces all of them; a coalesced member first waits the steps'
  // latencies but one, (steps - 1) x the ring's largest hop latency, then sends all its
  // steps' bytes to its successor in one communication, no faster than the ring's smallest
  // hop bandwidth. Alone on their routes the members take exactly the steps' time, steps x
  // latency + bytes / bandwidth, and end together; they share links with everything else as
  // the steps do. What it leaves out is how contention that changes from step to step
  // propagates around the ring (tested against the steps within 1 %). A data-parallel run
  // of many replicas simulates tens of times faster.
  // false: every step, as partition/collective_steps.hpp gives them.
  bool coalesce_rings = true;
  // All-to-alls whose members lie node by node, as many on each, and whose parts are even (a
  // balanced router's), as two flows a member and phase instead of one a pair
  // (partition::coalesced_all_to_all): to the next member on its node and to its peer on the
  // next node, each with what the member sends that way, which is what its successor
  // receives. Every member's links carry what they carry in the steps, so alone they take
  // the steps' time (tested within 1 %). An expert group of 64 simulates its exchanges with
  // 128 flows where the pairs are 4,032. false: every pair's message.
  bool coalesce_all_to_all = true;
  // Replay: per compute task instance (index iteration x tasks + task), seconds it takes at
  // its device's nominal speed instead of the cost model's (a straggler still slows it; a
  // negative entry keeps the cost model's); per load task instance, seconds it takes instead
  // of the input path's (negative: the input path's). Empty: the models everywhere.
  std::vector<double> compute_s;
  // Called in the caller's process (simulate() forwards it from the child) at most once per
  // interval while the simulation runs, never after it ends; empty: no reports.
  std::function<void(const Progress&)> on_progress;
  double progress_interval_s = 0.5;
};

struct SimResult {
  traces::Trace trace;
  bool completed = false;
  std::vector<std::string> stalls;  // when not completed: what never ran, and why
  double simulated_s = 0;           // simulated time at the end
  double wall_s = 0;                // host time the simulation took (the child's)
  long long activities = 0;         // executions + communications simulated
  long long peak_rss_bytes = 0;     // of the simulating process
};

// Runs the plan's iteration plan.iterations() times on its embedded cluster, in a child
// process. Throws hetflow::Error if the child dies without a result. The trace records
// plan.fingerprint (set it with partition::plan_fingerprint first when it matters).
SimResult simulate(const partition::Plan& plan, const SimOptions& options);

// The SimGrid release this build simulates with ("SimGrid 3.32.0").
std::string engine_version();

// In this process: at most once per process (SimGrid's engine cannot be restarted).
SimResult simulate_here(const partition::Plan& plan, const SimOptions& options);

}  // namespace hetflow::sim
