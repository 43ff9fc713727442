#include "model/calibration.hpp"

#include <cctype>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "model/cluster.hpp"
#include "model/error.hpp"
#include "model/gpu.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/yaml_util.hpp"

namespace hetflow::model {

using yaml_util::MapReader;

double Efficiency::efficiency(double flops) const {
  if (saturation_flops <= 0) return max_efficiency;
  // -expm1(-x) = 1 - exp(-x) without cancellation for small x.
  return max_efficiency * -std::expm1(-flops / saturation_flops);
}

double Efficiency::math_s(double flops, double peak_flops_per_s) const {
  return flops <= 0 ? 0 : flops / (peak_flops_per_s * efficiency(flops));
}

double Efficiency::time_s(double flops, double peak_flops_per_s) const {
  return flops <= 0 ? 0 : overhead_s + math_s(flops, peak_flops_per_s);
}

double OpEfficiency::time_s(double work, double rate) const {
  if (work <= 0) return 0;
  const double e = saturation > 0 ? max_efficiency * -std::expm1(-work / saturation) : max_efficiency;
  return launch_s + work / (rate * e);
}

double OpEfficiency::utilization(double m, double n, double batch) const {
  if (sms <= 0 || tile_m <= 0 || tile_n <= 0 || !(m >= 1) || !(n >= 1) || !(batch >= 1)) return 1;
  const auto oriented = [&](double rows, double cols) {
    const double down = std::ceil(rows / tile_m), across = std::ceil(cols / tile_n);
    const double tiles = down * across * batch;
    if (tiles <= sms) return 1.0;  // one wave or less: split k or smaller tiles fill the device
    const double waves = std::ceil(tiles / sms);
    return rows * cols / (down * tile_m * across * tile_n) * tiles / (waves * sms);
  };
  return std::max(oriented(m, n), oriented(n, m));
}

OpEfficiency GpuEfficiency::op(const std::string& op_class) const {
  if (const auto it = ops.find(op_class); it != ops.end()) return it->second;
  if (op_class == "attention") {  // gemm's curve; flash attention is not tiled as a GEMM here
    OpEfficiency e = op("gemm");
    e.sms = e.tile_m = e.tile_n = 0;
    return e;
  }
  if (op_class == "memory") return OpEfficiency{0.8, 0, 0};
  return OpEfficiency{max_efficiency, saturation_flops, 0};
}

const Efficiency& GpuEfficiency::of(const std::string& kind) const {
  const auto it = kinds.find(kind);
  return it == kinds.end() ? *this : it->second;
}

const GpuEfficiency& Calibration::gpu(const std::string& type) const {
  const auto it = gpus.find(type);
  return it == gpus.end() ? default_gpu : it->second;
}

LinkCalibration Calibration::link(const std::string& link_class) const {
  const auto it = links.find(link_class);
  return it == links.end() ? LinkCalibration{} : it->second;
}

namespace {
bool lower_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// One efficiency's fields over `base` (a kind's missing fields are its GPU type's).
Efficiency parse_efficiency(MapReader& r, Efficiency e) {
  e.max_efficiency = r.number_or("max_efficiency", e.max_efficiency, 1e-6);
  if (e.max_efficiency > 1) r.fail("max_efficiency", "expected a fraction in (0, 1]");
  e.saturation_flops = r.number_or("saturation_flops", e.saturation_flops, 0.0, 1e30);
  // A task's fixed cost: beyond an hour it is a typo, and it must stay finite for SimGrid.
  e.overhead_s = r.quantity_in("overhead", units::parse_time_s,
                               {limits::kMinLatency, limits::kMaxOverhead, units::format_time_s}, e.overhead_s, true);
  return e;
}

GpuEfficiency parse_gpu(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  GpuEfficiency g;
  static_cast<Efficiency&>(g) = parse_efficiency(r, g);
  g.dispatch_s = r.quantity_in("dispatch", units::parse_time_s,
                               {limits::kMinLatency, limits::kMaxOverhead, units::format_time_s}, g.dispatch_s, true);
  if (r.has("kinds")) {
    const YAML::Node kinds = r.get("kinds");
    if (!kinds.IsMap()) r.fail("kinds", "expected a mapping from task kind to efficiency");
    for (const auto& kv : kinds) {
      const std::string kind = yaml_util::key_text(kv.first, file, path + ".kinds");
      if (kind != "forward" && kind != "backward" && kind != "backward_weight" && kind != "optimizer") {
        throw InputError(file, yaml_util::line_of(kv.first), path + ".kinds." + kind,
                         "expected a compute task kind: forward, backward, backward_weight or optimizer");
      }
      MapReader kr(kv.second, file, path + ".kinds." + kind);
      g.kinds[kind] = parse_efficiency(kr, g);
      kr.finish();
    }
  }
  if (r.has("ops")) {
    const YAML::Node ops = r.get("ops");
    if (!ops.IsMap()) r.fail("ops", "expected a mapping from operation class to efficiency");
    for (const auto& kv : ops) {
      const std::string op = yaml_util::key_text(kv.first, file, path + ".ops");
      if (op != "gemm" && op != "attention" && op != "memory") {
        throw InputError(file, yaml_util::line_of(kv.first), path + ".ops." + op,
                         "expected an operation class: gemm, attention or memory");
      }
      MapReader orr(kv.second, file, path + ".ops." + op);
      OpEfficiency e = g.op(op);
      e.max_efficiency = orr.number_or("max_efficiency", e.max_efficiency, 1e-6);
      if (e.max_efficiency > 1) orr.fail("max_efficiency", "expected a fraction in (0, 1]");
      e.saturation = orr.number_or("saturation", e.saturation, 0.0, 1e30);
      e.launch_s = orr.quantity_in("launch", units::parse_time_s,
                                   {limits::kMinLatency, limits::kMaxOverhead, units::format_time_s}, e.launch_s, true);
      if (orr.has("waves")) {
        if (op != "gemm") {
          orr.fail("waves", "tile and wave quantization applies to gemm (flash attention's fused kernel and memory-bound "
                            "operations are not tiled GEMMs here)");
        }
        MapReader wr(orr.get("waves"), file, path + ".ops." + op + ".waves");
        e.sms = wr.positive_int("sms", 100000);
        e.tile_m = wr.positive_int("tile_m", 100000);
        e.tile_n = wr.positive_int("tile_n", 100000);
        wr.finish();
      }
      orr.finish();
      g.ops[op] = e;
    }
  }
  r.finish();
  return g;
}
}  // namespace

Calibration parse_calibration(const std::string& text, const std::string& file) {
  const YAML::Node root = yaml_util::load(text, file);
  MapReader r(root, file, "");
  Calibration c;
  if (r.has("default_gpu")) c.default_gpu = parse_gpu(r.get("default_gpu"), file, "default_gpu");
  if (r.has("gpus")) {
    const YAML::Node gpus = r.get("gpus");
    if (!gpus.IsMap()) r.fail("gpus", "expected a mapping from GPU type to efficiency");
    for (const auto& kv : gpus) {
      std::string name = yaml_util::key_text(kv.first, file, "gpus");
      // The built-in catalog's spelling, as clusters use it (their GPU types are
      // case-insensitive); other names must be GPU types of the cluster (resolve_calibration).
      if (const GpuSpec* g = find_builtin_gpu(name)) name = g->name;
      if (c.gpus.count(name) != 0) {
        throw InputError(file, yaml_util::line_of(kv.first), "gpus." + name, "given twice (GPU types are case-insensitive)");
      }
      c.gpus[name] = parse_gpu(kv.second, file, "gpus." + name);
      c.gpu_lines[name] = yaml_util::line_of(kv.first);
    }
  }
  if (r.has("links")) {
    const YAML::Node links = r.get("links");
    if (!links.IsMap()) r.fail("links", "expected a mapping from link class to factors");
    for (const auto& kv : links) {
      const std::string name = yaml_util::key_text(kv.first, file, "links");
      if (name != "pcie" && name != "nvlink" && name != "nvswitch" && name != "nic" && name != "wan") {
        throw InputError(file, yaml_util::line_of(kv.first), "links." + name,
                         "expected a link class: pcie, nvlink, nvswitch, nic or wan");
      }
      MapReader lr(kv.second, file, "links." + name);
      LinkCalibration l;
      l.bandwidth_factor = lr.number_or("bandwidth_factor", 1.0, limits::kMinLinkFactor, limits::kMaxLinkFactor);
      l.latency_factor = lr.number_or("latency_factor", 1.0, 0.0, limits::kMaxLinkFactor);
      lr.finish();
      c.links[name] = l;
    }
  }
  r.finish();
  return c;
}

std::string write_calibration(const Calibration& c) {
  YAML::Emitter out;
  // A kind's missing fields are its type's: a kind writes every field.
  auto efficiency = [&out](const Efficiency& e, bool every_field) {
    out << YAML::Key << "max_efficiency" << YAML::Value << units::format_number(e.max_efficiency);
    if (e.saturation_flops > 0 || every_field) {
      out << YAML::Key << "saturation_flops" << YAML::Value << units::format_number(e.saturation_flops);
    }
    out << YAML::Key << "overhead" << YAML::Value << units::format_time_s(e.overhead_s);
  };
  auto gpu = [&](const GpuEfficiency& g) {
    out << YAML::Flow << YAML::BeginMap;
    efficiency(g, false);
    if (g.dispatch_s > 0) out << YAML::Key << "dispatch" << YAML::Value << units::format_time_s(g.dispatch_s);
    if (!g.kinds.empty()) {
      out << YAML::Key << "kinds" << YAML::Value << YAML::BeginMap;
      for (const auto& [kind, e] : g.kinds) {
        out << YAML::Key << kind << YAML::Value << YAML::BeginMap;
        efficiency(e, true);
        out << YAML::EndMap;
      }
      out << YAML::EndMap;
    }
    if (!g.ops.empty()) {
      out << YAML::Key << "ops" << YAML::Value << YAML::BeginMap;
      for (const auto& [op, e] : g.ops) {
        out << YAML::Key << op << YAML::Value << YAML::BeginMap << YAML::Key << "max_efficiency" << YAML::Value
            << units::format_number(e.max_efficiency) << YAML::Key << "saturation" << YAML::Value
            << units::format_number(e.saturation) << YAML::Key << "launch" << YAML::Value << units::format_time_s(e.launch_s);
        if (e.sms > 0 && e.tile_m > 0 && e.tile_n > 0) {
          out << YAML::Key << "waves" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "sms" << YAML::Value
              << e.sms << YAML::Key << "tile_m" << YAML::Value << e.tile_m << YAML::Key << "tile_n" << YAML::Value << e.tile_n
              << YAML::EndMap;
        }
        out << YAML::EndMap;
      }
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  };
  out << YAML::BeginMap << YAML::Key << "default_gpu" << YAML::Value;
  gpu(c.default_gpu);
  out << YAML::Key << "gpus" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, g] : c.gpus) {
    out << YAML::Key << name << YAML::Value;
    gpu(g);
  }
  out << YAML::EndMap << YAML::Key << "links" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, l] : c.links) {
    out << YAML::Key << name << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "bandwidth_factor"
        << YAML::Value << units::format_number(l.bandwidth_factor) << YAML::Key << "latency_factor" << YAML::Value
        << units::format_number(l.latency_factor) << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {
int line_in(const Calibration& calibration, const std::string& gpu) {
  const auto at = calibration.gpu_lines.find(gpu);
  return at == calibration.gpu_lines.end() ? 0 : at->second;
}
}  // namespace

Calibration resolve_calibration(const Calibration& calibration, const Cluster& cluster, const std::string& file) {
  Calibration out = calibration;
  out.gpus.clear();
  std::vector<std::string> known;
  for (const GpuSpec& g : cluster.gpu_types) known.push_back(g.name);
  for (const GpuSpec& g : builtin_gpus()) known.push_back(g.name);
  for (const auto& [name, efficiency] : calibration.gpus) {
    std::string canonical;
    for (const std::string& k : known) {
      if (k == name) canonical = k;
    }
    if (canonical.empty()) {
      for (const std::string& k : known) {
        if (canonical.empty() && find_builtin_gpu(k) == nullptr && lower_equal(k, name)) canonical = k;
      }
    }
    if (canonical.empty()) {
      std::string hint;
      for (const std::string& n : nearest_names(name, known)) hint += (hint.empty() ? "" : ", ") + n;
      throw InputError(file, line_in(calibration, name), "gpus." + name,
                       "unknown GPU type '" + name + "' (neither built in nor defined by cluster " + cluster.name +
                           "); nearest known: " + hint);
    }
    if (out.gpus.count(canonical) != 0) {
      throw InputError(file, line_in(calibration, name), "gpus." + name,
                       "GPU type " + canonical + " is given twice (names are case-insensitive)");
    }
    out.gpus[canonical] = efficiency;
  }
  return out;
}

std::string_view PublishedCalibration::description() const {
  constexpr std::string_view kHead = "# Published calibration: ";
  std::string_view first = yaml.substr(0, yaml.find('\n'));
  return first.starts_with(kHead) ? first.substr(kHead.size()) : first;
}

Calibration load_calibration(const std::string& path) {
  constexpr std::string_view kPublished = "published:";
  if (path.starts_with(kPublished)) {
    const std::string_view name = std::string_view(path).substr(kPublished.size());
    std::string known;
    for (const PublishedCalibration& p : published_calibrations()) {
      if (p.name == name) return parse_calibration(std::string(p.yaml), "model/calibrations/" + std::string(name) + ".yaml");
      known += (known.empty() ? "" : ", ") + std::string(p.name);
    }
    throw InputError(path, 0, "calibration", "no published calibration '" + std::string(name) + "' (published: " + known + ")");
  }
  std::ifstream in(path);
  if (!in) throw InputError(path, 0, "file", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_calibration(text.str(), path);
}


Cluster apply_link_calibration(const Cluster& cluster, const Calibration& calibration) {
  Cluster out = cluster;
  auto scale = [&](const std::string& link_class, double& bandwidth, double& latency) {
    const LinkCalibration c = calibration.link(link_class);
    bandwidth *= c.bandwidth_factor;
    latency *= c.latency_factor;
  };
  for (Node& n : out.nodes) {
    scale(std::string(to_string(n.intra.kind)), n.intra.bandwidth_bytes_per_s, n.intra.latency_s);
    double no_latency = 0;
    scale("pcie", n.intra.uplink_bandwidth_bytes_per_s, no_latency);
    scale("nic", n.nic.bandwidth_bytes_per_s, n.nic.latency_s);
  }
  for (WanLink& w : out.wan) scale("wan", w.bandwidth_bytes_per_s, w.latency_s);
  return out;
}

}  // namespace hetflow::model
