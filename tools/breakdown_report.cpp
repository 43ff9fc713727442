#include "tools/breakdown_report.hpp"

#include <iomanip>
#include <ostream>

#include "model/units.hpp"

namespace hetflow::tools {

namespace u = model::units;

void print_breakdown(std::ostream& out, const traces::Breakdown& b) {
  const auto line = [&](const std::string& name, double s, int indent) {
    out << std::string(static_cast<size_t>(indent), ' ') << std::left << std::setw(28 - indent) << name << std::right
        << std::setw(10) << u::human_time_s(s) << std::setw(8) << std::fixed << std::setprecision(1)
        << (b.iteration_time_s > 0 ? 100 * s / b.iteration_time_s : 0) << " %\n";
    out.unsetf(std::ios::fixed);
  };
  out << "\niteration breakdown (per iteration, mean over " << b.devices << " computing devices; "
      << u::human_time_s(b.iteration_time_s) << " = compute + exposed communication + idle):\n";
  line("compute", b.compute_s, 2);
  for (const auto& [name, s] : b.compute_by_operation_s) line(name, s, 4);
  line("exposed communication", b.exposed_comm_s, 2);
  for (const auto& [name, s] : b.exposed_comm_by_purpose_s) line(name, s, 4);
  line("idle (bubble, waits)", b.idle_s, 2);
}

Json breakdown_json(const traces::Breakdown& b) {
  Json j = {{"devices", b.devices}, {"iteration_time_s", b.iteration_time_s}, {"compute_s", b.compute_s},
            {"exposed_comm_s", b.exposed_comm_s}, {"idle_s", b.idle_s}};
  j["compute_by_operation_s"] = Json::object();
  for (const auto& [name, s] : b.compute_by_operation_s) j["compute_by_operation_s"][name] = s;
  j["exposed_comm_by_purpose_s"] = Json::object();
  for (const auto& [name, s] : b.exposed_comm_by_purpose_s) j["exposed_comm_by_purpose_s"][name] = s;
  return j;
}

}  // namespace hetflow::tools
