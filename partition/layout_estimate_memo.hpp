#pragma once
// What estimate_layout (partition/layout_estimate.cpp) keeps per chunk: its work and each
// tensor rank's shard of its parameters, by (layers, degree), made once and asked for by
// every data-parallel replica of the chunk.
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "model/network.hpp"
#include "partition/layout.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::estimate_detail {

// Chunk work and parameters by (layers, degree, experts held, expert load): data-parallel
// replicas ask for the same few. Under expert parallelism a worker holds and computes its
// expert rank's experts (the estimate then gates each pass by its group's slowest member:
// layout_estimate_chunks.cpp).
class WorkMemo {
 public:
  WorkMemo(const model::Network& network, const Layout& layout);
  struct Entry {
    builder::ChunkWork work;
    std::vector<double> params;  // per tensor rank: its shard (partition/shard.hpp)
    std::vector<double> experts;  // ... of which routed experts' (0 without expert parallelism)
    // Parameter servers: the chunk's parameters per device, by the server that hosts them
    // (Builder::add_parameter_server_sync), once asked for.
    std::vector<std::vector<std::pair<int, double>>> per_server;  // per tensor rank
    bool servers_known = false;
  };
  // The chunk of stage `s` at degree `tensor` on worker `worker`, made when first asked for.
  Entry& of(const Stage& s, int tensor, int worker);
  // The layout's expert dispatch: the part of the copies kept and each expert rank's part.
  const Dispatch& dispatch() const { return experts_.dispatch; }
  // The copies worker `worker`'s expert rank computes, as a multiple of an even share.
  double expert_load(int worker) const { return expert_share(experts_, layout_, worker).load; }
  // Worker `worker`'s rank j's shard of them (partition/shard.hpp; its expert rank's experts
  // under expert parallelism), as the builder pushes it.
  const std::vector<std::pair<int, double>>& per_server(const Stage& s, int tensor, int worker, int j,
                                                        const std::vector<int>& server_of);

 private:
  const model::Network& network_;
  const Layout& layout_;
  ExpertSplit experts_;
  std::map<std::tuple<int, int, int, int, double>, Entry> entries_;
};

}  // namespace hetflow::partition::estimate_detail
