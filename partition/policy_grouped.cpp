// The grouped policy: virtual workers of any shape, named by GPU type (PlanOptions::groups).
//
//   "*x4 TITAN-V, *x2 RTX-2060"      every TITAN V in workers of 4, every RTX 2060 in workers of 2
//   "2x(2 TITAN-RTX + 1 Quadro-P4000)"  two workers, each of 2 TITAN RTX and 1 Quadro P4000
//   "4 TITAN-V"                      one worker of 4 TITAN V; the cluster's other GPUs stay idle
//   "*x8 A100-80 tp4, *x4 T4 tp1"    A100 workers of two 4-GPU tensor-parallel ranks, T4
//                                    workers of four 1-GPU ranks: TP degrees per worker
//
// Devices are dealt out group by group, worker by worker, one tensor-parallel rank (of
// `tensor` devices of one type in one node) at a time from the first node that still has
// that many free: a worker's ranks stay on as few nodes as the cluster allows. A term's `tp`
// gives its ranks' degree, `tensor` the rest; the layout's `tensor` is then the largest. Each worker's
// stages are balanced with the best order of its GPU types (policy_detail::BalanceMemo), and
// the global batch's micro-batches go to the workers so that the last pipeline to finish
// finishes soonest (split_microbatches_by_makespan).
#include <algorithm>
#include <cctype>
#include <numeric>

#include "model/error.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

namespace {

[[noreturn]] void bad_groups(const std::string& message) { throw InputError(kOptions, 0, "groups", message); }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// A positive integer of at most 6 digits, or -1.
int small_count(const std::string& s) {
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return -1;
  }
  const int n = std::stoi(s);
  return n > 0 ? n : -1;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(trim(s.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  return out;
}

}  // namespace

std::vector<WorkerGroup> parse_groups(const std::string& text, const model::Cluster& cluster) {
  std::vector<std::string> types;  // the cluster's, in first-seen order
  for (const model::Node& n : cluster.nodes) {
    if (std::find(types.begin(), types.end(), n.gpu) == types.end()) types.push_back(n.gpu);
  }
  std::vector<WorkerGroup> groups;
  for (const std::string& item : split(text, ',')) {
    const std::string where = "group " + std::to_string(groups.size() + 1) + " ('" + item + "')";
    if (item.empty()) bad_groups("expected groups like \"*x4 V100-16, 2x(2 A100-80 + 1 T4)\", found an empty one in '" + text + "'");
    WorkerGroup g;
    std::string shape = item;
    // COUNT 'x' SHAPE: the x right after a count (digits or *) and before a digit or '('.
    const size_t x = item.find_first_of("xX");
    if (x != std::string::npos) {
      const std::string count = trim(item.substr(0, x)), rest = trim(item.substr(x + 1));
      const bool counted = (count == "*" || small_count(count) > 0) && !rest.empty() &&
                           (std::isdigit(static_cast<unsigned char>(rest.front())) || rest.front() == '(');
      if (counted) {
        g.count = count == "*" ? 0 : small_count(count);
        shape = rest;
      }
    }
    if (!shape.empty() && shape.front() == '(') {
      if (shape.back() != ')') bad_groups(where + ": expected ')' at its end");
      shape = trim(shape.substr(1, shape.size() - 2));
    }
    for (const std::string& term : split(shape, '+')) {
      const size_t space = term.find_first_of(" \t");
      const int n = space == std::string::npos ? -1 : small_count(term.substr(0, space));
      if (n < 1) bad_groups(where + ": expected terms like '4 V100-16' (a count of GPUs, then their type), found '" + term + "'");
      std::string type = trim(term.substr(space));
      // A last word 'tpT' is the ranks' tensor-parallel degree (type names hold no spaces).
      int tensor = 0;
      const size_t last = type.find_last_of(" \t");
      if (last != std::string::npos) {
        const std::string word = lower(type.substr(last + 1));
        tensor = word.rfind("tp", 0) == 0 ? small_count(word.substr(2)) : -1;
        if (tensor < 1) {
          bad_groups(where + ": expected '" + trim(type.substr(0, last)) + "' to end with a tensor-parallel degree like 'tp2', found '" +
                     type.substr(last + 1) + "'");
        }
        if (n % tensor != 0) {
          bad_groups(where + ": " + std::to_string(n) + " GPUs do not make ranks of " + word + " (" + std::to_string(tensor) + " GPUs each)");
        }
        type = trim(type.substr(0, last));
      }
      const auto known = std::find_if(types.begin(), types.end(), [&](const std::string& t) { return lower(t) == lower(type); });
      if (known == types.end()) {
        std::string names;
        for (const std::string& t : types) names += (names.empty() ? "" : ", ") + t;
        bad_groups(where + ": no GPU of type '" + type + "' in cluster " + cluster.name + " (it has " + names + ")");
      }
      for (const GroupTerm& t : g.terms) {
        if (t.type == *known) bad_groups(where + ": " + *known + " named twice in one worker");
      }
      g.terms.push_back(GroupTerm{n, *known, tensor});
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

std::string groups_to_string(const std::vector<WorkerGroup>& groups) {
  std::string s;
  for (const WorkerGroup& g : groups) {
    if (!s.empty()) s += ", ";
    s += (g.count == 0 ? std::string("*") : std::to_string(g.count)) + "x";
    std::string shape;
    for (const GroupTerm& t : g.terms) {
      shape += (shape.empty() ? "" : " + ") + std::to_string(t.gpus) + " " + t.type +
               (t.tensor > 0 ? " tp" + std::to_string(t.tensor) : "");
    }
    s += g.terms.size() > 1 ? "(" + shape + ")" : shape;
  }
  return s;
}

namespace policy_detail {

std::vector<int> split_microbatches_by_makespan(int total, const std::vector<double>& bottleneck_s,
                                                const std::vector<int>& depth, int virtual_stages) {
  const size_t n = bottleneck_s.size();
  std::vector<int> out(n, 1);
  const auto finish = [&](size_t w, int m) {
    return (static_cast<double>(m) * virtual_stages + depth[w] - 1) * bottleneck_s[w];
  };
  for (int given = static_cast<int>(n); given < total; ++given) {
    size_t best = 0;
    for (size_t w = 1; w < n; ++w) {
      if (finish(w, out[w] + 1) < finish(best, out[best] + 1)) best = w;
    }
    ++out[best];
  }
  return out;
}

}  // namespace policy_detail

Layout make_grouped_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& o,
                           const CostModel& cost) {
  Layout layout = policy_detail::base_layout(o, "grouped", SyncKind::allreduce);
  if (o.groups.empty()) bad_groups("policy grouped needs its workers, e.g. \"*x4 V100-16, 2x(2 A100-80 + 1 T4)\"");
  if (o.pipeline != 0 || o.data != 0) {
    throw InputError(kOptions, 0, o.pipeline != 0 ? "pipeline" : "data",
                     "policy grouped takes its workers' sizes from `groups`; leave `pipeline` and `data` out");
  }
  if (!o.stage_layers.empty()) {
    throw InputError(kOptions, 0, "stage_layers", "policy grouped balances each worker's stages itself");
  }
  const std::vector<WorkerGroup> groups = parse_groups(o.groups, cluster);
  // Free devices per node, in device order.
  std::vector<std::vector<int>> free_on(cluster.nodes.size());
  for (const model::Device& d : cluster.devices()) free_on[static_cast<size_t>(d.node)].push_back(d.id);
  // One rank of `type`: t devices from the first node of that type with t free.
  const auto take_rank = [&](const std::string& type, int t, std::vector<int>& rank) {
    for (size_t n = 0; n < cluster.nodes.size(); ++n) {
      std::vector<int>& free = free_on[n];
      if (cluster.nodes[n].gpu != type || static_cast<int>(free.size()) < t) continue;
      rank.assign(free.begin(), free.begin() + t);
      free.erase(free.begin(), free.begin() + t);
      return true;
    }
    return false;
  };
  const auto degree = [&](const GroupTerm& term) { return term.tensor > 0 ? term.tensor : o.tensor; };
  std::vector<std::vector<std::vector<int>>> workers;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const WorkerGroup& g = groups[gi];
    const std::string where = "group " + std::to_string(gi + 1) + " (" + groups_to_string({g}) + ")";
    for (const GroupTerm& term : g.terms) {
      if (term.gpus % degree(term) != 0) {
        bad_groups(where + ": " + std::to_string(term.gpus) + " " + term.type + " do not make ranks of `tensor` " +
                   std::to_string(o.tensor) + " GPUs (or give the term its own, like 'tp1')");
      }
    }
    for (int w = 0; g.count == 0 || w < g.count; ++w) {
      const auto saved = free_on;
      std::vector<std::vector<int>> ranks;
      const GroupTerm* short_of = nullptr;
      for (const GroupTerm& term : g.terms) {
        for (int r = 0; !short_of && r < term.gpus / degree(term); ++r) {
          std::vector<int> rank;
          if (take_rank(term.type, degree(term), rank)) {
            ranks.push_back(std::move(rank));
          } else {
            short_of = &term;
          }
        }
      }
      if (short_of) {
        free_on = saved;
        if (g.count == 0 && w > 0) break;  // '*': as many as there were devices for
        const int t = degree(*short_of);
        bad_groups(where + ": worker " + std::to_string(w + 1) + " finds too few free " + short_of->type +
                   (t > 1 ? " in ranks of " + std::to_string(t) + " within one node" : "") +
                   " (the groups before it took the rest)");
      }
      workers.push_back(std::move(ranks));
    }
  }
  // Each term's own degree: the tensor axis's size is the largest rank's.
  int largest = 1;
  for (const auto& ranks : workers) {
    for (const auto& rank : ranks) largest = std::max(largest, static_cast<int>(rank.size()));
  }
  layout.set_size(Axis::tensor, largest);

  const int total = o.global_batch > 0 ? o.global_batch / o.micro_batch : 0;
  if (o.global_batch > 0) {
    if (o.microbatches > 0) throw InputError(kOptions, 0, "microbatches", "give either `global_batch` or `microbatches`, not both");
    if (o.global_batch % o.micro_batch != 0 || total < static_cast<int>(workers.size())) {
      throw InputError(kOptions, 0, "global_batch",
                       "expected a multiple of `micro_batch` (" + std::to_string(o.micro_batch) + ") with a micro-batch for each of the " +
                           std::to_string(workers.size()) + " workers, found " + std::to_string(o.global_batch));
    }
  } else if (o.microbatches < 0) {
    throw InputError(kOptions, 0, "microbatches", "expected a positive number");
  }
  std::vector<double> bottlenecks;
  std::vector<int> depths;
  policy_detail::BalanceMemo memo(policy_detail::replicas_memory_bytes(layout, workers, cost));
  for (auto& ranks : workers) {
    const int p = static_cast<int>(ranks.size());
    // What the balancer plans memory for: this worker's share of the batch, or the given count.
    const int m = total > 0 ? std::max(1, total / static_cast<int>(workers.size())) : o.microbatches > 0 ? o.microbatches : 2 * p;
    policy_detail::Balanced b = memo.balance(network, layout, ranks, m, cost);
    bottlenecks.push_back(b.bottleneck_s);
    depths.push_back(p);
    layout.workers.push_back(VirtualWorker{std::move(ranks), std::move(b.stages), m});
  }
  if (total > 0) {
    const std::vector<int> split =
        policy_detail::split_microbatches_by_makespan(total, bottlenecks, depths, layout.virtual_stages);
    for (size_t w = 0; w < layout.workers.size(); ++w) {
      VirtualWorker& vw = layout.workers[w];
      // A schedule's stashes grow with its micro-batches (GPipe's with all of them): cut again
      // for the share the worker got.
      if (split[w] != vw.microbatches) vw.stages = memo.balance(network, layout, vw.ranks, split[w], cost).stages;
      vw.microbatches = split[w];
    }
  }
  policy_detail::place_layer_servers(layout, cluster, network, policy_detail::ServerPlacement::used_nodes);
  return layout;
}

}  // namespace hetflow::partition
