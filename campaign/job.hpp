#pragma once
// What a campaign needs to know of a plan: its size (GPUs, nodes, data-parallel replicas),
// how long one iteration takes in each state the cluster passes through, and what a
// checkpoint of its state costs. Iteration times come from the simulator (sim/), once per
// state; everything after that is arithmetic.
#include "campaign/reliability.hpp"
#include "model/calibration.hpp"
#include "partition/plan.hpp"

namespace hetflow::campaign {

// Iteration time in each state, seconds.
struct StateTimes {
  double healthy_s = 0;        // every replica up, nobody straggling
  double replica_short_s = 0;  // one data-parallel replica out (its batch share dropped); = healthy_s with one replica
  double replica_short_same_batch_s = 0;  // one replica out, the others take its micro-batches
  double straggler_s = 0;      // one node straggling at the reliability's slowdown
};

// The cost of one checkpoint of the plan's state.
struct CheckpointCost {
  double size_bytes = 0;  // the model's weights + optimizer state, once (however sharded or split)
  double write_s = 0;     // to storage: per-node and aggregate bandwidth, every node writing its share
  double load_s = 0;      // at a restart: one copy read back, each GPU's shard broadcast to the replicas
  double snapshot_s = 0;  // asynchronous checkpoints: the GPU-to-host copy training waits for
};

struct Job {
  int gpus = 0;               // devices the plan uses (all replicas)
  int nodes = 0;              // nodes those devices are on
  int replicas = 1;           // data-parallel replicas (virtual workers, or context groups of them)
  int gpus_per_node = 1;      // of the nodes used (the largest)
  double samples_per_step = 0;
  double tokens_per_sample = 1;
  StateTimes times;
  CheckpointCost checkpoint;
  Reliability reliability;
};

// GPUs, nodes, replicas and the checkpoint of a plan (times left at 0).
Job describe_job(const partition::Plan& plan, const Reliability& reliability);

// Which states a campaign passes through: restarts never run a replica short, and only
// --same-batch redistributes its micro-batches.
struct StatesNeeded {
  bool replica_short = true;
  bool same_batch = true;
};

// Simulates the plan's iteration in each state needed (two iterations each, the first a
// warm-up) and fills job.times; a state not needed, a plan of one replica's replica-short
// states and, without stragglers (probability 0 or slowdown 1), the straggler state get the
// healthy time. Throws what sim::simulate throws, and hetflow::Error when a state's
// simulation stalls.
void measure_states(const partition::Plan& plan, const model::Calibration& calibration, Job& job,
                    StatesNeeded needed = {});

// Checkpoint interval (compute time between checkpoints) that minimises the expected wall
// time, from Daly, "A higher order estimate of the optimum checkpoint interval for restart
// dumps", FGCS 22(3), 2006, eq. 37: for write time d < 2M (M the job's MTBF),
//   t = sqrt(2 d M) [1 + (1/3) sqrt(d / 2M) + (1/9) (d / 2M)] - d,   else t = M.
double daly_interval_s(double write_s, double mtbf_s);

}  // namespace hetflow::campaign
