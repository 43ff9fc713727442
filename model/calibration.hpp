#pragma once
// Measured (or default) efficiencies that turn peak specs into expected times. The defaults
// are documented here and replaceable by a calibration file, which traces/ fits from
// measured runs.
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::model {

// Compute time of a task of F FLOPs on a device of peak P at the plan's precision:
//   time_s = overhead_s + F / (P * efficiency(F))
//   efficiency(F) = max_efficiency * (1 - exp(-F / saturation_flops))   (saturation_flops > 0)
//                 = max_efficiency                                       (saturation_flops = 0)
// A small task cannot fill the device (few thread blocks, short loops, cold caches), so its
// efficiency rises with its work and saturates at max_efficiency; saturation_flops is the
// work at which it reaches 63 % of that. As F -> 0 the time tends to overhead_s +
// saturation_flops / (P * max_efficiency): a tiny task still costs about filling the device
// once. overhead_s is what every task pays besides (launches, synchronisation, dispatch).
struct Efficiency {
  double max_efficiency = 0.6;  // large dense matmuls reach ~60 % of the data-sheet peak
  double saturation_flops = 0;  // flat by default
  double overhead_s = 20e-6;    // per task: tens of kernels of a few microseconds each
  double efficiency(double flops) const;
  double math_s(double flops, double peak_flops_per_s) const;  // F / (P efficiency(F)); 0 for F <= 0
  double time_s(double flops, double peak_flops_per_s) const;  // overhead_s + math_s; 0 for F <= 0
  bool operator==(const Efficiency&) const = default;
};

// One class of operation of a layer (partition/layer_ops.hpp) on a GPU type: `gemm` and
// `attention` (flash attention's fused kernel) run at the precision's peak, `memory` (norms,
// softmax, activations, residual adds...) at the memory bandwidth. Each reaches
// max_efficiency of that rate as its work W (FLOPs, or bytes) grows past `saturation`, and
// pays `launch_s` once:
//   time_s = launch_s + W / (rate * max_efficiency * (1 - exp(-W / saturation)))
//
// GEMMs (`gemm`) may also pay tile and wave quantization (NVIDIA's Matrix Multiplication Background
// guide): an m x n output runs as ceil(m / tile_m) x ceil(n / tile_n) tiles (per batch),
// `sms` at a time, so padded tiles and a last, partial wave leave part of the device idle;
// the rate is then multiplied by utilization(m, n, batch). A GEMM of one wave or less pays
// nothing: the library splits k or takes smaller tiles to fill the device (cuBLAS's split-K),
// and the `saturation` curve prices small work. sms = 0: not modelled (utilization 1).
struct OpEfficiency {
  double max_efficiency = 0.6;
  double saturation = 0;  // FLOPs (gemm, attention) or bytes (memory); 0: flat
  double launch_s = 0;
  int sms = 0, tile_m = 0, tile_n = 0;
  double time_s(double work, double rate) const;  // 0 for no work
  // useful outputs / the tiles' outputs x tiles / (waves x sms), in the better of the two
  // orientations (a library may compute the transposed product); 1 without waves or with
  // one wave of tiles or less.
  double utilization(double m, double n, double batch = 1) const;
  bool operator==(const OpEfficiency&) const = default;
};

// A GPU type's efficiency, and where measured, one per task kind (forward, backward,
// backward_weight, optimizer): a backward pass is not as efficient as its forward on every
// device, and an optimizer step is memory-bound.
struct GpuEfficiency : Efficiency {
  std::map<std::string, Efficiency> kinds;
  // Operation costs ("gemm", "attention", "memory"): when present, a decoder's compute task
  // takes the sum of its layers' operations instead of its FLOPs at one efficiency (the
  // task's kind still adds its overhead). A missing class: attention as gemm, gemm as this
  // type's curve, memory at 0.8 of the bandwidth.
  std::map<std::string, OpEfficiency> ops;
  OpEfficiency op(const std::string& op_class) const;
  // From a task being ready (its stream's previous task and its inputs done) to its start:
  // the executor's hand-off (a thread waking, a launch queued), paid by every compute task
  // on top of its time. 0 for the simulator's own traces.
  double dispatch_s = 0;
  const Efficiency& of(const std::string& kind) const;  // the kind's, else this
  bool operator==(const GpuEfficiency&) const = default;
};

// A link class's measured behaviour relative to its nominal figures: every link of the class
// (a node's GPU links of that kind and, for pcie, its PCIe uplinks; NICs; WAN links) has
// latency_s * latency_factor and bandwidth * bandwidth_factor, in the cost model and in the
// simulator alike (apply_link_calibration).
struct LinkCalibration {
  double bandwidth_factor = 1.0;
  double latency_factor = 1.0;
  bool operator==(const LinkCalibration&) const = default;
};

struct Calibration {
  GpuEfficiency default_gpu;
  std::map<std::string, GpuEfficiency> gpus;     // by GPU type name
  std::map<std::string, LinkCalibration> links;  // by link class: pcie, nvlink, nvswitch, nic, wan
  // Where each `gpus` entry was in the file it was read from, for resolve_calibration's
  // messages; not part of the value (== ignores it).
  std::map<std::string, int> gpu_lines;

  const GpuEfficiency& gpu(const std::string& type) const;
  LinkCalibration link(const std::string& link_class) const;
  bool operator==(const Calibration& o) const {
    return default_gpu == o.default_gpu && gpus == o.gpus && links == o.links;
  }
};

// YAML (JSON accepted):
//   default_gpu: {max_efficiency: 0.6, overhead: 20 us}
//   gpus:
//     V100-16: {max_efficiency: 0.55, saturation_flops: 2e9, overhead: 30 us,
//               dispatch: 5 us, kinds: {backward: {max_efficiency: 0.5, saturation_flops: 3e9, overhead: 40 us}}}
//   links: {nic: {bandwidth_factor: 0.8, latency_factor: 1.5}}
//   A100-80: {ops: {gemm: {max_efficiency: 0.8, saturation: 5e10, launch: 4 us,
//                          waves: {sms: 108, tile_m: 256, tile_n: 128}}, memory: {max_efficiency: 0.85}}}
// A kind's missing fields are its GPU type's.
Calibration parse_calibration(const std::string& text, const std::string& file);
std::string write_calibration(const Calibration& calibration);
// A calibration file, or `published:NAME`: one of published_calibrations().
Calibration load_calibration(const std::string& path);

// Calibrations from public measurements (model/calibrations/NAME.yaml, compiled in), every
// number citing its source in the file: a100 (DGX A100), h100 (DGX H100), v100 (DGX-1).
struct PublishedCalibration {
  std::string_view name;
  std::string_view yaml;  // its first line: "# Published calibration: WHAT"
  std::string_view description() const;  // WHAT
};
const std::vector<PublishedCalibration>& published_calibrations();

struct Cluster;
// The cluster with every link scaled by its class's factors.
Cluster apply_link_calibration(const Cluster& cluster, const Calibration& calibration);

// The calibration as a cost model for `cluster` reads it: every GPU type it names spelt as
// the cluster and the catalog spell it (names are case-insensitive, as in cluster files).
// A name that is neither a built-in GPU type nor one of the cluster's gpu_types is an
// InputError naming `file`, the field and the nearest known names.
Calibration resolve_calibration(const Calibration& calibration, const Cluster& cluster, const std::string& file);

}  // namespace hetflow::model
