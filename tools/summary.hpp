#pragma once
// Summaries of a cluster and a network, as text tables and as JSON (the --json form).
#include <iosfwd>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

Json cluster_json(const model::Cluster& cluster);
void print_cluster(std::ostream& out, const model::Cluster& cluster);

Json network_json(const model::Network& network);
void print_network(std::ostream& out, const model::Network& network);

}  // namespace hetflow::tools
