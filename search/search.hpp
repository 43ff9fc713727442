#pragma once
// The search for a plan, whole: partition/search.hpp scores every candidate by the analytic
// estimate of its layout; this re-simulates candidates with contention (sim/) and ranks them
// by what the simulator measured. Finalists are simulated in estimate order until the next
// estimate exceeds the best simulated time (or cost): the estimate leaves contention out, so it
// is below the simulation in practice, and no candidate left unsimulated could then beat the
// best. The same walk, within each baseline family (Megatron's uniform layout, pure data
// parallelism, each HetPipe policy), gives that family's fastest. A time budget bounds the
// walks; the outcome says how many plans each simulated and why it stopped, and lists every
// candidate it dropped with the reason.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/plan.hpp"
#include "partition/search.hpp"
#include "sim/simulator.hpp"

namespace hetflow::search {

// Where the walk stands while it simulates, for a progress line.
struct SimulationProgress {
  int index = 0;          // the search's n-th simulation (1-based)
  std::string plan;       // the candidate's summary
  double estimate = 0;    // its estimate, in the objective's unit (s or USD per iteration)
  double best = 0;        // the best simulated so far, same unit; 0: none yet
  sim::Progress simulation;  // of this simulation (zero when it starts)
};

// What one search of one cluster is asked.
struct Request {
  partition::SearchSpace space;
  partition::PlanOptions base;  // what the search does not vary (precision, workspace, bucket size...)
  int global_batch = 0;
  int top = 3;               // at least this many of the best estimates simulated; 0: none, ranked by estimate
  int sim_iterations = 3;    // iterations of each simulation (the first warms up)
  int threads = 0;           // threads scoring candidates (0: every core)
  bool by_cost = false;      // rank by dollars per iteration (time x price) instead of time
  double budget_s = 600;     // host time after which no simulation starts (but the search's first)
  std::string calibration;   // a calibration file or published:NAME, resolved for the cluster; empty: none
  partition::SearchSpread spread;  // the processes sharing the work (mpirun); one by default
  std::function<void(int, int)> on_scoring;                       // (done, total) while candidates are scored
  std::function<void(const SimulationProgress&)> on_simulation;   // while this process simulates
};

// One ranked plan, simulated or (with top 0) not.
struct PlanRow {
  partition::Candidate candidate;
  std::string name;                 // a baseline's family
  bool simulated = false;           // and completed
  double simulated_s = 0, samples_per_s = 0, mfu = 0, bubble = 0, exposed_comm_s = 0;
  std::string note;                 // a simulation that did not complete
  std::string fingerprint;          // what the plan does (policy name and recomputation setting aside)
  double time_s() const { return simulated ? simulated_s : candidate.estimate.iteration_time_s; }
};

// The objective: seconds per iteration, or with by_cost dollars per iteration.
double score(const PlanRow& row, bool by_cost);

// Why a walk stopped.
enum class Stop {
  not_simulating,       // top 0: ranked by the estimate alone
  estimate_above_best,  // the next candidate's estimate exceeds the best simulated
  exhausted,            // every candidate simulated
  budget,               // the time budget was spent first
};
std::string_view to_string(Stop stop);

// One walk through candidates in estimate order.
struct Walk {
  int simulated = 0;        // distinct plans simulated (or taken from an earlier walk) for it
  Stop stop = Stop::not_simulating;
  double next_estimate = 0; // the candidate it stopped before (estimate_above_best), objective units
  double best = 0;          // the best it simulated, objective units
};

// Why a candidate is not among the ranked plans (Dropped's counts, one each).
enum class DropReason {
  refused,              // by the policies or the builder
  over_memory,          // a device's memory overflows
  same_plan,            // builds the same plan as a candidate estimated faster
  not_completed,        // simulated, but the simulation did not complete
  estimate_above_best,  // not simulated: its estimate exceeds the best simulated
  over_budget,          // not simulated: the budget was spent before its turn
  estimate_only,        // top 0: ranked by the estimate, not simulated
};
// "refused", "over_memory", ...: the name of Dropped's count.
std::string_view to_string(DropReason reason);

// One dropped candidate and why.
struct DroppedCandidate {
  DropReason reason = DropReason::refused;
  // Its options and summary; refused: the error that refused it (file, field, message);
  // over memory: the device and by how much, found by the layout's bound or the plan.
  partition::Rejected detail;
  double estimate_s = 0;  // its estimated iteration time; 0 where none was made (refused)
  std::string same_as;    // same_plan: the summary of the candidate estimated faster that builds that plan
};

// Where every candidate went: these add up to SearchResult::candidates.
struct Dropped {
  int refused = 0;              // by the policies or the builder (some only once built for simulation)
  int over_memory = 0;          // a device's memory overflows: by the layout's bound or once built
  int screened = 0;             // of over_memory: by the layout's bound, never built
  int simulated = 0;            // simulated and completed: ranked
  int not_completed = 0;        // simulated, but the simulation did not complete (a deadlock, a stall)
  int same_plan = 0;            // builds the same plan as a candidate before it by estimate
  int estimate_above_best = 0;  // not simulated: its estimate exceeds the best simulated
  int over_budget = 0;          // not simulated: the budget was spent before its turn
  int estimate_only = 0;        // top 0: ranked by the estimate, not simulated
  // Every candidate dropped (all but `simulated`): the scoring's refused and over-memory ones
  // in the space's order, then the walks' in estimate order.
  std::vector<DroppedCandidate> candidates;
};

// A baseline family's fastest, or why it has none.
struct Baseline {
  std::string name;     // "uniform (Megatron)", "data parallel", "hetpipe-np", ...
  bool found = false;
  PlanRow row;          // found: its best
  Walk walk;            // found: how it was found
  std::string why_none; // not found: why
};

struct Outcome {
  partition::SearchResult scoring;  // the estimates' stage
  std::vector<PlanRow> ranked;      // every simulated plan (with top 0, the best estimates), best first
  Walk finalists;                   // the walk over all candidates
  std::vector<Baseline> baselines;  // in the order of baseline_families()
  Dropped dropped;
  double wall_s = 0;                // the whole search, scoring and simulations
};

// The baseline families' names, in the order the outcome lists them.
std::vector<std::string> baseline_families();

// Searches `cluster` for the best plan of `network`. Throws PlanError when no candidate fits,
// InputError for a bad grouping or calibration.
Outcome search_cluster(const model::Cluster& cluster, const model::Network& network, const Request& request);

// The plan of a candidate's options as the search simulated it, fingerprinted.
partition::Plan build_candidate_plan(const model::Cluster& cluster, const model::Network& network,
                                     const partition::PlanOptions& options, const partition::CostModel& cost);

}  // namespace hetflow::search
