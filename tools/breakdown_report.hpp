#pragma once
// How `simulate --breakdown` shows where an iteration goes (traces/breakdown.hpp): compute by
// operation, exposed communication by purpose, idle, as a text table or the --json object.
#include <iosfwd>

#include "tools/cli.hpp"
#include "traces/breakdown.hpp"

namespace hetflow::tools {

void print_breakdown(std::ostream& out, const traces::Breakdown& b);
Json breakdown_json(const traces::Breakdown& b);

}  // namespace hetflow::tools
