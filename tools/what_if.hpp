#pragma once
// What-if changes shared by `simulate` and `replay`: the same plan on changed hardware.
//  --scale-gpu TYPE|DEVICE:FACTOR  every GPU of a type (or one device) computes FACTOR times
//                                  as fast (0.5: half as fast), from the start;
//  --link CLASS:bandwidth=B,latency=L  every link of a class (pcie, nvlink, nvswitch: a node's
//                                  GPU links of that kind; nic; wan; fabric: the switch hop's
//                                  latency) gets this bandwidth and/or latency;
//  --straggler DEVICE:FACTOR@TIME  from TIME on, DEVICE computes FACTOR times slower.
// A what-if run is reported beside the baseline (the same run without the changes), with the
// difference explained: bubble, exposed communication, the slowest device.
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "partition/plan.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "traces/metrics.hpp"

namespace hetflow::tools {

struct WhatIf {
  std::vector<sim::Straggler> slowdowns;  // --scale-gpu (from 0, factor 1/FACTOR) and --straggler
  std::vector<std::string> changes;       // each change as given, for the report
  bool changes_cluster = false;           // --link: the plan's cluster differs from the baseline's
  bool any() const { return !changes.empty(); }
};

void add_what_if_options(po::options_description& options);

// A device of the plan by name or id; "WHAT@TIME" split into WHAT and seconds (TIME takes
// units; a plain number is seconds). InputError naming `option` otherwise.
int device_by_name(const partition::Plan& plan, const std::string& text, const std::string& option);
std::pair<std::string, double> split_at(const std::string& text, const std::string& option);

// Reads the what-if options; --link changes `plan.cluster` (and its fingerprint). Throws
// InputError naming the option for a device, type, class or value that is not there.
WhatIf read_what_if(const po::variables_map& vm, partition::Plan& plan);

// "what if <changes>:" then iteration time, bubble, exposed communication and the slowest
// device, baseline beside what-if, each with its change.
void print_what_if(std::ostream& out, const WhatIf& w, const traces::Metrics& baseline, const traces::Metrics& changed);
Json what_if_json(const WhatIf& w, const traces::Metrics& baseline, const traces::Metrics& changed);

}  // namespace hetflow::tools
