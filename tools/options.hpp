#pragma once
// Options several commands share: which cluster, which network, which precision.
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cluster.hpp"
#include "model/error.hpp"
#include "model/network.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// --cluster, --model, --precision (defaults: the built-in default cluster and model, fp16).
void add_cluster_model_options(po::options_description& options);
model::Cluster load_cluster_option(const po::variables_map& vm);
model::Network load_network_option(const po::variables_map& vm);
// --precision, if given.
std::optional<model::Precision> read_precision_option(const po::variables_map& vm);

// A library error about the plan options (partition::kOptions, field = PlanOptions member)
// as the command line says it: "stage_layers" -> "--stage-layers", `micro_batch` in the
// message -> --micro-batch. Other errors come back as they are.
InputError as_command_line_error(const InputError& e);
// The option for a PlanOptions member: "stage_layers" -> "--stage-layers".
std::string option_of(std::string member);

// The integer option `name` (declared po::value<int>), checked to lie in [low, high]: else an
// InputError "--name: expected low to high, found value".
int int_option_in(const po::variables_map& vm, const std::string& name, int low, int high);

// "1,2,4" -> {1, 2, 4}; "a,b" -> {"a", "b"}.
std::vector<std::string> split_list(const std::string& text);
// The list option `name` (declared po::value<std::string>) as positive integers; empty when
// not given. InputError "--name: ..." for an item that is not one.
std::vector<int> int_list(const po::variables_map& vm, const char* name);
// The list option `name`, each item through `parse` (which throws std::invalid_argument, made
// an InputError naming the option); empty when not given.
template <typename T, typename Parse>
std::vector<T> parsed_list(const po::variables_map& vm, const char* name, Parse parse) {
  std::vector<T> out;
  if (!vm.count(name)) return out;
  try {
    for (const std::string& item : split_list(vm[name].as<std::string>())) out.push_back(parse(item));
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
  return out;
}

}  // namespace hetflow::tools
