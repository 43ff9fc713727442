#pragma once
// Measured (or default) efficiencies that turn peak specs into expected times. The defaults
// are documented here and replaceable by a calibration file, which traces/ fits from
// measured runs.
#include <map>
#include <string>

namespace hetflow::model {

// Compute time of an operation of F FLOPs on a GPU of peak P at this precision:
//   time_s = overhead_s + F / (P * max_efficiency)
// i.e. efficiency F / (time * P) grows with operation size towards max_efficiency; small
// operations pay the fixed overhead (kernel launches, synchronisation).
struct GpuEfficiency {
  double max_efficiency = 0.6;   // large dense matmuls reach ~60 % of the data-sheet peak
  double overhead_s = 20e-6;     // per task: tens of kernels of a few microseconds each
  bool operator==(const GpuEfficiency&) const = default;
};

// A link class's measured behaviour relative to its nominal figures:
//   time_s = latency_s * latency_factor + bytes / (bandwidth * bandwidth_factor)
struct LinkCalibration {
  double bandwidth_factor = 1.0;
  double latency_factor = 1.0;
  bool operator==(const LinkCalibration&) const = default;
};

struct Calibration {
  GpuEfficiency default_gpu;
  std::map<std::string, GpuEfficiency> gpus;     // by GPU type name
  std::map<std::string, LinkCalibration> links;  // by link class: pcie, nvlink, nvswitch, nic, wan

  const GpuEfficiency& gpu(const std::string& type) const;
  LinkCalibration link(const std::string& link_class) const;
  bool operator==(const Calibration&) const = default;
};

// YAML (JSON accepted):
//   default_gpu: {max_efficiency: 0.6, overhead: 20 us}
//   gpus: {V100-16: {max_efficiency: 0.55, overhead: 30 us}}
//   links: {nic: {bandwidth_factor: 0.8, latency_factor: 1.5}}
Calibration parse_calibration(const std::string& text, const std::string& file);
std::string write_calibration(const Calibration& calibration);
Calibration load_calibration(const std::string& path);

struct Cluster;
// The calibration as a cost model for `cluster` reads it: every GPU type it names spelt as
// the cluster and the catalog spell it (names are case-insensitive, as in cluster files).
// A name that is neither a built-in GPU type nor one of the cluster's gpu_types is an
// InputError naming `file`, the field and the nearest known names.
Calibration resolve_calibration(const Calibration& calibration, const Cluster& cluster, const std::string& file);

}  // namespace hetflow::model
