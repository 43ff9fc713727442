#pragma once
// The candidates a search dropped (search::Dropped::candidates), as `hetflow search` shows
// them: grouped by reason (a refusal by the option it names), the first few of each group
// and a count of the rest; --json lists every one with its layout and reason.
#include <ostream>

#include "search/search.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// The groups in the order the reasons are told (refusals, largest group first, then over
// memory, then the walks' reasons), `shown` candidates of each (0: nothing printed).
void print_dropped_candidates(std::ostream& out, const search::Dropped& dropped, size_t shown);

// Every dropped candidate: {"plan", "reason", the layout's options, and the reason's detail}.
Json dropped_candidates_json(const search::Dropped& dropped);

// A candidate's layout options as the search's JSON lists them, ranked or dropped: policy,
// tensor, pipeline, micro_batch, schedule, virtual_stages, recompute, sync, and groups and
// staleness where they apply.
Json plan_options_json(const partition::PlanOptions& o);

}  // namespace hetflow::tools
