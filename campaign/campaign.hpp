#pragma once
// A whole training run over days as a discrete-event simulation: failures of each component
// class (exponential, per unit), detection, restarts or fault-tolerant data parallelism,
// checkpoints, repairs and spares, stragglers. Its unit is the iteration time of each state
// (campaign/job.hpp, from the simulator); the loop itself is a priority queue of events and
// runs a month of a 100,000-GPU job in milliseconds. Deterministic for a given seed.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "campaign/job.hpp"
#include "campaign/reliability.hpp"

namespace hetflow::campaign {

enum class FaultTolerance {
  restart,       // any failure stops the job: back to the last checkpoint, relaunch everything
  drop_replica,  // the failed data-parallel replica leaves, the others go on; it rejoins after repair
};
FaultTolerance parse_fault_tolerance(const std::string& text);  // InputError (field --fault-tolerance)
std::string_view to_string(FaultTolerance f);

struct CampaignOptions {
  double target_steps = 0;   // iterations (full global batches) to train; 0: run for duration_s
  double duration_s = 0;     // wall-clock limit; 0: until target_steps are done
  FaultTolerance fault_tolerance = FaultTolerance::restart;
  bool same_batch = false;   // drop-replica: the others take the missing replica's micro-batches
  int spares = 0;            // spare nodes that take a failed node's place at once
  bool checkpoint_async = false;  // training waits only for the GPU-to-host snapshot
  double checkpoint_interval_s = 0;  // compute time between checkpoints; 0: Daly's optimum
  double checkpoint_write_s = -1;    // >= 0: instead of the job's (tests, what-ifs)
  double checkpoint_load_s = -1;     // >= 0: instead of the job's
  int seeds = 1;             // Monte Carlo runs
  std::uint64_t seed = 1;    // the first run's seed; run k uses seed + k
  // A run longer than this in wall time is stopped (a job that cannot progress, e.g. a
  // failure rate above its restart rate): the result says it did not finish.
  double max_wall_s = 10 * 365 * 86400.0;
};

// What happened at a moment of run 0, for the picture.
struct Mark {
  enum Kind { failure, resumed, checkpoint } kind = failure;
  double time_s = 0;
  Component cause = Component::gpu;  // failures
};

// One run.
struct RunResult {
  bool finished = false;     // reached target_steps (or ran duration_s) before max_wall_s
  double wall_s = 0;
  double steps = 0;          // full global batches trained that count
  double useful_s = 0;       // steps x healthy iteration time
  double goodput = 0;        // useful_s / wall_s
  std::array<int, kComponents> interruptions{};  // failures that hit the job, by cause
  std::array<double, kComponents> lost_s{};      // wall time lost to them: downtime, work redone, slower steps
  int checkpoints = 0;       // written and durable
  double checkpoint_s = 0;   // wall time training waited for checkpoints
  double straggler_s = 0;    // wall time lost to straggling nodes
  int max_replicas_down = 0; // drop-replica: most replicas out at once
  std::vector<std::pair<double, double>> progress;  // (wall s, steps), run 0 only
  std::vector<Mark> marks;                           // run 0 only
};

// Percentiles over the runs (linear interpolation between order statistics).
struct Band {
  double p10 = 0, p50 = 0, p90 = 0;
  double mean = 0;
  double mean_ci90 = 0;  // half-width of the 90 % confidence interval of the mean: 1.645 s / sqrt(K)
};

struct CampaignResult {
  std::vector<RunResult> runs;  // one per seed
  double checkpoint_interval_s = 0;  // compute time between checkpoints, as used
  double checkpoint_write_s = 0;
  double checkpoint_load_s = 0;
  double restart_s = 0;              // relaunch + communicator set-up + checkpoint load (restart)
  double job_mtbf_s = 0;             // of the whole job, all classes
  double healthy_iteration_s = 0;    // the job's
  Band wall_s, goodput, steps;  // over the runs
  Band restart_goodput;         // drop-replica: the same seeds restarting the job at each failure instead
  int finished_runs = 0;
};

// One run with the given seed; record progress and marks when `record`.
RunResult run_campaign(const Job& job, const CampaignOptions& options, std::uint64_t seed, bool record);

// options.seeds runs and their bands. Throws InputError (field "--tokens"/"--steps") when
// there is nothing to train and no duration.
CampaignResult simulate_campaign(const Job& job, const CampaignOptions& options);

// Downtime of a restart after the failed part is replaced: relaunch, communicator set-up
// over every rank, the checkpoint's load.
double restart_s(const Job& job, double load_s);

// The checkpoint interval a campaign uses: options' or Daly's from the job MTBF, at least one
// healthy iteration.
double checkpoint_interval_s(const Job& job, const CampaignOptions& options);

Band band_of(std::vector<double> values);

}  // namespace hetflow::campaign
