#pragma once
// What would fit: when a plan built from options overflows device memory, the nearby
// options that fit — more pipeline stages, recomputation, tensor parallelism, ZeRO sharding — each with its
// analytic iteration time, so a user is told what to change instead of only "does not fit".
#include <string>
#include <utility>
#include <vector>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

// True when every device's memory (plan.memory, from the tensors' lifetimes) is within its
// capacity, and under offload every node's host memory holds its devices' host state.
bool fits_in_memory(const Plan& plan);

struct FitAdvice {
  // The PlanOptions members to change, by name ("pipeline", "tensor", "recompute", "zero_stage",
  // "reshard_after_forward", "zero_shares", "offload_optimizer", "offload_activations") with
  // their new values as text: tools/ turns them into its options.
  std::vector<std::pair<std::string, std::string>> changes;
  PlanOptions options;              // the options with the changes made
  double iteration_time_s = 0;      // analytic estimate
  double peak_fraction = 0;         // the fullest device's memory / its capacity
};

// Up to `max_answers` option sets that fit, fastest first, for `failed` (a plan built from
// `options` that overflows memory). Nearby options — deeper pipelines, tensor parallelism
// within a node, recomputation, ZeRO sharding, optimizer and activation offload, and their
// combinations; ZeRO's shares by memory over replicas of different memory sizes — are first screened by scaling the failed plan's memory terms (state by
// 1/(p t) and by what a ZeRO stage shards over the replicas, the optimizer's none when
// offloaded, activations by the stash the recomputation and tensor degree leave, and to three
// micro-batches' when offloaded); those predicted to come near capacity are built for real, the smallest changes
// first, until `max_answers` fit or `max_tasks_built` tasks were built (a bound on the time
// the advice takes); where the fewest changes that fit leave places, every candidate of the
// next tier is built and its fastest take them. Only the members the policy reads are varied: none
// for a layout file, no pipeline or tensor change when the cuts are fixed or the policy
// places stages itself. Empty when nothing nearby fits.
std::vector<FitAdvice> what_would_fit(const Plan& failed, const PlanOptions& options, const CostModel& cost,
                                      int max_answers = 4, long long max_tasks_built = 4'000'000);

}  // namespace hetflow::partition
