#pragma once
// `hetflow run`'s options read into a run::Request: the plan (a file, which fixes cluster,
// network and layout, or built from the plan options) and the run's options, each checked
// where it enters, with errors that name the option.
#include "run/run.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// Throws InputError naming the option (file "<command line>") for a value out of range, an
// option a plan file fixes, or a run of more task instances than --max-tasks allows.
run::Request read_run_request(po::variables_map& vm);

}  // namespace hetflow::tools
