#include "partition/layout_estimate_memo.hpp"

#include "partition/shard.hpp"

namespace hetflow::partition::estimate_detail {

WorkMemo::WorkMemo(const model::Network& network, const Layout& layout)
    : network_(network), layout_(layout), experts_(expert_split(network, layout)) {}

WorkMemo::Entry& WorkMemo::of(const Stage& s, int tensor, int worker) {
  const ExpertShare share = expert_share(experts_, layout_, worker);
  const auto key = std::make_tuple(s.layer_begin, s.layer_end, tensor, share.held, share.load);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    Entry e;
    e.work = builder::chunk_work(network_, layout_, s, tensor, share);
    const double elsewhere = expert_params_elsewhere(network_, s.layer_begin, s.layer_end, share.held, tensor);
    for (int j = 0; j < tensor; ++j) {
      e.params.push_back(part_params(network_, s.layer_begin, s.layer_end, SplitPart::rank(j, tensor)) - elsewhere);
      e.experts.push_back(share.held < 0 ? 0 : routed_expert_params(network_, s.layer_begin, s.layer_end, tensor) - elsewhere);
    }
    it = entries_.emplace(key, std::move(e)).first;
  }
  return it->second;
}

const std::vector<std::pair<int, double>>& WorkMemo::per_server(const Stage& s, int tensor, int worker, int j,
                                                                const std::vector<int>& server_of) {
  Entry& e = of(s, tensor, worker);  // (its expert rank's: the entries are per experts held)
  if (!e.servers_known) {
    const int held = expert_share(experts_, layout_, worker).held;
    e.per_server.resize(static_cast<size_t>(tensor));
    for (int r = 0; r < tensor; ++r) {
      std::map<int, double> by_server;
      for (int l = s.layer_begin; l < s.layer_end; ++l) {
        by_server[server_of[static_cast<size_t>(l)]] += layer_part_params(network_, l, s.layer_begin, SplitPart::rank(r, tensor)) -
                                                         expert_params_elsewhere(network_, l, l + 1, held, tensor);
      }
      e.per_server[static_cast<size_t>(r)].assign(by_server.begin(), by_server.end());
    }
    e.servers_known = true;
  }
  return e.per_server[static_cast<size_t>(j)];
}

}  // namespace hetflow::partition::estimate_detail
