#include "search/compare.hpp"

#include <algorithm>
#include <numeric>

#include "model/error.hpp"
#include "model/io.hpp"

namespace hetflow::search {

Comparison compare_clusters(const std::vector<std::string>& clusters, const model::Network& network,
                            const Request& request, double tokens) {
  Comparison c;
  for (const std::string& name : clusters) {
    ClusterEntry e;
    e.cluster = model::load_cluster(name);
    if (request.by_cost && !e.cluster.priced()) {
      throw InputError(name, 0, "nodes.price", "--objective cost needs a price on every node (price: 2.1 USD/h)");
    }
    const Outcome o = search_cluster(e.cluster, network, request);
    e.best = o.ranked.front();
    const double samples_per_s = e.best.time_s() > 0 ? e.best.candidate.options.global_batch / e.best.time_s() : 0;
    e.tokens_per_s = samples_per_s * network.tokens_per_sample;
    e.train_s = e.tokens_per_s > 0 ? tokens / e.tokens_per_s : 0;
    e.train_usd = e.train_s / 3600 * e.best.candidate.price_usd_per_hour;
    c.entries.push_back(std::move(e));
  }
  c.by_time.resize(c.entries.size());
  std::iota(c.by_time.begin(), c.by_time.end(), 0);
  c.by_cost = c.by_time;
  const auto& entries = c.entries;
  std::stable_sort(c.by_time.begin(), c.by_time.end(),
                   [&](size_t a, size_t b) { return entries[a].train_s < entries[b].train_s; });
  std::stable_sort(c.by_cost.begin(), c.by_cost.end(),
                   [&](size_t a, size_t b) { return entries[a].train_usd < entries[b].train_usd; });
  c.priced = std::all_of(entries.begin(), entries.end(), [](const ClusterEntry& e) { return e.cluster.priced(); });
  return c;
}

}  // namespace hetflow::search
