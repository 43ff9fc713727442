#pragma once
// Chakra execution traces on disk (traces/chakra.hpp has the format): a directory of
// `<prefix>.<rank>.et` files, one per rank, and ASTRA-sim's `comm_group.json`.
#include <string>

#include "partition/plan.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// --model chakra:DIR: the workload in DIR as a plan for the --cluster (`--iterations`,
// `--calibration` and `--max-tasks` apply; any layout option is refused: the trace fixes
// every task). Not validated.
bool is_chakra_model(const std::string& model);
partition::Plan plan_from_chakra(const po::variables_map& vm);

}  // namespace hetflow::tools
