#include "partition/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "model/error.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition {
namespace {

bool is_hetpipe(const std::string& policy) { return policy.rfind("hetpipe", 0) == 0; }

int transformer_layers(const model::Network& network) {
  int n = 0;
  for (const model::Layer& l : network.layers) n += l.kind == "transformer";
  return n > 0 ? n : static_cast<int>(network.layers.size());
}

SearchSpace with_defaults(const model::Cluster& cluster, const model::Network& network, int global_batch,
                          SearchSpace s) {
  const int devices = static_cast<int>(cluster.devices().size());
  if (s.policies.empty()) s.policies = {"uniform", "balanced", "hetpipe-np", "hetpipe-ed", "hetpipe-hd"};
  if (s.tensors.empty()) {
    int smallest = std::numeric_limits<int>::max();
    for (const model::Node& n : cluster.nodes) smallest = std::min(smallest, n.gpu_count);
    for (int t = 1; t <= smallest; t *= 2) s.tensors.push_back(t);
  }
  if (s.pipelines.empty()) {
    const int layers = transformer_layers(network);
    for (int p = 1; p <= std::min(devices, layers); ++p) {
      if (devices % p == 0) s.pipelines.push_back(p);
    }
  }
  if (s.micro_batches.empty()) {
    for (int mb = 1; mb <= 32 && mb <= global_batch; mb *= 2) {
      if (global_batch % mb == 0) s.micro_batches.push_back(mb);
    }
  }
  if (s.schedules.empty()) s.schedules = {"1f1b", "gpipe", "interleaved"};
  if (s.recomputes.empty()) s.recomputes = {Recompute::none, Recompute::selective, Recompute::full};
  if (s.syncs.empty()) s.syncs = {SyncKind::allreduce, SyncKind::ps};
  return s;
}

}  // namespace

std::string candidate_summary(const PlanOptions& o, int workers) {
  std::string s = o.policy;
  if (!is_hetpipe(o.policy)) {
    s += " t" + std::to_string(o.tensor) + " p" + std::to_string(o.pipeline) + " d" + std::to_string(workers);
  } else {
    s += " (" + std::to_string(workers) + " workers)";
  }
  s += ", mb " + std::to_string(o.micro_batch) + ", " + o.schedule;
  if (o.virtual_stages > 1) s += " x" + std::to_string(o.virtual_stages);
  s += ", recompute " + std::string(to_string(o.recompute));
  s += ", " + std::string(to_string(o.sync.value_or(SyncKind::allreduce)));
  if (o.sync == SyncKind::wsp) s += " D" + std::to_string(o.staleness);
  return s;
}

std::vector<PlanOptions> search_candidates(const model::Cluster& cluster, const model::Network& network,
                                           int global_batch, const SearchSpace& space, const PlanOptions& base) {
  const SearchSpace s = with_defaults(cluster, network, global_batch, space);
  const int devices = static_cast<int>(cluster.devices().size());
  std::vector<PlanOptions> out;
  for (const std::string& policy : s.policies) {
    const bool hetpipe = is_hetpipe(policy);
    for (int t : hetpipe ? std::vector<int>{1} : s.tensors) {
      for (int p : hetpipe ? std::vector<int>{0} : s.pipelines) {
        if (!hetpipe && devices % (t * p) != 0) continue;  // every device used
        for (int mb : s.micro_batches) {
          for (const std::string& schedule : s.schedules) {
            if (schedule == "interleaved" && !hetpipe && p < 2) continue;
            for (Recompute r : s.recomputes) {
              for (SyncKind sync : s.syncs) {
                PlanOptions o = base;
                o.policy = policy;
                o.tensor = t;
                o.pipeline = p;
                o.data = 0;
                o.micro_batch = mb;
                o.global_batch = global_batch;
                o.microbatches = 0;
                o.schedule = schedule;
                o.virtual_stages = schedule == "interleaved" ? 2 : 1;
                o.recompute = r;
                o.sync = sync;
                o.staleness = 0;
                o.stage_layers.clear();
                o.layout_file.clear();
                out.push_back(std::move(o));
              }
            }
          }
        }
      }
    }
  }
  return out;
}

double compute_lower_bound_s(const model::Network& network, const Layout& layout, const CostModel& cost) {
  std::map<int, double> busy;
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    const VirtualWorker& vw = layout.workers[w];
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      const auto& rank = vw.ranks[static_cast<size_t>(s.rank)];
      const builder::ChunkWork work = builder::chunk_work(network, layout, s, static_cast<int>(rank.size()));
      Task t;
      t.worker = static_cast<int>(w);
      t.stage = static_cast<int>(k);
      t.layer_begin = s.layer_begin;
      t.layer_end = s.layer_end;
      for (int device : rank) {
        t.device = device;
        t.kind = TaskKind::forward;
        t.flops = work.forward_flops;
        t.recompute_flops = 0;
        double chunk_s = cost.task_compute_time_s(network, layout, t);
        t.kind = TaskKind::backward;
        t.flops = work.backward_flops + work.recompute_flops;
        t.recompute_flops = work.recompute_flops;
        chunk_s += cost.task_compute_time_s(network, layout, t);
        busy[device] += chunk_s * vw.microbatches;
      }
    }
  }
  double bound = 0;
  for (const auto& [device, s] : busy) bound = std::max(bound, s);
  return bound;
}

std::vector<std::string> candidate_families(const PlanOptions& o) {
  const SyncKind sync = o.sync.value_or(SyncKind::allreduce);
  std::vector<std::string> families = {"all", o.policy + "/" + std::string(to_string(sync))};
  if (o.policy == "uniform" && o.tensor == 1 && o.pipeline == 1 && sync == SyncKind::allreduce) {
    families.push_back("data-parallel");
  }
  return families;
}

namespace {
bool evaluate_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                     const Layout& layout, const CostModel& cost, Candidate* out, std::string* why) {
  try {
    const Plan plan = build_plan(cluster, network, layout, cost);
    Candidate c;
    c.options = options;
    c.summary = candidate_summary(options, static_cast<int>(layout.workers.size()));
    c.headroom_bytes = std::numeric_limits<double>::infinity();
    for (const DeviceMemory& m : plan.memory) {
      if (m.capacity_bytes > 0) c.headroom_bytes = std::min(c.headroom_bytes, m.capacity_bytes - m.total_bytes());
    }
    c.estimate = estimate_plan(plan, cost);
    for (size_t d = 0; d < c.estimate.busy_s.size(); ++d) {
      if (c.estimate.busy_s[d] > 0) ++c.devices_used;
      if (c.estimate.busy_s[d] > c.slowest_busy_s) {
        c.slowest_busy_s = c.estimate.busy_s[d];
        c.slowest_device = plan.device_names[d];
      }
    }
    *out = std::move(c);
    return true;
  } catch (const Error& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
}

// The best estimates kept so far, per family, shared by the search's threads.
class Kept {
 public:
  explicit Kept(int keep) : keep_(static_cast<size_t>(keep)) {}
  // Whether a candidate of these families with this bound could still be among the kept.
  bool worth_building(const std::vector<std::string>& families, double bound_s) {
    if (keep_ == 0) return true;
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& f : families) {
      const auto it = best_.find(f);
      if (it == best_.end() || it->second.size() < keep_ || bound_s <= it->second.back()) return true;
    }
    return false;
  }
  void add(const std::vector<std::string>& families, double time_s) {
    if (keep_ == 0) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& f : families) {
      std::vector<double>& best = best_[f];
      best.insert(std::upper_bound(best.begin(), best.end(), time_s), time_s);
      if (best.size() > keep_) best.pop_back();
    }
  }

 private:
  size_t keep_;
  std::mutex mutex_;
  std::map<std::string, std::vector<double>> best_;  // ascending, at most keep_ each
};
}  // namespace

bool evaluate_candidate(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                        const CostModel& cost, Candidate* out, std::string* why) {
  try {
    return evaluate_layout(cluster, network, options, make_layout(cluster, network, options, cost), cost, out, why);
  } catch (const Error& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
}

SearchResult search_plans(const model::Cluster& cluster, const model::Network& network, int global_batch,
                          const SearchSpace& space, const PlanOptions& base, const CostModel& cost, int threads,
                          int keep, const std::function<void(int, int)>& on_progress) {
  const auto started = std::chrono::steady_clock::now();
  const std::vector<PlanOptions> candidates = search_candidates(cluster, network, global_batch, space, base);
  const int total = static_cast<int>(candidates.size());
  std::vector<Candidate> results(candidates.size());
  enum Outcome : char { kRefused, kBuilt, kPruned };
  std::vector<char> outcome(candidates.size(), kRefused);
  std::atomic<int> next{0}, done{0};
  Kept kept(keep);
  auto work = [&] {
    for (int i = next++; i < total; i = next++) {
      const auto at = static_cast<size_t>(i);
      const PlanOptions& o = candidates[at];
      try {
        const Layout layout = make_layout(cluster, network, o, cost);
        const std::vector<std::string> families = candidate_families(o);
        if (!kept.worth_building(families, compute_lower_bound_s(network, layout, cost))) {
          outcome[at] = kPruned;
        } else if (evaluate_layout(cluster, network, o, layout, cost, &results[at], nullptr)) {
          outcome[at] = kBuilt;
          if (results[at].headroom_bytes >= 0) kept.add(families, results[at].estimate.iteration_time_s);
        }
      } catch (const Error&) {
        outcome[at] = kRefused;
      }
      ++done;
    }
  };
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  const int n = std::max(1, std::min(threads > 0 ? threads : static_cast<int>(cores), total));
  // With a progress callback the calling thread only reports; otherwise it works too.
  std::vector<std::thread> pool;
  for (int t = on_progress ? 0 : 1; t < n; ++t) pool.emplace_back(work);
  if (on_progress) {
    while (done < total) {
      on_progress(done, total);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    on_progress(total, total);
  } else {
    work();
  }
  for (std::thread& t : pool) t.join();

  SearchResult r;
  r.candidates = total;
  for (size_t i = 0; i < results.size(); ++i) {
    if (outcome[i] == kPruned) {
      ++r.pruned;
    } else if (outcome[i] == kRefused) {
      ++r.refused;
    } else if (results[i].headroom_bytes < 0) {
      ++r.over_memory;
    } else {
      r.ranked.push_back(std::move(results[i]));
    }
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    return a.estimate.iteration_time_s < b.estimate.iteration_time_s;
  });
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

}  // namespace hetflow::partition
