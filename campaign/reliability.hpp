#pragma once
// How often a cluster's parts fail and what it takes to get going again: the `reliability:`
// section of a cluster file. Failures of each component class are exponential processes,
// one per unit (a GPU or a node) at the class's mean time between failures; defaults come
// from a published fleet (reliability.cpp cites them).
#include <array>
#include <string>
#include <string_view>

namespace hetflow::campaign {

// What broke. GPU and software failures count per GPU, the others per node (a node's
// share of the fabric, its switch ports and cables, for `network_switch`).
enum class Component { gpu, host, nic, network_switch, software };
inline constexpr int kComponents = 5;
std::string_view to_string(Component c);  // "gpu", "host", "nic", "switch", "software"
bool per_gpu(Component c);                // gpu, software: per GPU; others per node
bool needs_repair(Component c);           // hardware: the node leaves until repaired or replaced

struct Reliability {
  std::array<double, kComponents> mtbf_s{};  // per unit (GPU or node, see per_gpu), by Component
  double detection_s = 0;                    // from a failure until the job knows of it
  double relaunch_s = 0;                     // scheduling and starting the processes again
  double comm_setup_s_per_rank = 0;          // communicator set-up grows with the ranks it joins
  double repair_s = 0;                       // a failed node back in service, without a spare
  double spare_swap_s = 0;                   // a spare node takes a failed node's place
  double storage_node_bytes_per_s = 0;       // checkpoint reads and writes, per node
  double storage_aggregate_bytes_per_s = 0;  // the shared file system, all nodes together
  double host_copy_bytes_per_s = 0;          // GPU to host memory, per GPU (async checkpoint snapshot)
  double straggler_probability = 0;          // per node and step: it runs slow this step
  double straggler_slowdown = 1;             // how much slower a straggling node computes
};

// The defaults, each cited in reliability.cpp.
Reliability default_reliability();

// The `reliability:` mapping of a cluster file (YAML or JSON), every key optional (the
// default where absent); a file without the section gives the defaults. Keys: `mtbf:` with
// `gpu`, `host`, `nic`, `switch`, `software` (durations: "79000 h", "30 d"), `detection`,
// `relaunch`, `comm_setup_per_rank`, `repair`, `spare_swap` (durations), `storage_per_node`,
// `storage_aggregate`, `host_copy` (bandwidths), `straggler: {probability, slowdown}`.
// Other top-level keys are the cluster's and left alone. Throws InputError naming
// file, line and field.
Reliability parse_reliability(const std::string& text, const std::string& file);
// The same, read from a file (InputError when it cannot be read).
Reliability read_reliability_file(const std::string& path);

// A duration: a number with s, ms, us, min, h or d ("90 s", "2.5 h", "54 d"); a bare number
// is refused, as every quantity without a unit is. Throws std::invalid_argument saying what
// was expected.
double parse_duration_s(std::string_view text);

// Failures per second of the whole job on `gpus` GPUs in `nodes` nodes, by class and in all.
std::array<double, kComponents> failure_rates_per_s(const Reliability& r, int gpus, int nodes);
double job_failure_rate_per_s(const Reliability& r, int gpus, int nodes);

}  // namespace hetflow::campaign
