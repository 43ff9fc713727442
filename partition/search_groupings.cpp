// The groupings policy grouped is searched with (partition/search.hpp): which GPU types
// train, in workers of one type or of several, and at which tensor-parallel degree each.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "model/error.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/search.hpp"

namespace hetflow::partition {

namespace search_detail {

int transformer_layers(const model::Network& network) {
  int n = 0;
  for (const model::Layer& l : network.layers) n += l.kind == "transformer";
  return n > 0 ? n : static_cast<int>(network.layers.size());
}

}  // namespace search_detail

namespace {

int gcd_of(const std::vector<int>& v) {
  int g = 0;
  for (const int x : v) g = std::gcd(g, x);
  return g;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// Weights, gradients and Adam's state per parameter (all-reduce keeps the optimizer on the
// workers): a worker needs at least this much memory, spread over its ranks.
double training_state_bytes(const model::Network& network, model::Precision precision) {
  double params = 0;
  for (const model::Layer& l : network.layers) params += l.params;
  return params * (2 * model::element_bytes(precision) + model::adam_state_bytes(precision));
}

// The depths (divisors of `ranks`, at most the layer count) whose ranks of `tensor` GPUs of
// `usable_bytes` each hold the state, the `most` shallowest.
std::vector<int> fitting_depths(int ranks, int tensor, double usable_bytes, double state_bytes, int layers, size_t most) {
  std::vector<int> fit;
  for (const int d : divisors(ranks)) {
    if (fit.size() < most && d <= layers && usable_bytes > 0 && d * tensor * usable_bytes >= state_bytes) fit.push_back(d);
  }
  return fit;
}

}  // namespace

std::vector<Grouping> search_groupings(const model::Cluster& cluster, const model::Network& network, int tensor,
                                       const PlanOptions& base) {
  struct Type {
    std::string name;
    int ranks = 0;  // of `tensor` GPUs of this type inside one node
    double speed = 0, memory_bytes = 0;
  };
  std::vector<Type> types;
  for (const model::Node& n : cluster.nodes) {
    auto it = std::find_if(types.begin(), types.end(), [&](const Type& t) { return t.name == n.gpu; });
    if (it == types.end()) {
      const model::GpuSpec& g = cluster.gpu(n.gpu);
      types.push_back(Type{n.gpu, 0, g.peak_flops_per_s(base.precision), g.memory_bytes});
      it = types.end() - 1;
    }
    it->ranks += n.gpu_count / tensor;
  }
  std::erase_if(types, [](const Type& t) { return t.ranks == 0; });
  if (types.size() < 2) return {};  // one type: uniform and balanced lay it out already
  std::stable_sort(types.begin(), types.end(), [](const Type& a, const Type& b) { return a.speed > b.speed; });
  const double state_bytes = training_state_bytes(network, base.precision);
  const int layers = search_detail::transformer_layers(network);
  const auto gpus = [&](int ranks) { return std::to_string(ranks * tensor); };

  std::vector<Grouping> out;
  std::set<std::string> seen;
  const auto add = [&](std::string spec, int depth) {
    if (seen.insert(spec).second) out.push_back(Grouping{std::move(spec), depth, tensor});
  };
  // The fastest k types, for k = 1..all: a slow type can cost more than it brings.
  for (size_t k = 1; k <= types.size(); ++k) {
    const std::vector<Type> used(types.begin(), types.begin() + static_cast<std::ptrdiff_t>(k));
    // By type: each type's GPUs in pipelines of their own, the two shallowest depths whose
    // ranks can hold the model's state; workers of different types differ in size.
    std::vector<std::vector<int>> depths;
    for (const Type& t : used) {
      depths.push_back(fitting_depths(t.ranks, tensor, t.memory_bytes - base.workspace_bytes, state_bytes, layers, 2));
    }
    if (std::all_of(depths.begin(), depths.end(), [](const std::vector<int>& d) { return !d.empty(); })) {
      std::vector<size_t> pick(used.size(), 0);
      for (;;) {
        std::string spec;
        int shallowest = layers;
        for (size_t i = 0; i < used.size(); ++i) {
          const int d = depths[i][pick[i]];
          spec += (spec.empty() ? "*x" : ", *x") + gpus(d) + " " + used[i].name;
          shallowest = std::min(shallowest, d);
        }
        add(spec, shallowest);
        size_t i = 0;
        while (i < pick.size() && ++pick[i] == depths[i].size()) pick[i++] = 0;
        if (i == pick.size()) break;
      }
    }
    // Mixed: w identical workers, each an equal share of every type (HetPipe ED for any w).
    if (used.size() < 2) continue;
    std::vector<int> ranks;
    for (const Type& t : used) ranks.push_back(t.ranks);
    for (const int w : divisors(gcd_of(ranks))) {
      int depth = 0;
      double memory = 0;
      std::string shape;
      for (const Type& t : used) {
        depth += t.ranks / w;
        memory += (t.ranks / w) * tensor * (t.memory_bytes - base.workspace_bytes);
        shape += (shape.empty() ? "" : " + ") + gpus(t.ranks / w) + " " + t.name;
      }
      if (depth <= layers && memory >= state_bytes) add(std::to_string(w) + "x(" + shape + ")", depth);
    }
  }
  return out;
}


std::vector<Grouping> search_tensor_mixes(const model::Cluster& cluster, const model::Network& network,
                                          const std::vector<int>& tensors, int global_batch, const PlanOptions& base,
                                          const CostModel& cost) {
  // A type's choice: its GPUs in ranks of t inside a node, in pipelines of d ranks.
  struct Choice {
    int tensor = 1, depth = 1, ranks = 0;
  };
  struct Type {
    std::string name;
    double speed = 0, memory_bytes = 0;
    std::vector<Choice> choices;
  };
  std::vector<Type> types;
  for (const model::Node& n : cluster.nodes) {
    if (std::none_of(types.begin(), types.end(), [&](const Type& t) { return t.name == n.gpu; })) {
      const model::GpuSpec& g = cluster.gpu(n.gpu);
      types.push_back(Type{n.gpu, g.peak_flops_per_s(base.precision), g.memory_bytes, {}});
    }
  }
  if (types.size() < 2 || global_batch < 1) return {};
  std::stable_sort(types.begin(), types.end(), [](const Type& a, const Type& b) { return a.speed > b.speed; });
  const double state_bytes = training_state_bytes(network, base.precision);
  const int layers = search_detail::transformer_layers(network);
  for (Type& type : types) {
    for (const int t : tensors) {
      const bool divides_heads = std::all_of(network.layers.begin(), network.layers.end(), [&](const model::Layer& l) {
        return !l.tp_splittable || l.tp_units <= 0 || l.tp_units % t == 0;
      });
      if (!divides_heads) continue;
      int ranks = 0;  // of t GPUs inside one node
      for (const model::Node& n : cluster.nodes) ranks += n.gpu == type.name ? n.gpu_count / t : 0;
      const size_t any = static_cast<size_t>(ranks);
      for (const int d : fitting_depths(ranks, t, type.memory_bytes - base.workspace_bytes, state_bytes, layers, any)) {
        type.choices.push_back(Choice{t, d, ranks});
      }
    }
  }
  // Terms at the first type's degree are written without `tp` (it becomes the options' tensor).
  const auto term = [](int gpus, const std::string& name, int t, int default_t) {
    return std::to_string(gpus) + " " + name + (t != default_t ? " tp" + std::to_string(t) : "");
  };
  const auto by_type = [&](const std::vector<Type>& used, const std::vector<size_t>& pick) {
    Grouping g{"", layers, used[0].choices[pick[0]].tensor};
    for (size_t i = 0; i < used.size(); ++i) {
      const Choice& c = used[i].choices[pick[i]];
      g.groups += (g.groups.empty() ? "*x" : ", *x") + term(c.depth * c.tensor, used[i].name, c.tensor, g.tensor);
      g.shallowest = std::min(g.shallowest, c.depth);
    }
    return g;
  };
  // A grouping's time by the layout's estimate, at micro-batch 1 and 1F1B, the better of no
  // and full recomputation that fits; infinity when neither fits or the policy refuses it.
  // Remembered: the descents from different starts meet the same groupings again.
  std::map<std::string, double> times;
  const auto time_of = [&](const Grouping& g) {
    const std::string key = g.groups + " | tensor " + std::to_string(g.tensor);  // untagged terms take g.tensor
    const auto known = times.find(key);
    if (known != times.end()) return known->second;
    double& best = times[key];
    best = std::numeric_limits<double>::infinity();
    for (const Recompute r : {Recompute::none, Recompute::full}) {
      PlanOptions o = base;
      o.policy = "grouped";
      o.groups = g.groups;
      o.tensor = g.tensor;
      o.pipeline = o.data = o.microbatches = 0;
      o.micro_batch = 1;
      o.global_batch = global_batch;
      o.schedule = "1f1b";
      o.virtual_stages = 1;
      o.recompute = r;
      o.sync = SyncKind::allreduce;
      o.staleness = 0;
      o.stage_layers.clear();
      o.layout_file.clear();
      try {
        const LayoutEstimate e = estimate_layout(network, make_layout(cluster, network, o, cost), cost);
        if (e.headroom_bytes >= 0) best = std::min(best, e.iteration_time_s);
      } catch (const Error&) {
      }
    }
    return best;
  };

  std::vector<Grouping> out;
  std::set<std::string> seen;
  for (size_t k = 2; k <= types.size(); ++k) {
    const std::vector<Type> used(types.begin(), types.begin() + static_cast<std::ptrdiff_t>(k));
    if (std::any_of(used.begin(), used.end(), [](const Type& t) { return t.choices.empty(); })) break;
    // By type: coordinate descent, one type's choice changed at a time while the estimate
    // improves, from every type at its shallowest choice of each degree in turn (one start
    // per degree: a descent alone stops where two types would have to change at once).
    const auto mixed = [&](const std::vector<size_t>& p) {
      for (size_t i = 1; i < k; ++i) {
        if (used[i].choices[p[i]].tensor != used[0].choices[p[0]].tensor) return true;
      }
      return false;
    };
    std::set<std::vector<size_t>> starts;
    for (const int t : tensors) {
      std::vector<size_t> start(k, 0);
      for (size_t i = 0; i < k; ++i) {
        for (size_t c = used[i].choices.size(); c-- > 0;) {
          if (used[i].choices[c].tensor == t) start[i] = c;  // the first (shallowest) of degree t
        }
      }
      starts.insert(start);
    }
    // The best end of all the descents: one by-type grouping per k, and its mixed workers.
    std::vector<std::vector<size_t>> ends;
    double best_end = std::numeric_limits<double>::infinity();
    for (std::vector<size_t> pick : starts) {
      double now = time_of(by_type(used, pick));
      for (bool moved = true; moved;) {
        moved = false;
        for (size_t i = 0; i < k; ++i) {
          for (size_t c = 0; c < used[i].choices.size(); ++c) {
            if (c == pick[i]) continue;
            std::vector<size_t> trial = pick;
            trial[i] = c;
            const double time = time_of(by_type(used, trial));
            if (time < now) now = time, pick = trial, moved = true;
          }
        }
      }
      if (now < best_end) best_end = now, ends.assign(1, pick);
    }
    if (!ends.empty() && !mixed(ends.front())) ends.clear();  // one degree for all is search_groupings'
    for (const std::vector<size_t>& pick : ends) {
      const Grouping found = by_type(used, pick);
      if (seen.insert(found.groups).second) out.push_back(found);
      // Mixed workers: w identical workers, each type at the degree the descent chose.
      std::vector<int> ranks;
      for (size_t i = 0; i < k; ++i) ranks.push_back(used[i].choices[pick[i]].ranks);
      for (const int w : divisors(gcd_of(ranks))) {
        int depth = 0;
        double memory = 0;
        std::string shape;
        for (size_t i = 0; i < k; ++i) {
          const Choice& c = used[i].choices[pick[i]];
          depth += c.ranks / w;
          memory += (c.ranks / w) * c.tensor * (used[i].memory_bytes - base.workspace_bytes);
          shape += (shape.empty() ? "" : " + ") + term(c.ranks / w * c.tensor, used[i].name, c.tensor, found.tensor);
        }
        const std::string spec = std::to_string(w) + "x(" + shape + ")";
        if (depth <= layers && memory >= state_bytes && seen.insert(spec).second) out.push_back(Grouping{spec, depth, found.tensor});
      }
    }
  }
  return out;
}

}  // namespace hetflow::partition
