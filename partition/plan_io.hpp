#pragma once
// The plan file (JSON, version 3; partition/plan.schema.json describes it), its fingerprint,
// and the text grid view.
#include <string>

#include "partition/plan.hpp"

namespace hetflow::partition {

// {"format": "hetflow-plan", "version": 3, "fingerprint": "xxh3:...", "cluster": {name, yaml},
//  "network": {name, yaml}, "layout", "devices", "axes", "coords", "streams", "communicators", "channels",
//  "collectives", "tensors", "tasks", "order", "programs", "memory"}. Lossless: reading it
// back gives the same plan.
std::string write_plan_json(const Plan& plan);
// Throws InputError naming the file and the field (e.g. "tasks[12].device") for a malformed
// file, with the line for JSON syntax errors; refuses version-1 and -2 files saying how to re-plan,
// nesting deeper than 64 levels, integers out of range, non-finite or negative quantities,
// and a fingerprint that does not match the content (an absent one is computed). Does not
// validate the plan's meaning: that is validate_plan's job, which names every problem.
Plan read_plan_json(const std::string& text, const std::string& file);

// "xxh3:<16 hex digits>": XXH3-64 of the plan's canonical JSON (write_plan_json's content
// without the fingerprint, compact). Equal plans have equal fingerprints.
std::string plan_fingerprint(const Plan& plan);

// One line per device that computes, in program order: "<device>: F0 F1 B0 ...";
// "F<mb>.<chunk>" with virtual stages, "W<mb>" for a split weight gradient.
std::string plan_grid(const Plan& plan);

}  // namespace hetflow::partition
