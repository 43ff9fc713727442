// hetflow list: every built-in cluster, network, GPU type and published calibration, one line each.
#include <iomanip>
#include <ostream>

#include "model/calibration.hpp"
#include "model/gpu.hpp"
#include "model/io.hpp"
#include "model/units.hpp"
#include "model/zoo.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

void list_options(po::options_description&) {}

int run_list(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("list options");
  po::variables_map vm;
  if (!parse_command_options("list", args, options, vm, out)) return 0;

  const auto clusters = model::cluster_presets();
  const auto networks = model::zoo_entries();
  const auto& gpus = model::builtin_gpus();
  if (vm.count("json")) {
    Json j;
    j["default_cluster"] = model::default_cluster_name();
    j["default_model"] = model::default_model_name();
    for (const auto& c : clusters) j["clusters"].push_back({{"name", c.name}, {"description", c.description}});
    for (const auto& n : networks) j["networks"].push_back({{"name", n.name}, {"description", n.description}});
    for (const auto& g : gpus) {
      j["gpus"].push_back({{"name", g.name},
                           {"description", g.description},
                           {"fp16_flops_per_s", g.fp16_flops_per_s},
                           {"bf16_flops_per_s", g.bf16_flops_per_s},
                           {"fp32_flops_per_s", g.fp32_flops_per_s},
                           {"memory_bytes", g.memory_bytes},
                           {"memory_bandwidth_bytes_per_s", g.memory_bandwidth_bytes_per_s}});
    }
    for (const auto& c : model::published_calibrations()) {
      j["calibrations"].push_back({{"name", "published:" + std::string(c.name)}, {"description", std::string(c.description())}});
    }
    print_json(out, j);
    return 0;
  }
  out << "Clusters (--cluster NAME or a YAML/JSON file):\n";
  for (const auto& c : clusters) {
    out << "  " << std::left << std::setw(18) << c.name << c.description
        << (c.name == model::default_cluster_name() ? "  [default]" : "") << "\n";
  }
  out << "\nNetworks (--model NAME, a network YAML/JSON file, or a HuggingFace config.json):\n";
  for (const auto& n : networks) {
    out << "  " << std::left << std::setw(18) << n.name << (n.name.size() >= 18 ? "\n" + std::string(20, ' ') : "")
        << n.description << (n.name == model::default_model_name() ? "  [default]" : "") << "\n";
  }
  out << "\nGPU types (dense peaks; add your own under gpu_types: in a cluster file):\n";
  out << "  " << std::left << std::setw(14) << "name" << std::setw(15) << "fp16" << std::setw(15) << "fp32"
      << std::setw(10) << "memory" << std::setw(12) << "mem bw" << "description\n";
  for (const auto& g : gpus) {
    out << "  " << std::left << std::setw(14) << g.name << std::setw(15)
        << (model::units::human_flops(g.fp16_flops_per_s) + "/s") << std::setw(15)
        << (model::units::human_flops(g.fp32_flops_per_s) + "/s") << std::setw(10)
        << model::units::human_bytes(g.memory_bytes) << std::setw(12)
        << model::units::human_bandwidth(g.memory_bandwidth_bytes_per_s) << g.description << "\n";
  }
  out << "\nPublished calibrations (--calibration NAME; each number cites its source, model/calibrations/):\n";
  for (const auto& c : model::published_calibrations()) {
    out << "  " << std::left << std::setw(18) << "published:" + std::string(c.name) << c.description() << "\n";
  }
  return 0;
}

}  // namespace hetflow::tools
