#pragma once
// Which cluster to train on: each cluster searched for its best plan (search.hpp), and the
// clusters ranked by the time and the cost of training a number of tokens with it.
#include <string>
#include <vector>

#include "search/search.hpp"

namespace hetflow::search {

// One cluster with its best plan.
struct ClusterEntry {
  model::Cluster cluster;
  PlanRow best;
  double tokens_per_s = 0;  // global batch x tokens per sample / the best's iteration time
  double train_s = 0;       // tokens / tokens_per_s
  double train_usd = 0;     // train_s x the hourly price of the GPUs the best uses
};

struct Comparison {
  std::vector<ClusterEntry> entries;  // in the order given
  std::vector<size_t> by_time;        // entries, fastest to train first
  std::vector<size_t> by_cost;        // entries, cheapest to train first
  bool priced = false;                // every cluster has prices
};

// Searches each cluster (a built-in name or a file) as `request` says and ranks them for
// training `tokens` tokens. Throws InputError for a cluster without prices when the request
// ranks by cost.
Comparison compare_clusters(const std::vector<std::string>& clusters, const model::Network& network,
                            const Request& request, double tokens);

}  // namespace hetflow::search
