#pragma once
// Reading and writing cluster and network descriptions (YAML; JSON is accepted since it is
// YAML's flow form), and resolving what users type after --cluster / --model.
// Every error is an InputError naming the file, the line and the field.
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "model/cluster.hpp"
#include "model/network.hpp"

namespace hetflow::model {

// Parse a cluster description. `file` only names the source in error messages.
// Checks the cluster for consistency too (see validate_cluster).
Cluster parse_cluster(const std::string& text, const std::string& file);
// YAML that parse_cluster reads back to an equal Cluster.
std::string write_cluster(const Cluster& cluster);

// Parse a network description: explicit layers, or `zoo: <spec>` (optionally with
// `precision:`). Precision given here overrides the file's; activation bytes of explicit
// layers then scale with the element size.
Network parse_network(const std::string& text, const std::string& file,
                      std::optional<Precision> precision = std::nullopt);
// YAML with every layer explicit, which parse_network reads back to an equal Network.
std::string write_network(const Network& network);

// Where a file's entries are, by field ("nodes[3]" -> 14, for the node a `count:` entry made
// too): a check made after reading names the line of the longest field that prefixes its own.
using FieldLines = std::map<std::string, int>;

// Consistency checks that hold for any cluster, whatever its source: a non-empty node list,
// positive sizes, known GPU types (with the nearest known names), unique node names,
// known regions, WAN links that connect every region. Throws InputError naming `file` (and
// the line, where `lines` knows it).
void validate_cluster(const Cluster& cluster, const std::string& file, const FieldLines& lines = {});

// --cluster X: a built-in preset name, or a path to a YAML/JSON file.
Cluster load_cluster(std::string_view name_or_path);
// --model X: a zoo name or spec, a network YAML/JSON file, a HuggingFace config.json
// (recognised by its keys), or a HuggingFace model folder as downloaded (its config.json; the
// network named after the folder). Without a precision the file's own (or fp16) is used. A
// path that does not exist (or cannot be read) is said to be missing, here and in
// load_cluster, rather than looked up among the built-in names.
Network load_network(std::string_view spec_or_path, std::optional<Precision> precision = std::nullopt);
// The config.json of a HuggingFace model folder; none when `path` is not a folder, an
// InputError when it is a folder without one.
std::optional<std::string> hf_model_folder_config(std::string_view path);
// The HuggingFace config.json that `--model X` reads (X itself, or a folder's); none when X
// is something else.
std::optional<std::string> hf_config_file(std::string_view spec_or_path);
// The tokenizer_config.json beside a HuggingFace config.json, read for its model_max_length
// (hf_tokenizer_max_length); none when there is no such file or it gives no limit. The
// tokenizer's file: `tokenizer_file` names it.
std::optional<int> hf_tokenizer_max_length_beside(const std::string& config_path);
std::string tokenizer_file(const std::string& config_path);

// Built-in clusters, in a stable order; the first is the default.
struct ClusterPreset {
  std::string name;
  std::string description;
};
std::vector<ClusterPreset> cluster_presets();
Cluster builtin_cluster(std::string_view name);  // throws InputError with nearest names (and cpu-N)

// cpu-N (N from 1 to kMaxCpuDevices): N CPU devices of this host, for the executor's CPU back
// end: one node, device type "CPU" at `flops_per_s` for every precision, 16 GiB each (the
// plan's budget; the executor caps what it really allocates), 10 GB/s copies between devices.
// The default speed is fixed so plans made for cpu-N are reproducible; `cpu-N:probed`
// (tools/) measures it with a short sgemm instead.
inline constexpr double kDefaultCpuFlopsPerS = 50e9;
inline constexpr int kMaxCpuDevices = 256;
Cluster cpu_cluster(int devices, double flops_per_s = kDefaultCpuFlopsPerS);
// A cluster file's text for one node of `gpus` GPUs of the catalog part `gpu` on the part's
// usual interconnect, named `name`, `comment` its first line: a machine's own GPUs, so that a
// run on them is measured against their peak (hetflow-gpu-probe cluster).
std::string one_node_cluster_yaml(const GpuSpec& gpu, int gpus, const std::string& name, const std::string& comment);
// N for a name "cpu-N" (digits only, 1..kMaxCpuDevices); 0 for any other name. Throws
// InputError for "cpu-" followed by digits out of range.
int cpu_cluster_devices(std::string_view name);

// selene-N (N from 1 to kMaxSeleneNodes): N DGX A100 nodes of NVIDIA's Selene as Narayanan et
// al. (SC'21, section 5.1) describe the cluster of their measurements: 8 A100 80 GB per node
// on NVLink/NVSwitch, 8 x 200 Gb/s HDR InfiniBand per node for the application, a
// non-blocking three-level fat tree (modelled as a non-blocking one: bandwidth is what counts).
inline constexpr int kMaxSeleneNodes = 560;  // Selene's own size (4,480 A100)
Cluster selene_cluster(int nodes);
// N for a name "selene-N"; 0 for any other name. Throws InputError when N is out of range.
int selene_cluster_nodes(std::string_view name);
std::string default_cluster_name();
std::string default_model_name();

}  // namespace hetflow::model
