#include "model/cluster.hpp"

#include <algorithm>

#include "model/error.hpp"

namespace hetflow::model {

std::vector<Device> Cluster::devices() const {
  std::vector<Device> out;
  out.reserve(static_cast<size_t>(device_count()));
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int r = 0; r < nodes[n].gpu_count; ++r) {
      out.push_back(Device{static_cast<int>(out.size()), static_cast<int>(n), r,
                           nodes[n].name + "/gpu" + std::to_string(r)});
    }
  }
  return out;
}

int Cluster::device_count() const {
  int total = 0;
  for (const Node& n : nodes) total += n.gpu_count;
  return total;
}

NodeHost Cluster::host(int node) const {
  const Node& n = nodes.at(static_cast<size_t>(node));
  return resolved_host(n.host, gpu(n.gpu));
}

bool Cluster::priced() const {
  return !nodes.empty() && std::all_of(nodes.begin(), nodes.end(), [](const Node& n) { return n.price_usd_per_gpu_hour > 0; });
}

const GpuSpec& Cluster::gpu(const std::string& type) const {
  for (const GpuSpec& g : gpu_types) {
    if (g.name == type) return g;
  }
  if (const GpuSpec* g = find_builtin_gpu(type)) return *g;
  throw Error("unknown GPU type '" + type + "'");
}

}  // namespace hetflow::model
