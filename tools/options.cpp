#include "tools/options.hpp"

#include <stdexcept>

#include "model/error.hpp"
#include "model/io.hpp"

namespace hetflow::tools {

void add_cluster_model_options(po::options_description& options) {
  options.add_options()
      ("cluster", po::value<std::string>()->default_value(model::default_cluster_name()),
       "built-in cluster name (see `hetflow list`) or a cluster YAML/JSON file")
      ("model", po::value<std::string>()->default_value(model::default_model_name()),
       "zoo network, gpt:/llama: spec, network YAML/JSON file, or HuggingFace config.json")
      ("precision", po::value<std::string>(), "fp32, fp16 or bf16 (mixed precision); default: the model's, else fp16");
}

model::Cluster load_cluster_option(const po::variables_map& vm) {
  return model::load_cluster(vm["cluster"].as<std::string>());
}

model::Network load_network_option(const po::variables_map& vm) {
  std::optional<model::Precision> precision;
  if (vm.count("precision")) {
    try {
      precision = model::parse_precision(vm["precision"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      throw InputError("<command line>", 0, "--precision", e.what());
    }
  }
  return model::load_network(vm["model"].as<std::string>(), precision);
}

}  // namespace hetflow::tools
