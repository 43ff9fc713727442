// The search space's defaults, chosen for the cluster and the network (SearchSpace's
// comments say which).
#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "partition/search.hpp"

namespace hetflow::partition::search_detail {

SearchSpace with_defaults(const model::Cluster& cluster, const model::Network& network, int global_batch,
                          SearchSpace s) {
  const int devices = static_cast<int>(cluster.devices().size());
  if (s.policies.empty()) s.policies = {"uniform", "balanced", "hetpipe-np", "hetpipe-ed", "hetpipe-hd", "grouped"};
  if (s.tensors.empty()) {
    int smallest = std::numeric_limits<int>::max();
    for (const model::Node& n : cluster.nodes) smallest = std::min(smallest, n.gpu_count);
    for (int t = 1; t <= smallest; t *= 2) s.tensors.push_back(t);
  }
  if (s.pipelines.empty()) {
    const int layers = search_detail::transformer_layers(network);
    for (int p = 1; p <= std::min(devices, layers); ++p) {
      if (devices % p == 0) s.pipelines.push_back(p);
    }
  }
  if (s.contexts.empty()) {
    const int seq = network.architecture ? network.architecture->seq : 0;
    for (int c = 1; c <= 16 && (c == 1 || (seq / c >= 8192 && seq % (2 * c) == 0)); c *= 2) s.contexts.push_back(c);
  }
  if (s.context_comms.empty()) s.context_comms = {ContextComm::all_gather, ContextComm::ring};
  if (s.experts.empty()) {
    const int experts = network.architecture ? network.architecture->moe.experts : 0;
    for (int ep = 1; ep <= std::min({experts, devices, 64}) || ep == 1; ep *= 2) {
      if (ep == 1 || experts % ep == 0) s.experts.push_back(ep);
    }
  }
  if (s.micro_batches.empty()) {
    for (int mb = 1; mb <= 32 && mb <= global_batch; mb *= 2) {
      if (global_batch % mb == 0) s.micro_batches.push_back(mb);
    }
  }
  if (s.schedules.empty()) s.schedules = {"1f1b", "gpipe", "interleaved"};
  if (s.recomputes.empty()) s.recomputes = {Recompute::none, Recompute::selective, Recompute::full};
  // WSP on request: its staleness is the user's to accept (training with it converges
  // differently), and its throughput only grows with it.
  if (s.syncs.empty()) s.syncs = {SyncKind::allreduce, SyncKind::ps};
  return s;
}

std::vector<ExpertChoice> expert_choices(const model::Cluster& cluster, const SearchSpace& space, int data, int tensor,
                                         bool sequence_parallel) {
  std::vector<ExpertChoice> out{{1, false}};
  if (data < 2 || (tensor != 1 && !sequence_parallel)) return out;
  std::set<std::string> types;
  for (const model::Node& n : cluster.nodes) types.insert(n.gpu);
  for (const int ep : space.experts) {
    if (ep < 2 || data % ep != 0) continue;
    out.push_back({ep, false});
    if (types.size() > 1) out.push_back({ep, true});
  }
  return out;
}

}  // namespace hetflow::partition::search_detail
