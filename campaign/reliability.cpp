// The defaults of the reliability section, their sources, and its reader.
#include "campaign/reliability.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "model/error.hpp"
#include "model/units.hpp"
#include "model/yaml_util.hpp"

namespace hetflow::campaign {

namespace {

// --- Failure rates: Meta's Llama 3 405B pre-training (Llama Team, "The Llama 3 Herd of
// Models", arXiv:2407.21783, 2024, section 3.3.4 and Table 5). In a 54-day snapshot on
// 16,384 H100 GPUs (2,048 servers of 8 GPUs, section 3.3.1) the job was interrupted 466
// times, 47 planned and 419 unexpected. Table 5's root causes of the 419, by our classes:
//   gpu:      faulty GPU 148, GPU HBM3 memory 72, GPU SRAM memory 19, GPU system processor 17,
//             silent data corruption 6, GPU thermal interface + sensor 6            = 268
//   host:     host maintenance (unplanned) 32, SSD 3, power supply 3, server chassis 2,
//             IO expansion board 2, CPU 2, system memory 2                          =  46
//   nic:      NIC 7                                                                 =   7
//   switch:   network switch/cable 35                                               =  35
//   software: software bug 54, dependency 2, NCCL watchdog timeouts 7               =  63
// The 47 planned interruptions (maintenance, configuration, data set updates) are left out:
// a team schedules those. Per-unit MTBF = units x 54 days / count.
constexpr double kSnapshotS = 54.0 * 86400;
constexpr double kSnapshotGpus = 16384;
constexpr double kSnapshotNodes = 2048;
constexpr std::array<double, kComponents> kInterruptions{268, 46, 7, 35, 63};

// Detection: PyTorch's default timeout of an NCCL process group, 10 minutes
// (torch.distributed.init_process_group, `timeout`, default_pg_nccl_timeout): a collective a
// failed rank never joins is given up after it.
constexpr double kDetectionS = 600;
// Communicator set-up: ByteDance's MegaScale (Jiang et al., NSDI 2024, section 3.5) brought
// the initialisation of a job on more than 10,000 GPUs under 30 s: 3 ms per rank.
constexpr double kCommSetupSPerRank = 30.0 / 10000;
// Not measured anywhere we can cite; assumptions to replace with a scheduler's own figures:
// 2 minutes to reschedule and start the processes, 4 hours to take a failed node out, fix
// or replace it and return it, 1 minute for a hot spare to take its place.
constexpr double kRelaunchS = 120;
constexpr double kRepairS = 4 * 3600.0;
constexpr double kSpareSwapS = 60;
// Storage: Llama 3's Tectonic file system sustains 2 TB/s (section 3.3.1: 240 PB on 7,500
// servers, 2 TB/s sustained, 7 TB/s peak). Per node: a DGX H100 has two dual-port
// ConnectX-7 adapters for storage and in-band management, up to 400 Gb/s each (NVIDIA DGX
// H100 datasheet, 2023): 2 x 400 Gb/s = 100 GB/s.
constexpr double kStorageAggregateBytesPerS = 2e12;
constexpr double kStorageNodeBytesPerS = 100e9;
// GPU to host copies: PCIe 5.0 x16, 32 GT/s x 16 lanes with 128b/130b coding = 63 GB/s per
// direction (PCI-SIG, PCI Express Base Specification 5.0).
constexpr double kHostCopyBytesPerS = 32e9 * 16 / 8 * 128 / 130;

using model::yaml_util::MapReader;

double parse_bandwidth(std::string_view text) { return model::units::parse_bandwidth_bytes_per_s(text); }

}  // namespace

std::string_view to_string(Component c) {
  switch (c) {
    case Component::gpu: return "gpu";
    case Component::host: return "host";
    case Component::nic: return "nic";
    case Component::network_switch: return "switch";
    case Component::software: return "software";
  }
  return "?";
}

bool per_gpu(Component c) { return c == Component::gpu || c == Component::software; }
bool needs_repair(Component c) { return c != Component::software; }

Reliability default_reliability() {
  Reliability r;
  for (int i = 0; i < kComponents; ++i) {
    const double units = per_gpu(static_cast<Component>(i)) ? kSnapshotGpus : kSnapshotNodes;
    r.mtbf_s[static_cast<size_t>(i)] = units * kSnapshotS / kInterruptions[static_cast<size_t>(i)];
  }
  r.detection_s = kDetectionS;
  r.relaunch_s = kRelaunchS;
  r.comm_setup_s_per_rank = kCommSetupSPerRank;
  r.repair_s = kRepairS;
  r.spare_swap_s = kSpareSwapS;
  r.storage_node_bytes_per_s = kStorageNodeBytesPerS;
  r.storage_aggregate_bytes_per_s = kStorageAggregateBytesPerS;
  r.host_copy_bytes_per_s = kHostCopyBytesPerS;
  // Stragglers are off unless the file says how often and how slow: no fleet we can cite
  // gives a per-node, per-step figure.
  r.straggler_probability = 0;
  r.straggler_slowdown = 1;
  return r;
}

double parse_duration_s(std::string_view text) {
  std::string_view t = text;
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  for (const auto& [unit, factor] : {std::pair<std::string_view, double>{"h", 3600.0}, {"d", 86400.0}}) {
    if (t.size() > unit.size() && t.substr(t.size() - unit.size()) == unit) {
      std::string_view number = t.substr(0, t.size() - unit.size());
      while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
      double value = 0;
      try {
        value = model::units::parse_number(number);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument("expected a duration such as '90 s', '2.5 h' or '54 d', found '" +
                                    std::string(text) + "'");
      }
      if (!std::isfinite(value * factor)) throw std::invalid_argument("duration '" + std::string(text) + "' is too large");
      return value * factor;
    }
  }
  try {
    return model::units::parse_time_s(t);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("expected a duration such as '90 s', '2.5 h' or '54 d', found '" + std::string(text) +
                                "'");
  }
}

Reliability parse_reliability(const std::string& text, const std::string& file) {
  Reliability r = default_reliability();
  const YAML::Node root = model::yaml_util::load(text, file);
  if (!root.IsMap()) return r;  // the cluster reader says what is wrong with the file itself
  const YAML::Node section = root["reliability"];
  if (!section.IsDefined() || section.IsNull()) return r;
  const MapReader s(section, file, "reliability");
  if (s.has("mtbf")) {
    const MapReader m(s.get("mtbf"), file, "reliability.mtbf");
    for (int i = 0; i < kComponents; ++i) {
      double& mtbf = r.mtbf_s[static_cast<size_t>(i)];
      mtbf = m.quantity(std::string(to_string(static_cast<Component>(i))), parse_duration_s, mtbf);
    }
    m.finish();
  }
  r.detection_s = s.quantity("detection", parse_duration_s, r.detection_s, true);
  r.relaunch_s = s.quantity("relaunch", parse_duration_s, r.relaunch_s, true);
  r.comm_setup_s_per_rank = s.quantity("comm_setup_per_rank", parse_duration_s, r.comm_setup_s_per_rank, true);
  r.repair_s = s.quantity("repair", parse_duration_s, r.repair_s, true);
  r.spare_swap_s = s.quantity("spare_swap", parse_duration_s, r.spare_swap_s, true);
  r.storage_node_bytes_per_s = s.quantity("storage_per_node", parse_bandwidth, r.storage_node_bytes_per_s);
  r.storage_aggregate_bytes_per_s = s.quantity("storage_aggregate", parse_bandwidth, r.storage_aggregate_bytes_per_s);
  r.host_copy_bytes_per_s = s.quantity("host_copy", parse_bandwidth, r.host_copy_bytes_per_s);
  if (s.has("straggler")) {
    const MapReader g(s.get("straggler"), file, "reliability.straggler");
    r.straggler_probability = g.number_or("probability", 0, 0, 1);
    r.straggler_slowdown = g.number_or("slowdown", 1, 1, 1e6);
    g.finish();
  }
  s.finish();
  return r;
}

Reliability read_reliability_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, 0, "file", "cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_reliability(text.str(), path);
}

std::array<double, kComponents> failure_rates_per_s(const Reliability& r, int gpus, int nodes) {
  std::array<double, kComponents> rates{};
  for (int i = 0; i < kComponents; ++i) {
    const double units = per_gpu(static_cast<Component>(i)) ? gpus : nodes;
    const double mtbf = r.mtbf_s[static_cast<size_t>(i)];
    rates[static_cast<size_t>(i)] = mtbf > 0 && std::isfinite(mtbf) ? units / mtbf : 0;
  }
  return rates;
}

double job_failure_rate_per_s(const Reliability& r, int gpus, int nodes) {
  double total = 0;
  for (double rate : failure_rates_per_s(r, gpus, nodes)) total += rate;
  return total;
}

}  // namespace hetflow::campaign
