// The SimGrid platform against the cost model: every route's links, latency and bottleneck
// bandwidth, for every kind of fabric; and the exported platform XML loading back.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <simgrid/s4u.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include "model/io.hpp"
#include "partition/cost_model.hpp"
#include "sim/platform.hpp"
#include "sim/platform_spec.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;

namespace {

// SimGrid allows one engine per process: each check runs in a child and reports its
// mismatches (empty = none) through a pipe.
std::string in_child(const std::function<std::string()>& check) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    try {
      out = check();
    } catch (const std::exception& e) {
      out = std::string("exception: ") + e.what();
    }
    if (write(fds[1], out.data(), out.size()) < 0) _exit(3);
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out += " [child exited abnormally]";
  return out;
}

// Compares SimGrid's route between every pair of devices with CostModel::route().
std::string compare_routes(const model::Cluster& cluster, const std::vector<simgrid::s4u::Host*>& hosts) {
  const partition::CostModel cost(cluster, model::Precision::fp16);
  std::ostringstream problems;
  int mismatches = 0;
  for (size_t a = 0; a < hosts.size(); ++a) {
    for (size_t b = 0; b < hosts.size(); ++b) {
      if (a == b) continue;
      std::vector<simgrid::s4u::Link*> links;
      double latency = 0;
      hosts[a]->route_to(hosts[b], links, &latency);
      double bandwidth = 1e300;
      for (auto* l : links) bandwidth = std::min(bandwidth, l->get_bandwidth());
      // The simulator caps inter-node flows at one NIC; the platform's NIC link aggregates all.
      const int na = cost.node_of(static_cast<int>(a)), nb = cost.node_of(static_cast<int>(b));
      if (na != nb) {
        bandwidth = std::min({bandwidth, cluster.nodes[static_cast<size_t>(na)].nic.bandwidth_bytes_per_s,
                              cluster.nodes[static_cast<size_t>(nb)].nic.bandwidth_bytes_per_s});
      }
      const partition::Route r = cost.route(static_cast<int>(a), static_cast<int>(b));
      if (std::fabs(latency - r.latency_s) > 1e-12 * std::max(1.0, r.latency_s) ||
          std::fabs(bandwidth / r.bandwidth_bytes_per_s - 1) > 1e-12) {
        if (++mismatches > 3) continue;  // the first few say enough
        problems << hosts[a]->get_name() << " -> " << hosts[b]->get_name() << ": simgrid " << latency << " s, "
                 << bandwidth << " B/s; cost model " << r.latency_s << " s, " << r.bandwidth_bytes_per_s << " B/s\n";
      }
    }
  }
  if (mismatches > 3) problems << "... " << mismatches << " mismatched routes in all\n";
  return problems.str();
}

// Compares the links of SimGrid's route between every pair of devices with
// CostModel::route_links(): the same links of limited bandwidth, in order, each id always
// the same SimGrid link (one direction of a split-duplex link) and each at its bandwidth, so
// flows meet in the estimate's link sharing exactly where they meet in SimGrid's.
std::string compare_route_links(const model::Cluster& cluster, const std::vector<simgrid::s4u::Host*>& hosts) {
  const partition::CostModel cost(cluster, model::Precision::fp16);
  std::ostringstream problems;
  int mismatches = 0;
  std::map<int, const simgrid::s4u::Link*> link_of;
  std::map<const simgrid::s4u::Link*, int> id_of;
  std::vector<int> ids;
  for (size_t a = 0; a < hosts.size(); ++a) {
    for (size_t b = 0; b < hosts.size(); ++b) {
      if (a == b) continue;
      std::vector<simgrid::s4u::Link*> all;
      double latency = 0;
      hosts[a]->route_to(hosts[b], all, &latency);
      std::vector<const simgrid::s4u::Link*> links;
      for (const auto* l : all) {
        if (l->get_bandwidth() < 1e17) links.push_back(l);  // the platform's unlimited links share nothing
      }
      ids.clear();
      cost.route_links(static_cast<int>(a), static_cast<int>(b), ids);
      bool same = ids.size() == links.size();
      for (size_t i = 0; same && i < ids.size(); ++i) {
        const auto [to, new_id] = link_of.emplace(ids[i], links[i]);
        const auto [from, new_link] = id_of.emplace(links[i], ids[i]);
        same = to->second == links[i] && from->second == ids[i] &&
               std::fabs(cost.link_bandwidth_bytes_per_s(ids[i]) / links[i]->get_bandwidth() - 1) < 1e-12;
      }
      if (!same && ++mismatches <= 3) {
        problems << hosts[a]->get_name() << " -> " << hosts[b]->get_name() << ": simgrid";
        for (const auto* l : links) problems << " " << l->get_name();
        problems << "; cost model";
        for (const int id : ids) problems << " " << id;
        problems << "\n";
      }
    }
  }
  if (mismatches > 3) problems << "... " << mismatches << " mismatched routes in all\n";
  return problems.str();
}

std::vector<double> unit_speeds(const model::Cluster& c) { return std::vector<double>(static_cast<size_t>(c.device_count()), 1e12); }

const char* kFatTree = R"(name: tree
fabric: {kind: fat-tree, nodes_per_leaf: 2, oversubscription: 4, latency: 1 us}
nodes:
  - {name: a, count: 3, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 300 GB/s, latency: 2 us},
     nic: {count: 2, bandwidth: 100 Gb/s, latency: 3 us}}
  - {name: p, gpu: RTX-3090, gpus: 2, intra: {kind: pcie, bandwidth: 32 GB/s, latency: 5 us, uplink: 16 GB/s},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 7 us}}
)";

}  // namespace

class PlatformRoutes : public ::testing::TestWithParam<std::string> {};

TEST_P(PlatformRoutes, EqualTheCostModelRoutes) {
  const std::string name = GetParam();
  const model::Cluster cluster = name == "fat-tree" ? model::parse_cluster(kFatTree, "tree.yaml") : model::builtin_cluster(name);
  const std::string problems = in_child([&] {
    sim::start_engine(0);
    const sim::Platform p = sim::instantiate_platform(sim::platform_spec(cluster, unit_speeds(cluster)));
    return compare_routes(cluster, p.hosts);
  });
  EXPECT_EQ(problems, "");
}

TEST_P(PlatformRoutes, CrossTheCostModelsLinks) {
  const std::string name = GetParam();
  const model::Cluster cluster = name == "fat-tree" ? model::parse_cluster(kFatTree, "tree.yaml") : model::builtin_cluster(name);
  const std::string problems = in_child([&] {
    sim::start_engine(0);
    const sim::Platform p = sim::instantiate_platform(sim::platform_spec(cluster, unit_speeds(cluster)));
    return compare_route_links(cluster, p.hosts);
  });
  EXPECT_EQ(problems, "");
}

INSTANTIATE_TEST_SUITE_P(Clusters, PlatformRoutes,
                         ::testing::Values("mixed-academic", "hetpipe-testbed", "two-region", "fat-tree"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

// Every route between the given devices, as SimGrid gives it: its links in order and its latency.
std::string routes_between(const std::vector<simgrid::s4u::Host*>& hosts, const std::vector<int>& devices) {
  std::ostringstream out;
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      std::vector<simgrid::s4u::Link*> links;
      double latency = 0;
      hosts.at(static_cast<size_t>(a))->route_to(hosts.at(static_cast<size_t>(b)), links, &latency);
      out << a << " -> " << b << ":";
      for (auto* l : links) out << " " << l->get_name() << "@" << l->get_bandwidth();
      out << " " << latency << " s\n";
    }
  }
  return out.str();
}

// A platform of only the needed hosts has the whole platform's routes between them, and no
// host of another node; it makes fewer links.
TEST_P(PlatformRoutes, APlatformOfTheNeededHostsHasTheWholePlatformsRoutes) {
  const std::string name = GetParam();
  const model::Cluster cluster = name == "fat-tree" ? model::parse_cluster(kFatTree, "tree.yaml") : model::builtin_cluster(name);
  const sim::PlatformSpec spec = sim::platform_spec(cluster, unit_speeds(cluster));
  // The first node's devices and the last device (another node, region or leaf).
  std::vector<int> devices;
  for (const model::Device& d : cluster.devices()) {
    if (d.node == 0) devices.push_back(d.id);
  }
  devices.push_back(cluster.device_count() - 1);
  std::vector<bool> needed(static_cast<size_t>(cluster.device_count()), false);
  for (int d : devices) needed[static_cast<size_t>(d)] = true;
  const int last_node = cluster.devices().back().node;
  size_t on_their_nodes = 0;  // the hosts of the needed hosts' nodes, all made with their node
  for (const model::Device& d : cluster.devices()) on_their_nodes += d.node == 0 || d.node == last_node;
  const std::string whole = in_child([&] {
    sim::start_engine(0);
    return routes_between(sim::instantiate_platform(spec).hosts, devices);
  });
  const std::string part = in_child([&] {
    sim::start_engine(0);
    const sim::Platform p = sim::instantiate_platform(spec, {}, needed);
    std::string out = routes_between(p.hosts, devices);
    size_t made = 0, links = 0;
    for (size_t h = 0; h < p.hosts.size(); ++h) made += p.hosts[h] != nullptr;
    for (auto* l : p.links) links += l != nullptr;
    if (made != on_their_nodes) out += "hosts made: " + std::to_string(made) + "\n";
    if (links >= spec.links.size()) out += "links made: all " + std::to_string(links) + "\n";
    return out;
  });
  ASSERT_NE(whole.find(" -> "), std::string::npos) << whole;
  EXPECT_EQ(part, whole);
}

TEST(PlatformXml, ExportedPlatformLoadsWithTheSameRoutes) {
  for (const std::string name : {"mixed-academic", "fat-tree", "two-region"}) {
    const model::Cluster cluster = name == "fat-tree" ? model::parse_cluster(kFatTree, "tree.yaml") : model::builtin_cluster(name);
    const std::string path = test_support::write_file(name + ".xml", sim::platform_xml(sim::platform_spec(cluster, unit_speeds(cluster))));
    const std::string problems = in_child([&] {
      int argc = 1;
      char arg0[] = "t";
      char* argv[] = {arg0, nullptr};
      simgrid::s4u::Engine e(&argc, argv);
      e.load_platform(path);
      e.get_netzone_root()->seal();
      std::vector<simgrid::s4u::Host*> hosts;
      for (const model::Device& d : cluster.devices()) hosts.push_back(e.host_by_name(d.name));
      return compare_routes(cluster, hosts);
    });
    EXPECT_EQ(problems, "") << name;
  }
}
