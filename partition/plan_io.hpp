#pragma once
// The plan file (versioned JSON, lossless round trip) and the text grid view.
#include <string>

#include "partition/plan.hpp"

namespace hetflow::partition {

// {"format": "hetflow-plan", "version": 1, "cluster": {...}, "network": {...}, "layout": {...},
//  "devices": [...], "streams": [...], "tasks": [{...}], "dependencies": [[from, to], ...],
//  "collectives": [...], "programs": [[{"stream": s, "tasks": [...]}] per device], "memory": [...]}
std::string write_plan_json(const Plan& plan);
// Throws InputError naming the file and the field (e.g. "tasks[12].device") for a malformed
// file, with the line for JSON syntax errors. Does not validate the plan's semantics: that
// is validate_plan's job, which reports deadlocks and mismatches by name.
Plan read_plan_json(const std::string& text, const std::string& file);

// One line per device that computes, in program order: "<device>: F0 F1 B0 ...";
// "F<mb>.<chunk>" with virtual stages, "W<mb>" for a split weight gradient, and " | "
// between iterations.
std::string plan_grid(const Plan& plan);

}  // namespace hetflow::partition
