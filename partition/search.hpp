#pragma once
// The search for a plan: candidates from a space of layouts (policy, tensor and pipeline
// degrees, micro-batch size, schedule, recomputation, synchronisation), each laid out by its
// policy and scored by the analytic estimate of its layout (partition/layout_estimate.hpp:
// the plan's estimate without building the plan) on every core; those whose memory bound
// overflows are screened out unbuilt. Then the best of each family by that estimate are built
// into plans, which check their memory by tensor lifetimes, and ranked. The caller
// re-simulates the best with contention (search/search.hpp: partition/ knows no simulator).
//
// Every candidate is an ordinary PlanOptions: the winner is rebuilt, written and run as any
// plan is. A candidate the policies or the builder refuse (degrees that do not divide the
// cluster, a batch that does not split) is refused, never ranked; the result lists each
// refused or over-memory candidate with what refused it (Rejected).
#include <functional>
#include <string>
#include <vector>

#include "model/cluster.hpp"
#include "model/error.hpp"
#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/estimate.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

struct SearchSpace {
  // Empty lists take the defaults, chosen for the cluster and the network:
  std::vector<std::string> policies;   // uniform, balanced, hetpipe-np, hetpipe-ed, hetpipe-hd, grouped
  std::vector<int> tensors;            // powers of two up to the smallest node's GPU count;
                                       // policy grouped may give each GPU type its own
  std::vector<int> pipelines;          // divisors of the device count up to the layer count
  // Context parallelism's group sizes (uniform and balanced, all-reduce): 1, and for a decoder
  // whose sequences are long, powers of two up to 16 that leave each device 8,192 tokens or
  // more and split the sequence in 2C chunks.
  std::vector<int> contexts;
  // How context groups of 2 or more exchange keys and values: all_gather and ring, each tried.
  std::vector<ContextComm> context_comms;
  // Expert parallelism's group sizes (uniform and balanced, all-reduce, one device a rank): 1,
  // and for a mixture of experts the powers of two that divide its experts, up to 64 and the
  // device count. On a cluster of more than one GPU type each size above 1 is tried with the
  // experts placed contiguously and by speed (place_experts_by_speed).
  std::vector<int> experts;
  std::vector<int> micro_batches;      // powers of two up to 32 that divide the global batch
  std::vector<std::string> schedules;  // 1f1b, gpipe, interleaved (2 chunks per rank)
  std::vector<Recompute> recomputes;   // none, selective, full
  std::vector<SyncKind> syncs;         // allreduce, ps (wsp when asked for)
  std::vector<std::string> groupings;  // policy grouped's `groups`; default: search_groupings'
  // WSP's staleness bound D: the most a user's training tolerates (throughput only grows with
  // it, so the search takes it as given). A WSP candidate is estimated over 2 D + 4 iterations
  // (its steady state: a worker waits for the pull D + 1 iterations back), and so simulated.
  int staleness = 1;
  // ZeRO over the data axis (Layout::sync.zero): an all-reduce candidate of two or more workers
  // whose memory bound overflows at the base's stage tries the stages that shard more (1, 2,
  // 3, and 3 kept gathered and resharded after every pass, from the base's up) and becomes the
  // fastest that fits by the layout's estimate (ties as search_order breaks them, then less
  // sharding). One that fits is left unsharded: sharding is for memory.
  bool zero = true;
  // Offload (Layout::offload): an all-reduce candidate that overflows tries, after the
  // shardings, each with the optimizer state in host memory, as above; a sharding that fits
  // on the GPUs is not tried offloaded (offload is for memory too). Then each of those that
  // overflows with its stashes offloaded too, where its schedule lets any leave.
  bool offload = true;
};

// How many iterations a candidate is estimated over: 2 D + 4 for WSP with D >= 1, else the
// base options'.
int estimated_iterations(const PlanOptions& options);

struct Candidate {
  PlanOptions options;
  std::string summary;  // "uniform t2 p4 d2, mb 4 x 8, 1f1b, recompute none, allreduce"
  // The built plan's (estimate_plan), but iteration time, throughput and the GPUs' own
  // (compute_) figures: its layout's estimate.
  Estimate estimate;
  // Its layout's estimate is the loader's floor (partition/loading.hpp, loader_bound): the
  // GPUs alone (estimate.compute_iteration_time_s) would go faster.
  bool input_bound = false;
  int gpus = 0;  // the GPUs its layout uses (workers and servers), as its price counts them
  double headroom_bytes = 0;  // the least free memory of any device (negative: does not fit)
  std::string tightest_device;  // that device
  double slowest_busy_s = 0;  // the busiest device's compute per iteration
  std::string slowest_device;
  int devices_used = 0;
  double price_usd_per_hour = 0;  // of the GPUs the plan uses (workers and servers), at the cluster's prices
};

// A candidate scored by its layout's estimate and found to fit by the memory bound, but never
// built into a plan (see SearchResult::unbuilt): evaluate_candidate builds it when wanted.
struct Scored {
  PlanOptions options;
  std::string summary;             // candidate_summary, with its layout's worker count
  double iteration_time_s = 0;     // the layout's estimate, as Candidate's
  double price_usd_per_hour = 0;   // of the GPUs its layout uses, as Candidate's
  double compute_iteration_time_s = 0;  // the layout's estimate with a loader that limits nothing
  bool input_bound = false;        // as Candidate's
  int gpus = 0;                    // as Candidate's
};

// What the search orders candidates by (search_order).
struct RankKey {
  double score = 0;                     // the objective: the layout's iteration time, or its cost
  bool input_bound = false;             // the score is the loader's floor
  double price_usd_per_hour = 0;
  int gpus = 0;
  double compute_iteration_time_s = 0;  // the GPUs' own: the layout's estimate with a loader that limits nothing
};
RankKey rank_key(const Candidate& c);
RankKey rank_key(const Scored& s);

// Items 0..n-1 in the search's order: the lower score first. Candidates whose scores tie
// with an input-bound one's (within a relative 1e-9: one loader's floor) all deliver the
// loader's rate, whichever a user picks: the cheaper comes first (price per hour, then fewer
// GPUs), as it buys that rate for less and leaves GPUs free; then the one whose GPUs alone are
// faster, as it goes furthest once the loader is made faster; else the items' own order.
std::vector<size_t> search_order(size_t n, const std::function<RankKey(size_t)>& key);

// A candidate the scoring left out, and why: the refusal as the policy or the builder threw it
// (an InputError's file, field and message; a PlanError's message), or the device it overflows.
struct Rejected {
  PlanOptions options;
  std::string summary;  // candidate_summary, with the worker count where a layout was made
  bool over_memory = false;  // else refused
  std::string file;     // refused by an InputError: its file (kOptions: `field` is a PlanOptions member)
  std::string field;    // refused by an InputError: the field it names ("global_batch", "pipeline"...)
  std::string message;  // refused: what it says
  double iteration_time_s = 0;  // over memory: the layout's estimate
  std::string device;   // over memory: the device with the least free memory
  double over_bytes = 0;  // over memory: by how much that device overflows
  bool screened = false;  // over memory: found by the layout's bound, never built
};

struct SearchResult {
  std::vector<Candidate> ranked;  // built candidates that fit, in search_order of their estimates
  std::vector<Scored> unbuilt;    // the pruned ones (see `pruned`), in search_order of their estimates
  int candidates = 0;             // in the space
  int refused = 0;                // the policies or the builder refused the options
  int over_memory = 0;            // some device's memory overflows (screened, or built and found so)
  int screened = 0;               // of those: found by the layout's memory bound, never built
  int pruned = 0;                 // fit by the bound but never built: slower than the kept of each family
  std::vector<Rejected> rejected; // the refused and over-memory ones (refused + over_memory), in the space's order
  double wall_s = 0;
};

// One grouping of policy grouped (PlanOptions::groups), its shallowest pipeline, and the
// tensor-parallel degree of its terms that name none (PlanOptions::tensor).
struct Grouping {
  std::string groups;
  int shallowest = 0;  // ranks
  int tensor = 1;
};
// The groupings the search tries at tensor degree `tensor`, on clusters of two or more GPU
// types: for each k, the fastest k types (by peak at the run's precision; the slower ones
// idle), either each type in pipelines of its own (workers of unequal size: per type, the two
// shallowest depths whose GPUs hold the model's weights, gradients and Adam state), or w
// identical workers of an equal share of every type (w dividing every type's ranks).
std::vector<Grouping> search_groupings(const model::Cluster& cluster, const model::Network& network, int tensor,
                                       const PlanOptions& base);

// The groupings whose GPU types differ in tensor-parallel degree (TP per worker, or per stage
// in mixed workers). A type's choices: its GPUs in ranks of t (from `tensors`, dividing the
// heads) in pipelines of any depth whose ranks hold the model's state. For the fastest k >= 2
// types, each type in pipelines of its own: a coordinate descent on the layout's estimate
// (micro-batch 1, 1F1B, no or full recomputation, whichever fits and is faster), one type's
// choice changed at a time, from each degree's shallowest choices for all; the best end, where
// it has two or more degrees, and w identical mixed workers at its degrees. The first type's
// degree is a grouping's `tensor`, the others' `tpT`.
std::vector<Grouping> search_tensor_mixes(const model::Cluster& cluster, const model::Network& network,
                                          const std::vector<int>& tensors, int global_batch, const PlanOptions& base,
                                          const CostModel& cost);

namespace search_detail {
// Transformer layers, or all layers when there are none: how deep a pipeline may go.
int transformer_layers(const model::Network& network);
// An expert-parallel size and whether its experts are placed by speed.
struct ExpertChoice {
  int parallel = 1;
  bool by_speed = false;
};
// A candidate's expert choices at `data` replicas (0: a policy that lays no expert groups) and
// tensor degree `tensor`: 1 always; each of the space's sizes above 1 that divides the
// replicas at tensor 1, or above with sequence parallelism (check_experts), placed
// contiguously and, on a cluster of several GPU types, by speed.
std::vector<ExpertChoice> expert_choices(const model::Cluster& cluster, const SearchSpace& space, int data, int tensor,
                                         bool sequence_parallel);
// The space with its empty lists given their defaults (search_space.cpp).
SearchSpace with_defaults(const model::Cluster& cluster, const model::Network& network, int global_batch, SearchSpace s);
}  // namespace search_detail

// The families a candidate competes in for a place among the kept ones: "all", its policy
// and sync ("uniform/allreduce"), and "data-parallel" for uniform t1 p1 with all-reduce.
std::vector<std::string> candidate_families(const PlanOptions& options);

// The candidates of `space` (defaults filled in) for `global_batch` samples per iteration;
// `base` gives what the search does not vary (precision, workspace, bucket size...).
std::vector<PlanOptions> search_candidates(const model::Cluster& cluster, const model::Network& network,
                                           int global_batch, const SearchSpace& space, const PlanOptions& base,
                                           const CostModel& cost);

// Builds and scores one candidate; false when it is refused, with `why` filled in (summary,
// file, field, message) where given.
bool evaluate_candidate(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                        const CostModel& cost, Candidate* out, Rejected* why);
// Fills `why`'s file, field and message from the error that refused a candidate.
void note_refusal(const Error& e, Rejected* why);

// How one search is shared by several processes (the ranks of `mpirun -np N hetflow search`):
// process `rank` of `size` scores the candidates i with i % size == rank; all_gather gives
// every process what every process passed it, concatenated in rank order (every process
// calls it at the same point with its own part). What follows the scoring (the plans of
// each family's best) every process computes alike, so all end with the same result, the
// single-process one. The default is one process.
struct SearchSpread {
  int rank = 0;
  int size = 1;
  std::function<std::vector<double>(const std::vector<double>&)> all_gather;
};

// All candidates on `threads` threads (0: every core). With keep > 0, only the best `keep`
// of each family that fit are built (more when a built one overflows, see above): `ranked`
// holds them, the same as building every candidate would rank first in each family (the
// layout's estimate is the plan's, its memory a lower bound), whatever the threads. With
// keep 0 every candidate that may fit is built and ranked. on_progress(done, total) is
// called from the calling thread about every 100 ms while this process's candidates are
// scored.
SearchResult search_plans(const model::Cluster& cluster, const model::Network& network, int global_batch,
                          const SearchSpace& space, const PlanOptions& base, const CostModel& cost, int threads = 0,
                          int keep = 0, const std::function<void(int, int)>& on_progress = {},
                          const SearchSpread& spread = {});

// "uniform t2 p4 d2, mb 4, 1f1b, recompute none, allreduce"; workers 0 (no layout was made)
// leaves the worker count out.
std::string candidate_summary(const PlanOptions& options, int workers);

}  // namespace hetflow::partition
