#pragma once
// A run of a plan on a back end, as `hetflow run` makes it: what was asked (`Request`), the
// training the run's real math does (`TrainingSetup`), the back end and the engine's options.
// The caller runs it (exec::run_plan, with its own progress and stop hooks); compare.hpp sets
// what it measured beside the simulator's prediction and the analytic estimate.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/backend.hpp"
#include "exec/engine.hpp"
#include "exec/ranks.hpp"
#include "exec/training.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"

namespace hetflow::run {

// What to run and how: the plan and the run's options, read and checked (tools/ reads them
// from the command line).
struct Request {
  partition::Plan plan;  // the plan that runs: layout.iterations = warmup + steps, fingerprint of that
  std::string backend = "cpu";  // cpu | cuda
  int warmup = 1;               // iterations run first and left out of the figures
  int steps = 3;                // iterations measured
  double watchdog_s = 60;       // stop when no task completes for this long
  bool watchdog_given = false;  // false: the watchdog waits at least 10x the longest compute task
  double flop_scale = 1;        // proxies run compute tasks with their FLOPs times this
  double max_buffer_bytes = 4.0 * 1024 * 1024;  // host bytes per tensor and per message at most
  double loader_throttle_s_per_sample = 0;  // each node's loader spends this on a sample (exec/loader_throttle.hpp)
  std::string compute = "auto";  // auto | real | proxy
  std::string data_path;         // an llm.c token file; empty: a seeded Markov stream
  std::string init_weights;      // safetensors to start from; empty: seeded initial weights
  std::string save_weights;      // where the caller writes the weights after the run; empty: nowhere
  std::string resume;            // a training checkpoint folder to go on from; empty: a fresh run
  long long resumed_iterations = 0;  // that checkpoint's iterations (the next step's index)
  std::string save_checkpoint;   // where the caller writes a training checkpoint after the run; empty: nowhere
  // With save_checkpoint: write it also after every step this many steps since the first
  // run's first (a resumed run's count on, as Megatron's --save-interval); 0: at the end only.
  int save_interval = 0;
  std::uint64_t seed = 1234;     // of the initial weights and the Markov stream
  exec::OptimizerOptions optimizer;  // AdamW, its schedule, clipping and loss scaling
};

// Real math when asked for, or (auto) when the plan is one it covers; why not otherwise.
struct TrainingSetup {
  std::unique_ptr<exec::Training> training;  // null: compute tasks run as FLOP-matched proxies
  std::string proxy_reason;  // auto fell back to proxies: why
  std::string data;          // what the tokens are
  double entropy_nats = 0;   // the synthetic stream's: the loss floor
  long long resumed_iterations = 0;  // a resumed run's: the steps before its first
};

// The training a real-math run does: its token source, its initial weights, its optimizer.
// Under several ranks every rank makes the same choice (the least host memory of them
// bounds auto). Throws PlanError when `compute` is real and the plan is not covered, and
// InputError naming the command-line option when an option needs the other kind of compute.
TrainingSetup make_training(const Request& r, const exec::Ranks& ranks);

// A task, and the same plan, with their compute work (FLOPs, recomputed FLOPs, memory
// traffic) scaled as the run scales it: the estimate then predicts the run that happens.
partition::Task scaled(partition::Task task, double flop_scale);
partition::Plan scaled(const partition::Plan& plan, double flop_scale);

// The plan as the request runs it, for the predictions beside the run: its compute scaled
// by flop_scale, and its cluster's input path the executor's loader: unbounded (tokens are
// read from memory) but for the loader throttle, each node's one worker spending
// loader_throttle_s_per_sample on a sample (exec/loader_throttle.hpp).
partition::Plan as_run(const partition::Plan& plan, const Request& r);

// The longest compute task of `plan`, its work scaled by `flop_scale`, as `cost` predicts it.
double longest_task_s(const partition::Plan& plan, const partition::CostModel& cost, double flop_scale = 1);

// Where a run with a checkpoint every save_interval steps is cut (exec/segmented_run.hpp):
// the counts of its iterations after which the step count, the resumed checkpoint's steps
// included, is a multiple of the interval, before its last (whose checkpoint is the end's).
std::vector<int> checkpoint_cuts(const Request& r);

// The back end the request names, running `training`'s real math when it has one; under
// mpirun this rank's devices.
std::unique_ptr<exec::Backend> make_backend(const Request& r, const TrainingSetup& training, const exec::Ranks& ranks);

// The engine's options for the request: its watchdog (unless given, at least ten times the
// longest compute task `cost` predicts for the run: a long task is not a stall), its buffer
// cap, the ranks. Hooks (on_task_end) are the caller's to add.
exec::EngineOptions engine_options(const Request& r, const partition::CostModel& cost, exec::Ranks& ranks);

}  // namespace hetflow::run
