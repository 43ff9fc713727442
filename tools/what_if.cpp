#include "tools/what_if.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/plan_io.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

std::vector<std::string> list(const po::variables_map& vm, const char* name) {
  return vm.count(name) ? vm[name].as<std::vector<std::string>>() : std::vector<std::string>{};
}

// A factor in [low, high]; `range` says it in the message ("a slow-down factor between 1 and 1e6").
double factor_of(const std::string& text, const std::string& option, double low, double high, const std::string& range) {
  double f = 0;
  try {
    f = u::parse_number(text);
  } catch (const std::invalid_argument&) {
    f = 0;
  }
  if (!(f >= low && f <= high)) throw InputError("<command line>", 0, option, "expected " + range + ", found '" + text + "'");
  return f;
}

// "pcie:bandwidth=16GB/s,latency=5us" applied to every link of the class.
void change_links(model::Cluster& cluster, const std::string& text) {
  const std::string option = "--link";
  const size_t colon = text.find(':');
  if (colon == std::string::npos) throw InputError("<command line>", 0, option, "expected CLASS:bandwidth=B,latency=L, found '" + text + "'");
  const std::string kind = text.substr(0, colon);
  double bandwidth = -1, latency = -1;
  std::stringstream fields(text.substr(colon + 1));
  for (std::string field; std::getline(fields, field, ',');) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    try {
      if (key == "bandwidth") {
        bandwidth = u::parse_bandwidth_bytes_per_s(value);
        if (!(bandwidth > 0)) throw std::invalid_argument("expected a bandwidth > 0, found '" + value + "'");
      } else if (key == "latency") {
        latency = u::parse_time_s(value);
        if (!(latency >= 0 && latency <= 3600)) throw std::invalid_argument("expected a latency in [0, 1 h], found '" + value + "'");
      } else {
        throw std::invalid_argument("expected bandwidth=B or latency=L, found '" + field + "'");
      }
    } catch (const std::invalid_argument& e) {
      throw InputError("<command line>", 0, option, e.what());
    }
  }
  if (bandwidth < 0 && latency < 0) throw InputError("<command line>", 0, option, "'" + text + "' changes nothing");
  int changed = 0;
  auto set = [&](double& b, double& l) {
    if (bandwidth > 0) b = bandwidth;
    if (latency >= 0) l = latency;
    ++changed;
  };
  if (kind == "nic") {
    for (model::Node& n : cluster.nodes) set(n.nic.bandwidth_bytes_per_s, n.nic.latency_s);
  } else if (kind == "wan") {
    for (model::WanLink& w : cluster.wan) set(w.bandwidth_bytes_per_s, w.latency_s);
  } else if (kind == "fabric") {
    if (bandwidth > 0) throw InputError("<command line>", 0, option, "a fabric's bandwidth is its NICs' (--link nic:...); give its latency");
    for (model::Region& r : cluster.regions) {
      double unused = 0;
      set(unused, r.fabric.latency_s);
    }
  } else {
    model::LinkKind k{};
    try {
      k = model::parse_link_kind(kind);
    } catch (const std::invalid_argument&) {
      throw InputError("<command line>", 0, option, "expected a link class (pcie, nvlink, nvswitch, nic, wan, fabric), found '" + kind + "'");
    }
    for (model::Node& n : cluster.nodes) {
      if (n.intra.kind == k) set(n.intra.bandwidth_bytes_per_s, n.intra.latency_s);
    }
  }
  if (changed == 0) throw InputError("<command line>", 0, option, "the cluster '" + cluster.name + "' has no " + kind + " link");
}

// The change from `from` to `to`, as a signed percentage; "-" from nothing to something.
// A change of more than a hundredfold reads as a factor ("x3.7e+05"), not as a percentage
// of ten digits.
std::string percent(double from, double to) {
  const double change = relative_error(to, from);
  if (std::isfinite(change) && std::fabs(change) >= 100) {
    char text[32];
    std::snprintf(text, sizeof text, "x%.3g", to / from);
    return text;
  }
  return signed_percent(change);
}

const traces::DeviceMetrics* slowest(const traces::Metrics& m) {
  const traces::DeviceMetrics* out = nullptr;
  for (const traces::DeviceMetrics& d : m.devices) {
    if (out == nullptr || d.busy_s > out->busy_s) out = &d;
  }
  return out;
}

}  // namespace

int device_by_name(const partition::Plan& plan, const std::string& text, const std::string& option) {
  for (size_t d = 0; d < plan.device_names.size(); ++d) {
    if (plan.device_names[d] == text || std::to_string(d) == text) return static_cast<int>(d);
  }
  throw InputError("<command line>", 0, option,
                   "expected a device name (e.g. " + plan.device_names.front() + ") or id, found '" + text + "'");
}

std::pair<std::string, double> split_at(const std::string& text, const std::string& option) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos) throw InputError("<command line>", 0, option, "expected WHAT@TIME, found '" + text + "'");
  try {
    // A moment in the run: a plain number is seconds, as --straggler's help says.
    const std::string when = text.substr(at + 1);
    double time_s = 0;
    try {
      time_s = u::parse_number(when);
    } catch (const std::invalid_argument&) {
      time_s = u::parse_time_s(when);
    }
    if (!(time_s >= 0)) throw std::invalid_argument("expected a time >= 0, found '" + text.substr(at + 1) + "'");
    return {text.substr(0, at), time_s};
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, option, e.what());
  }
}

void add_what_if_options(po::options_description& options) {
  options.add_options()
      ("scale-gpu", po::value<std::vector<std::string>>()->composing(),
       "TYPE|DEVICE:FACTOR: those GPUs compute FACTOR times as fast (what-if, repeatable)")
      ("link", po::value<std::vector<std::string>>()->composing(),
       "CLASS:bandwidth=B,latency=L: every pcie|nvlink|nvswitch|nic|wan|fabric link so (what-if, repeatable)")
      ("straggler", po::value<std::vector<std::string>>()->composing(),
       "DEVICE:FACTOR@TIME: from TIME on, DEVICE computes FACTOR times slower (repeatable)");
}

WhatIf read_what_if(const po::variables_map& vm, partition::Plan& plan) {
  WhatIf w;
  for (const std::string& s : list(vm, "scale-gpu")) {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) throw InputError("<command line>", 0, "--scale-gpu", "expected TYPE:FACTOR or DEVICE:FACTOR, found '" + s + "'");
    const std::string what = s.substr(0, colon);
    const double factor = factor_of(s.substr(colon + 1), "--scale-gpu", 1e-6, 1e6, "a factor between 1e-6 and 1e6");
    int matched = 0;
    const std::vector<model::Device> devices = plan.cluster.devices();
    for (const model::Device& d : devices) {
      const std::string& type = plan.cluster.nodes[static_cast<size_t>(d.node)].gpu;
      const bool same_type = type.size() == what.size() &&
                             std::equal(type.begin(), type.end(), what.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); });
      if (same_type || d.name == what || std::to_string(d.id) == what) {
        w.slowdowns.push_back({d.id, 1 / factor, 0});
        ++matched;
      }
    }
    if (matched == 0) {
      throw InputError("<command line>", 0, "--scale-gpu", "no GPU type or device '" + what + "' in the cluster '" + plan.cluster.name + "'");
    }
    w.changes.push_back("--scale-gpu " + s);
  }
  for (const std::string& s : list(vm, "straggler")) {
    const auto [what, at] = split_at(s, "--straggler");
    const size_t colon = what.rfind(':');
    if (colon == std::string::npos) throw InputError("<command line>", 0, "--straggler", "expected DEVICE:FACTOR@TIME");
    const double factor = factor_of(what.substr(colon + 1), "--straggler", 1, 1e6, "a slow-down factor between 1 and 1e6");
    w.slowdowns.push_back({device_by_name(plan, what.substr(0, colon), "--straggler"), factor, at});
    w.changes.push_back("--straggler " + s);
  }
  for (const std::string& s : list(vm, "link")) {
    change_links(plan.cluster, s);
    w.changes.push_back("--link " + s);
    w.changes_cluster = true;
  }
  if (w.changes_cluster) plan.fingerprint = partition::plan_fingerprint(plan);
  return w;
}

void print_what_if(std::ostream& out, const WhatIf& w, const traces::Metrics& baseline, const traces::Metrics& changed) {
  out << "\nwhat if";
  for (const std::string& c : w.changes) out << " " << c;
  out << ":\n";
  // Columns are as wide as their widest entry and two spaces apart, so a figure wider than
  // usual (an iteration of months, a change of a million per cent) never runs into the next.
  std::vector<std::array<std::string, 4>> rows = {{"", "baseline", "what-if", "change"}};
  auto row = [&](const std::string& what, const std::string& a, const std::string& b, const std::string& change) {
    rows.push_back({what, a, b, change});
  };
  row("iteration time", u::human_time_s(baseline.iteration_time_s), u::human_time_s(changed.iteration_time_s),
      percent(baseline.iteration_time_s, changed.iteration_time_s));
  std::ostringstream b1, b2;
  b1 << std::fixed << std::setprecision(3) << baseline.bubble_fraction;
  b2 << std::fixed << std::setprecision(3) << changed.bubble_fraction;
  row("bubble fraction", b1.str(), b2.str(), percent(baseline.bubble_fraction, changed.bubble_fraction));
  row("exposed comm", u::human_time_s(baseline.exposed_comm_s), u::human_time_s(changed.exposed_comm_s),
      percent(baseline.exposed_comm_s, changed.exposed_comm_s));
  const traces::DeviceMetrics *a = slowest(baseline), *b = slowest(changed);
  if (a != nullptr && b != nullptr) {
    row("slowest device", u::human_time_s(a->busy_s), u::human_time_s(b->busy_s), percent(a->busy_s, b->busy_s));
  }
  std::array<size_t, 4> width{18, 10, 10, 8};
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    out << "  " << std::left << std::setw(static_cast<int>(width[0])) << r[0] << std::right;
    for (size_t i = 1; i < r.size(); ++i) out << "  " << std::setw(static_cast<int>(width[i])) << r[i];
    out << "\n";
  }
  if (a != nullptr && b != nullptr) {
    out << "  (slowest device: the most compute per iteration; baseline " << a->name << ", what-if " << b->name << ")\n";
  }
}

Json what_if_json(const WhatIf& w, const traces::Metrics& baseline, const traces::Metrics& changed) {
  auto figures = [](const traces::Metrics& m) {
    const traces::DeviceMetrics* s = slowest(m);
    return Json{{"iteration_time_s", m.iteration_time_s},
                {"bubble_fraction", m.bubble_fraction},
                {"exposed_comm_s", m.exposed_comm_s},
                {"slowest_device", s != nullptr ? s->name : ""},
                {"slowest_device_busy_s", s != nullptr ? s->busy_s : 0.0}};
  };
  return Json{{"changes", w.changes}, {"baseline", figures(baseline)}, {"what_if", figures(changed)}};
}

}  // namespace hetflow::tools
