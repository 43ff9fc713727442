#include "partition/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "model/error.hpp"
#include "partition/schedule.hpp"
#include "partition/search_placement.hpp"
#include "partition/plan_builder.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/loading.hpp"

namespace hetflow::partition {

using search_detail::kPlacementCount;
using search_detail::kStatePlacements;
using search_detail::Placement;
using search_detail::placement;
using search_detail::placement_code;
using search_detail::stashes_leave;
using search_detail::with_placement;

namespace {

bool is_hetpipe(const std::string& policy) { return policy.rfind("hetpipe", 0) == 0; }

}  // namespace

std::string candidate_summary(const PlanOptions& o, int workers) {
  std::string s = o.policy;
  const std::string count =
      workers < 1 ? "" : " (" + std::to_string(workers) + (workers == 1 ? " worker)" : " workers)");
  if (o.policy == "grouped") {
    s += " [" + o.groups + "] t" + std::to_string(o.tensor) + count;
  } else if (!is_hetpipe(o.policy)) {
    s += " t" + std::to_string(o.tensor) + (o.context > 1 ? " c" + std::to_string(o.context) : "") +
         (o.context_comm == ContextComm::ring ? " ring" : "") +
         (o.experts.parallel > 1 ? " e" + std::to_string(o.experts.parallel) + (o.experts_by_speed ? " by speed" : "") : "") +
         " p" + std::to_string(o.pipeline);
    if (workers > 0) s += " d" + std::to_string(workers / std::max(1, o.context));
  } else {
    s += count;
  }
  s += ", mb " + std::to_string(o.micro_batch) + ", " + o.schedule;
  if (o.virtual_stages > 1) s += " x" + std::to_string(o.virtual_stages);
  s += ", recompute " + std::string(to_string(o.recompute));
  s += ", " + std::string(to_string(o.sync.value_or(SyncKind::allreduce)));
  if (o.sync == SyncKind::wsp) s += " D" + std::to_string(o.staleness);
  if (o.zero_stage > 0) {
    s += ", zero " + std::to_string(o.zero_stage) + (o.reshard_after_forward ? "" : " kept gathered") +
         (o.zero_shares == ZeroShares::memory ? " by memory" : "");
  }
  if (o.offload_optimizer) s += ", optimizer offloaded";
  if (o.offload_activations) s += ", stashes offloaded";
  return s;
}

std::vector<PlanOptions> search_candidates(const model::Cluster& cluster, const model::Network& network,
                                           int global_batch, const SearchSpace& space, const PlanOptions& base,
                                           const CostModel& cost) {
  const SearchSpace s = search_detail::with_defaults(cluster, network, global_batch, space);
  const int devices = static_cast<int>(cluster.devices().size());
  std::vector<PlanOptions> out;
  for (const std::string& policy : s.policies) {
    const bool hetpipe = is_hetpipe(policy), grouped = policy == "grouped";
    // Grouped candidates are their groupings (each with its tensor degrees); the others'
    // tensor degree and pipeline depth.
    std::vector<Grouping> shapes;
    for (int t : hetpipe ? std::vector<int>{1} : s.tensors) {
      if (grouped && s.groupings.empty()) {
        for (Grouping& g : search_groupings(cluster, network, t, base)) shapes.push_back(std::move(g));
      } else if (grouped) {
        // The user's own: interleaving is tried, and a layout with a one-GPU pipeline refuses it.
        for (const std::string& g : s.groupings) shapes.push_back(Grouping{g, 2, t});
      } else {
        for (const int p : hetpipe ? std::vector<int>{0} : s.pipelines) {
          if (hetpipe || devices % (t * p) == 0) shapes.push_back(Grouping{"", p, t});  // every device used
        }
      }
    }
    if (grouped && s.groupings.empty()) {
      for (Grouping& g : search_tensor_mixes(cluster, network, s.tensors, global_batch, base, cost)) {
        shapes.push_back(std::move(g));
      }
    }
    // Each shape at each context size and expert placement (uniform and balanced), every device used.
    std::vector<std::tuple<Grouping, int, ContextComm, search_detail::ExpertChoice>> sized;
    for (const Grouping& shape : shapes) {
      for (const int c : grouped || hetpipe ? std::vector<int>{1} : s.contexts) {
        if (c > 1 && devices % (shape.tensor * shape.shallowest * c) != 0) continue;
        const int data = grouped || hetpipe ? 0 : devices / (shape.tensor * shape.shallowest * c);
        for (const ContextComm comm : c > 1 ? s.context_comms : std::vector<ContextComm>{ContextComm::all_gather}) {
          for (const auto& e : search_detail::expert_choices(cluster, s, data, shape.tensor, base.sequence_parallel)) sized.emplace_back(shape, c, comm, e);
        }
      }
    }
    for (const auto& [shape, c, comm, experts] : sized) {
      const int p = grouped ? 0 : shape.shallowest;
      for (int mb : s.micro_batches) {
        for (const std::string& schedule : s.schedules) {
          // Schedules that loop over chunks are tried at 2 chunks per rank.
          const bool looped = schedule_by_name(schedule).interleaved;
          if (looped && !hetpipe && shape.shallowest < 2) continue;
          for (Recompute r : s.recomputes) {
            for (SyncKind sync : s.syncs) {
              // Context and expert groups sum their gradients.
              if ((c > 1 || experts.parallel > 1) && sync != SyncKind::allreduce) continue;
              PlanOptions o = base;
              o.experts.parallel = experts.parallel;
              o.experts_by_speed = experts.by_speed;
              o.policy = policy;
              o.tensor = shape.tensor;
              o.context = c;
              o.context_comm = comm;
              o.pipeline = p;
              o.data = 0;
              o.micro_batch = mb;
              o.global_batch = global_batch;
              o.microbatches = 0;
              o.schedule = schedule;
              o.virtual_stages = looped ? 2 : 1;
              o.recompute = r;
              o.sync = sync;
              o.staleness = sync == SyncKind::wsp ? s.staleness : 0;
              // The base's overlap applies to all-reduce, the servers' candidates go without.
              o.overlap_grad_reduce = base.overlap_grad_reduce && sync == SyncKind::allreduce;
              o.iterations = estimated_iterations(o);
              o.stage_layers.clear();
              o.layout_file.clear();
              o.groups = shape.groups;
              out.push_back(std::move(o));
            }
          }
        }
      }
    }
  }
  return out;
}

int estimated_iterations(const PlanOptions& o) {
  return o.sync == SyncKind::wsp && o.staleness > 0 ? std::max(o.iterations, 2 * o.staleness + 4) : o.iterations;
}

std::vector<std::string> candidate_families(const PlanOptions& o) {
  const SyncKind sync = o.sync.value_or(SyncKind::allreduce);
  std::vector<std::string> families = {"all", o.policy + "/" + std::string(to_string(sync))};
  if (o.policy == "uniform" && o.tensor == 1 && o.pipeline == 1 && o.context == 1 && sync == SyncKind::allreduce) {
    families.push_back("data-parallel");
  }
  return families;
}

void note_refusal(const Error& e, Rejected* why) {
  if (why == nullptr) return;
  if (const auto* input = dynamic_cast<const InputError*>(&e)) {
    why->file = input->file();
    why->field = input->field();
    why->message = input->message();
  } else {
    why->file.clear();
    why->field.clear();
    why->message = e.what();
  }
}

namespace {
// Whether two candidates differ only in which parameter-server sync they use (ps, or wsp at
// some staleness, estimated over its own iterations): the policies lay them out alike.
bool same_layout(const PlanOptions& a, PlanOptions b) {
  const auto ps = [](const PlanOptions& o) { return o.sync == SyncKind::ps || o.sync == SyncKind::wsp; };
  if (!ps(a) || !ps(b)) return false;
  b.sync = a.sync;
  b.staleness = a.staleness;
  b.iterations = a.iterations;
  return a == b;
}

// `layout` (of a candidate of the same group) with `options`' sync.
Layout with_sync_of(Layout layout, const PlanOptions& options) {
  layout.sync.kind = options.sync.value_or(layout.sync.kind);
  layout.sync.staleness = options.staleness;
  layout.iterations = options.iterations;
  return layout;
}

// The GPUs a layout uses: its workers' and its parameter servers'.
std::set<int> layout_gpus(const Layout& layout) {
  std::set<int> used;
  for (const VirtualWorker& vw : layout.workers) {
    for (const auto& rank : vw.ranks) used.insert(rank.begin(), rank.end());
  }
  used.insert(layout.sync.layer_server.begin(), layout.sync.layer_server.end());
  return used;
}

// Their hourly price.
double layout_price(const model::Cluster& cluster, const std::vector<model::Device>& devices, const std::set<int>& used) {
  double price = 0;
  for (const int d : used) price += cluster.nodes[static_cast<size_t>(devices[static_cast<size_t>(d)].node)].price_usd_per_gpu_hour;
  return price;
}

// The layout's estimate with a loader that limits nothing, where `floored_s` (its estimate)
// is the loader's floor; else `floored_s` itself. `gpus_only` is the cost model without an
// input path (CostModel::without_input), made once by the caller where it has many layouts.
double gpus_only_time_s(const model::Network& network, const Layout& layout, const CostModel& cost, double floored_s,
                        const CostModel* gpus_only = nullptr) {
  if (!cost.cluster().input.given) return floored_s;
  const LoaderBound loader = loader_bound(cost.cluster(), network, layout);
  if (!loader.bounded || floored_s > loader.iteration_s) return floored_s;
  if (gpus_only != nullptr) return estimate_layout(network, layout, *gpus_only).iteration_time_s;
  return estimate_layout(network, layout, cost.without_input()).iteration_time_s;
}

bool evaluate_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                     const Layout& layout, const CostModel& cost, Candidate* out, Rejected* why) {
  try {
    const Plan plan = build_plan(cluster, network, layout, cost);
    Candidate c;
    c.options = options;
    c.summary = candidate_summary(options, static_cast<int>(layout.workers.size()));
    c.headroom_bytes = std::numeric_limits<double>::infinity();
    for (size_t d = 0; d < plan.memory.size(); ++d) {
      const DeviceMemory& m = plan.memory[d];
      if (m.capacity_bytes > 0 && m.capacity_bytes - m.total_bytes() < c.headroom_bytes) {
        c.headroom_bytes = m.capacity_bytes - m.total_bytes();
        c.tightest_device = plan.device_names[d];
      }
    }
    c.estimate = estimate_plan(plan, cost);
    // Ranked by the time the search scores with: its layout's estimate, where concurrent
    // flows share links (estimate_plan times each alone; the rest of its estimate stands).
    c.estimate.iteration_time_s = estimate_layout(network, layout, cost).iteration_time_s;
    c.estimate.throughput_samples_per_s =
        c.estimate.iteration_time_s > 0 ? plan.layout.samples_per_iteration() / c.estimate.iteration_time_s : 0;
    c.estimate.throughput_tokens_per_s = c.estimate.throughput_samples_per_s * plan.network.tokens_per_sample;
    c.estimate.compute_iteration_time_s = gpus_only_time_s(network, layout, cost, c.estimate.iteration_time_s);
    c.estimate.compute_throughput_samples_per_s =
        c.estimate.compute_iteration_time_s > 0 ? plan.layout.samples_per_iteration() / c.estimate.compute_iteration_time_s : 0;
    c.input_bound = c.estimate.compute_iteration_time_s < c.estimate.iteration_time_s;
    const std::set<int> used = layout_gpus(layout);
    c.price_usd_per_hour = layout_price(cluster, cluster.devices(), used);
    c.gpus = static_cast<int>(used.size());
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
    note_refusal(e, why);
    if (why != nullptr) why->summary = candidate_summary(options, static_cast<int>(layout.workers.size()));
    return false;
  }
}

}  // namespace

bool evaluate_candidate(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                        const CostModel& cost, Candidate* out, Rejected* why) {
  if (why != nullptr) why->options = options;
  Layout layout;
  try {
    layout = make_layout(cluster, network, options, cost);
  } catch (const Error& e) {
    note_refusal(e, why);
    if (why != nullptr) why->summary = candidate_summary(options, 0);
    return false;
  }
  return evaluate_layout(cluster, network, options, layout, cost, out, why);
}

namespace {
// Runs work(i) for i in [0, count) on `threads` threads; with on_progress, the calling
// thread reports (done, of) about every 100 ms instead of working.
void in_parallel(int count, int threads, const std::function<void(int)>& work,
                 const std::function<void(int, int)>& on_progress, int done_before, int of) {
  std::atomic<int> next{0}, done{0};
  auto loop = [&] {
    for (int i = next++; i < count; i = next++) {
      work(i);
      ++done;
    }
  };
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  const int n = std::max(1, std::min(threads > 0 ? threads : static_cast<int>(cores), count));
  std::vector<std::thread> pool;
  for (int t = on_progress ? 0 : 1; t < n; ++t) pool.emplace_back(loop);
  if (on_progress) {
    while (done < count) {
      on_progress(done_before + done, of);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    on_progress(done_before + count, of);
  } else {
    loop();
  }
  for (std::thread& t : pool) t.join();
}
}  // namespace

RankKey rank_key(const Candidate& c) {
  return {c.estimate.iteration_time_s, c.input_bound, c.price_usd_per_hour, c.gpus, c.estimate.compute_iteration_time_s};
}

RankKey rank_key(const Scored& s) {
  return {s.iteration_time_s, s.input_bound, s.price_usd_per_hour, s.gpus, s.compute_iteration_time_s};
}

std::vector<size_t> search_order(size_t n, const std::function<RankKey(size_t)>& key) {
  constexpr double kTie = 1e-9;  // one loader's floor, summed over workers in another order
  std::vector<RankKey> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = key(i);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (keys[a].score != keys[b].score) return keys[a].score < keys[b].score;
    return keys[a].input_bound && !keys[b].input_bound;  // a run of ties starts at an input-bound one
  });
  // Runs of ties, each from an input-bound candidate to the last within kTie of its score
  // (one whose GPUs alone just reach that rate is in it too: it delivers the same).
  for (size_t begin = 0; begin < n;) {
    const RankKey& first = keys[order[begin]];
    size_t end = begin + 1;
    while (first.input_bound && end < n && keys[order[end]].score <= first.score * (1 + kTie)) ++end;
    std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(begin), order.begin() + static_cast<std::ptrdiff_t>(end),
                     [&](size_t a, size_t b) {
                       const RankKey &x = keys[a], &y = keys[b];
                       if (x.price_usd_per_hour != y.price_usd_per_hour) return x.price_usd_per_hour < y.price_usd_per_hour;
                       if (x.gpus != y.gpus) return x.gpus < y.gpus;
                       return x.compute_iteration_time_s < y.compute_iteration_time_s;
                     });
    begin = end;
  }
  return order;
}

namespace {
enum State : char { kRefused, kScreened, kScored, kBuilt, kOverflows };

// Every candidate's way through the search: its state, what its layout's estimate found, and
// why it was left out.
struct Scores {
  explicit Scores(size_t n)
      : state(n, kRefused), time_s(n, 0), price(n, 0), workers(n, 0), tightest(n, -1), headroom(n, 0), compute_s(n, 0),
        gpus(n, 0), zero(n, 0), why(n) {}
  std::vector<char> state;
  std::vector<double> time_s, price;
  std::vector<double> workers;   // its layout's virtual workers (0: no layout)
  std::vector<double> tightest;  // the device of least free memory by the layout's bound (-1: none)
  std::vector<double> headroom;  // that device's free memory (negative: over)
  std::vector<double> compute_s; // the layout's estimate with a loader that limits nothing
  std::vector<double> gpus;      // the GPUs its layout uses
  std::vector<double> zero;      // the ZeRO sharding chosen for it (zero_code), 0 where it kept the base's
  std::vector<Rejected> why;     // refused: the error's words
  RankKey key(size_t i) const {
    return {time_s[i], compute_s[i] < time_s[i], price[i], static_cast<int>(gpus[i]), compute_s[i]};
  }
};

// Gives every process every candidate's scores: each its groups' (state, time, price,
// workers, tightest device, headroom, GPUs-only time, GPUs, ZeRO sharding), in rank order.
void share_scores(Scores& s, const std::vector<std::vector<size_t>>& groups, const SearchSpread& spread) {
  const auto size = static_cast<size_t>(spread.size), rank = static_cast<size_t>(spread.rank);
  constexpr size_t kEach = 9;
  std::vector<double> part;
  for (size_t g = rank; g < groups.size(); g += size) {
    for (const size_t at : groups[g]) {
      part.insert(part.end(), {static_cast<double>(s.state[at]), s.time_s[at], s.price[at], s.workers[at], s.tightest[at],
                               s.headroom[at], s.compute_s[at], s.gpus[at], s.zero[at]});
    }
  }
  const std::vector<double> all = spread.all_gather(part);
  if (all.size() != kEach * s.state.size()) throw Error("search_plans: the processes gathered " + std::to_string(all.size()) + " values");
  size_t next = 0;
  for (size_t r = 0; r < size; ++r) {
    for (size_t g = r; g < groups.size(); g += size) {
      for (const size_t at : groups[g]) {
        s.state[at] = static_cast<char>(all[next]);
        s.time_s[at] = all[next + 1];
        s.price[at] = all[next + 2];
        s.workers[at] = all[next + 3];
        s.tightest[at] = all[next + 4];
        s.headroom[at] = all[next + 5];
        s.compute_s[at] = all[next + 6];
        s.gpus[at] = all[next + 7];
        s.zero[at] = all[next + 8];
        next += kEach;
      }
    }
  }
}

template <class T>
std::vector<T> in_search_order(std::vector<T> items) {
  const std::vector<size_t> order = search_order(items.size(), [&](size_t i) { return rank_key(items[i]); });
  std::vector<T> out;
  out.reserve(items.size());
  for (const size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

// The result: the built ones ranked, the pruned ones unbuilt, the rest rejected with why.
SearchResult collect(const model::Cluster& cluster, const model::Network& network, const CostModel& cost,
                     const std::vector<PlanOptions>& candidates, Scores& s, std::vector<Candidate>& results) {
  const std::vector<model::Device> devices = cluster.devices();
  SearchResult r;
  r.candidates = static_cast<int>(candidates.size());
  const auto reject = [&](size_t i) -> Rejected& {
    Rejected& x = s.why[i];
    if (s.state[i] == kRefused && x.message.empty()) {
      // Another process's refusal: the policies are deterministic, so asking again gives
      // what it was told (refusals come before any costly work).
      try {
        (void)estimate_layout(network, make_layout(cluster, network, candidates[i], cost), cost);
      } catch (const Error& e) {
        note_refusal(e, &x);
      }
    }
    x.options = candidates[i];
    x.summary = candidate_summary(candidates[i], static_cast<int>(s.workers[i]));
    return r.rejected.emplace_back(std::move(x));
  };
  const auto over = [&](size_t i, double time, const std::string& device, double headroom_bytes, bool screened) {
    Rejected& x = reject(i);
    x.over_memory = true;
    x.iteration_time_s = time;
    x.device = device;
    x.over_bytes = -headroom_bytes;
    x.screened = screened;
  };
  for (size_t i = 0; i < candidates.size(); ++i) {
    switch (s.state[i]) {
      case kRefused: ++r.refused; reject(i); break;
      case kScreened:
        ++r.over_memory;
        ++r.screened;
        over(i, s.time_s[i], s.tightest[i] >= 0 ? devices[static_cast<size_t>(s.tightest[i])].name : "", s.headroom[i], true);
        break;
      case kOverflows:
        ++r.over_memory;
        over(i, results[i].estimate.iteration_time_s, results[i].tightest_device, results[i].headroom_bytes, false);
        break;
      case kScored:
        ++r.pruned;
        r.unbuilt.push_back(Scored{candidates[i], candidate_summary(candidates[i], static_cast<int>(s.workers[i])),
                                   s.time_s[i], s.price[i], s.compute_s[i], s.compute_s[i] < s.time_s[i],
                                   static_cast<int>(s.gpus[i])});
        break;
      case kBuilt: r.ranked.push_back(std::move(results[i])); break;
    }
  }
  r.ranked = in_search_order(std::move(r.ranked));
  r.unbuilt = in_search_order(std::move(r.unbuilt));
  return r;
}
}  // namespace

namespace {
// A candidate at a ZeRO sharding: its layout and what its estimate found.
struct ShardedFit {
  int code = 0;  // placement(code)
  Layout layout;
  LayoutEstimate estimate;
  double compute_s = 0, price = 0;
  int gpus = 0;
};

// An all-reduce candidate at each placement beyond its own that `space` allows (sharding over
// two or more workers), laid out (the policies size stages with the state left on the GPUs)
// and estimated: the fastest that fits in search_order (which keeps the earlier placement on
// a tie), or none. `stashes_offloaded_headroom`: its own layout's
// (LayoutEstimate::headroom_stashes_offloaded_bytes).
std::optional<ShardedFit> fastest_fitting_sharding(const model::Cluster& cluster, const model::Network& network,
                                                   const CostModel& cost, const CostModel* gpus_only,
                                                   const std::vector<model::Device>& devices, const PlanOptions& o,
                                                   const SearchSpace& space, bool shardable, double stashes_offloaded_headroom) {
  if (o.sync.value_or(SyncKind::allreduce) != SyncKind::allreduce) return std::nullopt;
  std::vector<ShardedFit> fits;
  // Offload is for memory, as sharding is: a sharding that fits on the GPUs is not tried again
  // with its optimizer offloaded, nor a placement that fits with its stashes offloaded (which
  // would add copies, and the host's step, to the same layout's work). Stashes leave only
  // where the schedule runs other passes between a forward and its backward.
  std::set<std::tuple<int, bool, ZeroShares>> fit_on_gpus;  // the shardings that fit without offload
  const auto key = [](const Sharding& z) { return std::tuple{z.stage, z.reshard_after_forward, z.shares}; };
  // Shards by memory only where the devices' memories differ (else they are the equal ones).
  std::set<double> memories;
  for (const model::Device& d : devices) memories.insert(cost.memory_capacity_bytes(d.id));
  // Placements laid out that overflow (the candidate's own among them), by how their stashes
  // offloaded would fare with the same cuts.
  std::map<int, double> offloaded_headroom{{placement_code(o), stashes_offloaded_headroom}};
  for (int code = placement_code(o) + 1; code < kPlacementCount; ++code) {
    const Placement p = placement(code);
    if ((p.zero.stage > 0 && (!space.zero || !shardable)) || ((p.offload || p.activations) && !space.offload)) continue;
    if (p.zero.shares == ZeroShares::memory && (p.zero.stage == 0 || !space.zero || memories.size() < 2)) continue;
    if (p.offload && fit_on_gpus.count(key(p.zero))) continue;
    if (p.activations) {  // where the same placement was laid out, overflows, and its stashes offloaded might fit
      const auto twin = offloaded_headroom.find(code - kStatePlacements);
      if (twin == offloaded_headroom.end() || twin->second < 0) continue;
    }
    try {
      ShardedFit f;
      f.code = code;
      f.layout = make_layout(cluster, network, with_placement(o, code), cost);
      if (p.activations && !stashes_leave(f.layout)) continue;
      f.estimate = estimate_layout(network, f.layout, cost, {.time_only_what_fits = true});
      if (!p.activations && f.estimate.headroom_bytes < 0) offloaded_headroom[code] = f.estimate.headroom_stashes_offloaded_bytes;
      if (f.estimate.headroom_bytes < 0 || (p.activations && f.estimate.headroom_with_copies_bytes < 0) ||
          f.estimate.host_headroom_bytes < 0) {
        continue;
      }
      if (!p.offload && !p.activations) fit_on_gpus.insert(key(p.zero));
      f.compute_s = gpus_only_time_s(network, f.layout, cost, f.estimate.iteration_time_s, gpus_only);
      const std::set<int> used = layout_gpus(f.layout);
      f.price = layout_price(cluster, devices, used);
      f.gpus = static_cast<int>(used.size());
      fits.push_back(std::move(f));
    } catch (const Error&) {  // refused sharded (workers cut unlike): not a choice
    }
  }
  if (fits.empty()) return std::nullopt;
  const size_t best = search_order(fits.size(), [&](size_t i) {
                        const ShardedFit& f = fits[i];
                        return RankKey{f.estimate.iteration_time_s, f.compute_s < f.estimate.iteration_time_s, f.price,
                                       f.gpus, f.compute_s};
                      }).front();
  return std::move(fits[best]);
}
}  // namespace

SearchResult search_plans(const model::Cluster& cluster, const model::Network& network, int global_batch,
                          const SearchSpace& space, const PlanOptions& base, const CostModel& cost, int threads,
                          int keep, const std::function<void(int, int)>& on_progress, const SearchSpread& spread) {
  const auto started = std::chrono::steady_clock::now();
  require_precision_supported(cluster, base.precision);  // every candidate would be refused for it
  // Each candidate's ZeRO sharding may change when it is scored (SearchSpace::zero).
  std::vector<PlanOptions> candidates = search_candidates(cluster, network, global_batch, space, base, cost);
  const int total = static_cast<int>(candidates.size());
  // 1. Every candidate's layout and its estimate, without a plan.
  Scores scores(candidates.size());
  auto& [state, time_s, price, workers, tightest, headroom, compute_s, gpus, zero, why] = scores;
  // The GPUs' own time of an input-bound layout, whose estimate is its loader's floor.
  const std::optional<CostModel> gpus_only =
      cluster.input.given ? std::optional<CostModel>(cost.without_input()) : std::nullopt;
  std::vector<Layout> layouts(candidates.size());
  const std::vector<model::Device> devices = cluster.devices();
  if (spread.size < 1 || spread.rank < 0 || spread.rank >= spread.size || (spread.size > 1 && !spread.all_gather)) {
    throw Error("search_plans: process " + std::to_string(spread.rank) + " of " + std::to_string(spread.size));
  }
  const auto size = static_cast<size_t>(spread.size), rank = static_cast<size_t>(spread.rank);
  // Candidates that differ only in their parameter-server sync (ps, or wsp and its staleness)
  // have one layout: a group is laid out once. Process `rank` takes groups rank, rank + size, ...
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> group_of(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (i > 0 && same_layout(candidates[i - 1], candidates[i])) {
      groups.back().push_back(i);
    } else {
      groups.push_back({i});
    }
    group_of[i] = groups.size() - 1;
  }
  std::vector<size_t> my_groups;
  for (size_t g = rank; g < groups.size(); g += size) my_groups.push_back(g);
  // An over-memory all-reduce candidate of two or more workers, at the fastest sharding that fits.
  const auto shard_to_fit = [&](size_t at, double stashes_offloaded_headroom) {
    if (!space.zero && !space.offload) return;
    std::optional<ShardedFit> best = fastest_fitting_sharding(cluster, network, cost, gpus_only ? &*gpus_only : nullptr,
                                                              devices, candidates[at], space, workers[at] >= 2,
                                                              stashes_offloaded_headroom);
    if (!best) return;
    zero[at] = best->code;
    time_s[at] = best->estimate.iteration_time_s;
    compute_s[at] = best->compute_s;
    price[at] = best->price;
    gpus[at] = best->gpus;
    headroom[at] = best->estimate.headroom_bytes;
    tightest[at] = best->estimate.tightest_device;
    workers[at] = static_cast<double>(best->layout.workers.size());
    layouts[at] = std::move(best->layout);
    state[at] = kScored;
  };
  in_parallel(static_cast<int>(my_groups.size()), threads, [&](int k) {
    const std::vector<size_t>& group = groups[my_groups[static_cast<size_t>(k)]];
    Layout laid_out;
    bool refused = false;
    try {
      laid_out = make_layout(cluster, network, candidates[group.front()], cost);
    } catch (const Error& e) {
      refused = true;
      for (const size_t at : group) note_refusal(e, &why[at]);
    }
    for (const size_t at : group) {
      state[at] = kRefused;
      if (refused) continue;
      workers[at] = static_cast<double>(laid_out.workers.size());
      try {
        layouts[at] = with_sync_of(laid_out, candidates[at]);
        const LayoutEstimate e = estimate_layout(network, layouts[at], cost);
        time_s[at] = e.iteration_time_s;
        compute_s[at] = gpus_only_time_s(network, layouts[at], cost, e.iteration_time_s, gpus_only ? &*gpus_only : nullptr);
        const std::set<int> used = layout_gpus(layouts[at]);
        price[at] = layout_price(cluster, devices, used);
        gpus[at] = static_cast<double>(used.size());
        headroom[at] = e.headroom_bytes;
        tightest[at] = e.tightest_device;
        state[at] = e.headroom_bytes < 0 ? kScreened : kScored;  // a lower bound of memory: it overflows
        if (state[at] == kScreened) shard_to_fit(at, e.headroom_stashes_offloaded_bytes);
      } catch (const Error& e) {
        state[at] = kRefused;
        note_refusal(e, &why[at]);
      }
      if (state[at] != kScored) layouts[at] = Layout{};
    }
  }, on_progress, 0, static_cast<int>(my_groups.size()));
  if (size > 1) share_scores(scores, groups, spread);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (zero[i] > 0) candidates[i] = with_placement(candidates[i], static_cast<int>(zero[i]));
  }

  // 2. Plans for the best of every family by that estimate, until each has `keep` that fit
  //    (all of them with keep 0): a plan's memory may overflow by the buffers the estimate
  //    leaves out, and then the next is built.
  std::map<std::string, std::vector<int>> families;  // family -> scored candidates, fastest first
  for (int i = 0; i < total; ++i) {
    if (state[static_cast<size_t>(i)] != kScored) continue;
    for (const std::string& f : candidate_families(candidates[static_cast<size_t>(i)])) families[f].push_back(i);
  }
  for (auto& [name, members] : families) {
    const std::vector<int> scored = members;
    const std::vector<size_t> order =
        search_order(scored.size(), [&](size_t k) { return scores.key(static_cast<size_t>(scored[k])); });
    for (size_t k = 0; k < order.size(); ++k) members[k] = scored[order[k]];
  }
  std::vector<Candidate> results(candidates.size());
  const size_t wanted = keep > 0 ? static_cast<size_t>(keep) : candidates.size();
  for (;;) {
    std::set<int> build;
    for (const auto& [name, members] : families) {
      size_t fitting = 0;
      for (const int i : members) {
        if (fitting >= wanted) break;
        const char st = state[static_cast<size_t>(i)];
        if (st == kScored) build.insert(i);
        if (st == kScored || st == kBuilt) ++fitting;  // a scored one counts as fitting until built
      }
    }
    if (build.empty()) break;
    const std::vector<int> batch(build.begin(), build.end());
    in_parallel(static_cast<int>(batch.size()), threads, [&](int b) {
      const auto at = static_cast<size_t>(batch[static_cast<size_t>(b)]);
      // Another process scored it: lay it out again (the policies are deterministic).
      bool ok = true;
      try {
        if (group_of[at] % size != rank) layouts[at] = make_layout(cluster, network, candidates[at], cost);
      } catch (const Error& e) {
        ok = false;
        note_refusal(e, &why[at]);
      }
      ok = ok && evaluate_layout(cluster, network, candidates[at], layouts[at], cost, &results[at], &why[at]);
      state[at] = !ok ? kRefused : results[at].headroom_bytes < 0 ? kOverflows : kBuilt;
      layouts[at] = Layout{};
    }, {}, 0, 0);
  }

  SearchResult r = collect(cluster, network, cost, candidates, scores, results);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

}  // namespace hetflow::partition
