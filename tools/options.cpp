#include "tools/options.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "exec/cpu_backend.hpp"
#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout.hpp"

namespace hetflow::tools {

void add_cluster_model_options(po::options_description& options) {
  options.add_options()
      ("cluster", po::value<std::string>()->default_value(model::default_cluster_name()),
       "built-in cluster name (see `hetflow list`) or a cluster YAML/JSON file")
      ("model", po::value<std::string>()->default_value(model::default_model_name()),
       "zoo network, gpt:/llama: spec, network YAML/JSON file, or HuggingFace config.json")
      ("precision", po::value<std::string>(), "fp32, fp16 or bf16 (mixed precision); default: the model's, else fp16")
      ("seq-length", po::value<int>(),
       "tokens per sample of a decoder or encoder (default: the model's; a config.json's max_position_embeddings)");
}

model::Cluster load_cluster_option(const po::variables_map& vm) {
  const std::string name = vm["cluster"].as<std::string>();
  // cpu-N:probed: the built-in CPU cluster at the speed a short sgemm measures here.
  constexpr std::string_view probed = ":probed";
  if (name.size() > probed.size() && name.ends_with(probed)) {
    const std::string base = name.substr(0, name.size() - probed.size());
    if (const int n = model::cpu_cluster_devices(base); n > 0) return model::cpu_cluster(n, exec::probe_sgemm_flops_per_s());
  }
  return model::load_cluster(name);
}

std::optional<model::Precision> read_precision_option(const po::variables_map& vm) {
  if (!vm.count("precision")) return std::nullopt;
  try {
    return model::parse_precision(vm["precision"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, "--precision", e.what());
  }
}

namespace {
// A released config.json gives the longest context the model supports (131,072 tokens for
// Llama 3.2), not the length it is trained at: a 1B model then needs terabytes per sample
// and no plan fits. The tokenizer's model_max_length beside it caps that (its tokenizer never
// makes a longer input). Where the length came from is said on stderr, where every command's
// user sees it, with the option that sets the length.
void note_hf_sequence_length(const std::string& model, const model::Network& network, std::optional<int> given) {
  const std::optional<std::string> config = model::hf_config_file(model);
  if (!config || !network.architecture) return;
  std::ifstream in(*config);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string key = model::hf_config_sequence_key(text.str(), *config);
  const std::optional<int> tokenizer_max = model::hf_tokenizer_max_length_beside(*config);
  const std::string tokenizer = model::tokenizer_file(*config);
  const int seq = network.architecture->seq;
  if (given) {
    // As transformers' run_clm warns: the tokenizer cuts its inputs below that length.
    if (tokenizer_max && *given > *tokenizer_max) {
      std::cerr << "hetflow: note: --seq-length " << *given << " is above model_max_length " << *tokenizer_max << " in "
                << tokenizer << ": the model's tokenizer makes no input that long\n";
    }
    return;
  }
  const std::string from_config = key.empty() ? "the default of its model_type" : "the config's " + key;
  if (const int uncapped = model::transformer_from_hf_config(text.str(), *config).seq; uncapped != seq) {
    std::cerr << "hetflow: note: " << network.name << ": " << seq << " tokens per sample, model_max_length in "
              << tokenizer << " (the longest input its tokenizer makes; " << from_config << " is " << uncapped
              << "); --seq-length sets the length you train at\n";
    return;
  }
  if (key == "n_positions" || key == "n_ctx") return;  // GPT-2's: the length it was trained at
  std::cerr << "hetflow: note: " << network.name << ": " << seq << " tokens per sample, "
            << from_config << " (the longest context it supports); --seq-length sets the length you train at (e.g. --seq-length 2048)\n";
}
}  // namespace

model::Network load_network_option(const po::variables_map& vm) {
  const std::string model = vm["model"].as<std::string>();
  if (model.rfind("chakra:", 0) == 0) {
    throw InputError("<command line>", 0, "--model",
                     model + " is a workload of tasks (Chakra traces), not a network: plan, simulate and run take it");
  }
  model::Network network = model::load_network(model, read_precision_option(vm));
  if (!vm.count("seq-length")) {
    note_hf_sequence_length(model, network, std::nullopt);
    return network;
  }
  note_hf_sequence_length(model, network, vm["seq-length"].as<int>());
  // Another sequence length: the layers again from the architecture. A learned position
  // table keeps its rows (a GPT-2 of 1024 positions trained at 256 tokens); rotary
  // scaling keeps the context it was trained with.
  const int seq = vm["seq-length"].as<int>();
  if (!network.architecture) {
    throw InputError("<command line>", 0, "--seq-length",
                     "the network '" + network.name + "' is not a transformer built from its architecture, so its layers fix the tokens per sample");
  }
  model::TransformerConfig config = *network.architecture;
  if (seq == config.seq) return network;
  if (config.learned_positions && config.positions == 0) config.positions = config.seq;
  config.seq = seq;
  config.name += " (seq " + std::to_string(seq) + ")";  // a spec's name says its own seq
  try {
    return model::make_transformer(config, network.precision);
  } catch (const InputError& e) {
    throw InputError("<command line>", 0, "--seq-length", e.message());
  }
}

std::string option_of(std::string member) {
  if (member == "bucket_bytes") return "--bucket-size";
  if (member == "layout_file") return "--layout";
  if (member == "workspace_bytes") return "--workspace";
  if (member == "reshard_after_forward") return "--no-reshard-after-forward";
  if (member == "context") return "--context-parallel";
  if (member == "context_comm") return "--cp-comm";
  std::replace(member.begin(), member.end(), '_', '-');
  return "--" + member;
}

int int_option_in(const po::variables_map& vm, const std::string& name, int low, int high) {
  const int value = vm[name].as<int>();
  if (value < low || value > high) {
    throw InputError("<command line>", 0, "--" + name,
                     "expected " + std::to_string(low) + " to " + std::to_string(high) + ", found " +
                         std::to_string(value));
  }
  return value;
}

InputError as_command_line_error(const InputError& e) {
  if (e.file() != partition::kOptions) return e;
  std::string message;
  const std::string& m = e.message();
  for (size_t i = 0; i < m.size();) {  // `member` -> --option
    const size_t open = m.find('`', i), close = open == std::string::npos ? open : m.find('`', open + 1);
    if (close == std::string::npos) {
      message += m.substr(i);
      break;
    }
    message += m.substr(i, open - i) + option_of(m.substr(open + 1, close - open - 1));
    i = close + 1;
  }
  return InputError("<command line>", 0, option_of(e.field()), message);
}

// "1,2,4" -> {1, 2, 4}; "a,b" -> {"a", "b"}.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> int_list(const po::variables_map& vm, const char* name) {
  std::vector<int> out;
  if (!vm.count(name)) return out;
  for (const std::string& item : split_list(vm[name].as<std::string>())) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1 || v > 1'000'000) {
      throw InputError("<command line>", 0, std::string("--") + name,
                       "expected a comma-separated list of positive integers, found '" + item + "'");
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace hetflow::tools
