// tools/simulate_report.hpp: a simulation's figures of merit as text and JSON.
#include "tools/simulate_report.hpp"

#include <iomanip>

#include "model/units.hpp"
#include "partition/loading.hpp"
#include "tools/breakdown_report.hpp"
#include "tools/plan_summary.hpp"
#include "traces/breakdown.hpp"

namespace hetflow::tools {

namespace u = model::units;

Json simulate_json(const sim::SimResult& result, const traces::Metrics& m, const partition::Estimate& analytic,
                   const partition::Plan& plan) {
  Json j;
  j["completed"] = result.completed;
  j["stalls"] = result.stalls;
  j["fingerprint"] = plan.fingerprint;
  j["iterations"] = m.iterations;
  j["iteration_time_s"] = m.iteration_time_s;
  j["analytic_iteration_time_s"] = analytic.iteration_time_s;
  j["throughput_samples_per_s"] = m.samples_per_s;
  j["throughput_tokens_per_s"] = m.tokens_per_s;
  j["mfu"] = m.mfu;
  if (!m.over_peak.empty()) j["mfu_overstated"] = traces::over_peak_cause(m);
  j["bubble_fraction"] = m.bubble_fraction;
  j["exposed_comm_s"] = m.exposed_comm_s;
  j["bytes_per_link_class"] = m.bytes_per_link_class;
  j["simulated_s"] = result.simulated_s;
  j["wall_s"] = result.wall_s;
  j["activities"] = result.activities;
  Json devices = Json::array();
  for (const traces::DeviceMetrics& d : m.devices) {
    devices.push_back({{"name", d.name},
                       {"busy_s", d.busy_s},
                       {"utilization", d.utilization},
                       {"exposed_comm_s", d.exposed_comm_s},
                       {"idle_s", d.idle_s},
                       {"peak_memory_bytes", d.peak_memory_bytes}});
  }
  // The loader against the GPUs' analytic rate: the simulated throughput is the smaller; and
  // how long the devices waited for their loads.
  if (Json loader = input_bound_json(plan, analytic.compute_throughput_samples_per_s); !loader.is_null()) {
    loader["input_wait_s"] = m.input_wait_s;
    for (size_t d = 0; d < m.devices.size(); ++d) devices[d]["input_wait_s"] = m.devices[d].input_wait_s;
    j["loader"] = std::move(loader);
  }
  j["devices"] = std::move(devices);
  return j;
}

void print_simulation(std::ostream& out, const sim::SimResult& result, const traces::Metrics& m,
                      const partition::Estimate& analytic, const partition::Plan& plan) {
  print_layout(out, plan);  // what ran: a layout the user brought, or the policy's
  out << "\nsimulated " << plan.network.name << " on " << plan.cluster.name << ": " << m.iterations << " iteration"
      << (m.iterations == 1 ? "" : "s") << (m.iterations > 1 ? " (the first excluded from steady-state figures)" : "")
      << ", " << result.activities << " activities in " << u::human_time_s(result.wall_s) << " of host time\n";
  out << std::fixed << std::setprecision(3);
  out << "  iteration time     " << u::human_time_s(m.iteration_time_s) << "   (analytic critical path "
      << u::human_time_s(analytic.iteration_time_s) << ")\n";
  // A workload read from Chakra traces has no virtual workers: no samples, no bubbles.
  const bool has_workers = !plan.layout.workers.empty();
  out << "  throughput         ";
  if (has_workers) {
    out << std::setprecision(2) << m.samples_per_s << " samples/s";
    if (plan.network.tokens_per_sample > 1) out << ", " << std::setprecision(0) << m.tokens_per_s << " tokens/s";
  } else {
    out << "- (no samples: the workload has no virtual workers)";
  }
  out << "\n";
  if (has_workers) print_input_bound(out, plan, analytic.compute_throughput_samples_per_s);
  out << std::fixed << std::setprecision(1);
  out << "  MFU                " << 100 * m.mfu << " % of the cluster's peak\n" << std::setprecision(3);
  if (const std::string cause = traces::over_peak_cause(m); !cause.empty()) out << "    (" << cause << ")\n";
  out << "  bubble fraction    ";
  if (has_workers) {
    out << m.bubble_fraction << " (of each stage's pipeline span, time without a pass of its own"
        << (partition::loader_bound(plan).bounded ? " or a wait for input" : "") << ")\n";
  } else {
    out << "- (no pipeline schedule)\n";
  }
  out << "  exposed comm       " << u::human_time_s(m.exposed_comm_s)
      << " per iteration (moving data, computing nothing; mean over computing devices)\n";
  if (partition::loader_bound(plan).bounded) {
    out << "  input wait         " << u::human_time_s(m.input_wait_s)
        << " per iteration (idle, the next forward waiting for its load; mean over computing devices)\n";
  }
  out << "  traffic/iteration ";
  const char* separator = " ";
  for (const auto& [cls, bytes] : m.bytes_per_link_class) {
    out << separator << cls << " " << u::human_bytes(bytes);
    separator = "; ";
  }
  out << "\n\n  " << std::left << std::setw(22) << "device" << std::right << std::setw(12) << "utilization"
      << std::setw(12) << "compute" << std::setw(14) << "exposed comm" << std::setw(14) << "peak memory" << "\n";
  size_t shown = 0;
  for (const traces::DeviceMetrics& d : m.devices) {
    if (d.busy_s == 0 || ++shown > 32) continue;
    out << "  " << std::left << std::setw(22) << d.name << std::right << std::setw(11) << std::setprecision(1)
        << 100 * d.utilization << "%" << std::setw(12) << u::human_time_s(d.busy_s) << std::setw(14)
        << u::human_time_s(d.exposed_comm_s) << std::setw(14) << u::human_bytes(d.peak_memory_bytes) << "\n";
  }
  if (shown > 32) out << "  ... and " << shown - 32 << " more devices (--json lists all)\n";
}

}  // namespace hetflow::tools
