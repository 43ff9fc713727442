#pragma once
// What `hetflow search` prints: a search's outcome (search/search.hpp) as the table, the
// summary lines and the JSON; a comparison of clusters (search/compare.hpp) likewise.
#include <ostream>
#include <string>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "search/compare.hpp"
#include "search/search.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// The search's report as text: what was searched, how many simulated and why it stopped,
// what was dropped and why (`dropped_shown` candidates of each reason), the ranked plans, the
// baselines and the best.
void print_search(std::ostream& out, const model::Network& network, const model::Cluster& cluster,
                  const search::Request& request, const search::Outcome& outcome, size_t dropped_shown);

// The same as JSON (the best's layout file is the caller's to add).
Json search_json(const search::Request& request, const search::Outcome& outcome);

// One ranked plan as JSON.
Json row_json(const search::PlanRow& row);

// A comparison of clusters as text or JSON.
void print_comparison(std::ostream& out, const model::Network& network, const search::Request& request,
                      const search::Comparison& comparison, double tokens);
Json comparison_json(const search::Comparison& comparison, double tokens);

}  // namespace hetflow::tools
