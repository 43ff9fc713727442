#pragma once
// A plan as the launch configuration of the framework a user already trains with:
// Megatron-LM's arguments, a DeepSpeed config JSON, a torchtitan job TOML, and a plain list
// of what the plan does that the framework cannot be told. The names are the frameworks'
// own: Megatron-LM megatron/training/arguments.py, DeepSpeed's config JSON
// (deepspeed/runtime/config.py), torchtitan torchtitan/config/job_config.py.
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::tools {

// The plan as the frameworks see it: one grid of data x pipeline x tensor x context with
// equal parts.
struct LaunchGrid {
  int data = 1, pipeline = 1, tensor = 1, context = 1, virtual_stages = 1;
  int micro_batch = 1, microbatches = 1, global_batch = 1;
  int nodes = 1, gpus_per_node = 1;
  std::vector<int> chunk_layers;  // transformer layers per model chunk, in model order
  std::vector<std::string> cannot;  // what the plan does that no launch flag says
};

// A plan's launch for one framework: its grid (with what the framework cannot be told:
// launched as the text says, it runs without those) and the text (arguments, JSON or TOML).
struct Launch {
  LaunchGrid grid;
  std::string text;
};

// The frameworks export_launch knows: megatron, deepspeed, torchtitan.
const std::vector<std::string>& launch_frameworks();

// `plan` as `framework`'s launch. Throws hetflow::Error for a framework not in
// launch_frameworks() or a network that is not a decoder built from its architecture.
Launch export_launch(const partition::Plan& plan, const std::string& framework);

}  // namespace hetflow::tools
