// hetflow search: the best plan for a cluster and a model. Candidates are scored by the
// analytic estimate (partition/search.hpp); the best --top estimates, and the best --top of
// each baseline family (Megatron's uniform layout, pure data parallelism, each HetPipe
// policy), are re-simulated with contention; all of them are ranked by the simulated time,
// and each family's fastest is shown as its baseline.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <ostream>
#include <span>
#include <sstream>
#include <thread>

#include "model/calibration.hpp"
#include "model/error.hpp"
#include "model/io.hpp"
#include "model/units.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/search.hpp"
#include "partition/validate.hpp"
#include "exec/ranks.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "traces/metrics.hpp"

namespace hetflow::tools {
namespace {

namespace u = model::units;

// "1,2,4" -> {1, 2, 4}; "a,b" -> {"a", "b"}.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> int_list(const po::variables_map& vm, const char* name) {
  std::vector<int> out;
  if (!vm.count(name)) return out;
  for (const std::string& item : split_list(vm[name].as<std::string>())) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1 || v > 1'000'000) {
      throw InputError("<command line>", 0, std::string("--") + name,
                       "expected a comma-separated list of positive integers, found '" + item + "'");
    }
    out.push_back(v);
  }
  return out;
}

// One ranked plan as the table shows it, simulated or not.
struct Row {
  partition::Candidate candidate;
  std::string name;  // baselines: which
  bool simulated = false;
  double simulated_s = 0, samples_per_s = 0, mfu = 0, bubble = 0, exposed_comm_s = 0;
  std::string note;  // a simulation that did not complete
  std::string fingerprint;  // work_of the plan it builds
  double time_s() const { return simulated ? simulated_s : candidate.estimate.iteration_time_s; }
};

partition::Plan build(const model::Cluster& cluster, const model::Network& network, const partition::PlanOptions& o,
                      const partition::CostModel& cost) {
  partition::Plan plan = partition::build_plan(cluster, network, partition::make_layout(cluster, network, o, cost), cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

// What a plan does, whatever its options were called: its fingerprint without the policy's
// name and the recomputation setting (which shows in the tasks and memory where it acts).
std::string work_of(partition::Plan plan) {
  plan.layout.policy.clear();
  plan.layout.recompute = partition::Recompute::none;
  return partition::plan_fingerprint(plan);
}

void simulate_row(Row& row, const model::Cluster& cluster, const model::Network& network,
                  const model::Calibration& calibration, const partition::CostModel& cost, int iterations) {
  partition::PlanOptions o = row.candidate.options;
  o.iterations = std::max(iterations, partition::estimated_iterations(o));  // WSP's steady state, as estimated
  const partition::Plan plan = build(cluster, network, o, cost);
  partition::require_valid(plan);
  sim::SimOptions options;
  options.calibration = calibration;
  const sim::SimResult r = sim::simulate(plan, options);
  if (!r.completed) {
    row.note = "simulation did not complete";
    return;
  }
  const traces::Metrics m = traces::compute_metrics(r.trace, plan, cost);
  row.simulated = true;
  row.simulated_s = m.iteration_time_s;
  row.samples_per_s = m.samples_per_s;
  row.mfu = m.mfu;
  row.bubble = m.bubble_fraction;
  row.exposed_comm_s = m.exposed_comm_s;
}

std::string percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return s.str();
}

void print_rows(std::ostream& out, const std::vector<Row>& rows, bool named) {
  size_t width = 4;
  for (const Row& r : rows) width = std::max(width, (named ? r.name + ": " : std::string()).size() + r.candidate.summary.size());
  out << "  " << std::left << std::setw(static_cast<int>(width) + 6) << (named ? "baseline" : "rank plan") << std::right
      << std::setw(11) << "estimate" << std::setw(11) << "simulated" << std::setw(11) << "samples/s" << std::setw(8) << "MFU"
      << std::setw(11) << "headroom" << std::setw(8) << "bubble" << std::setw(10) << "exposed" << "  busiest device\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::ostringstream label;
    if (named) {
      label << r.name << ": " << r.candidate.summary;
    } else {
      label << std::setw(4) << i + 1 << " " << r.candidate.summary;
    }
    const double samples = r.simulated ? r.samples_per_s : r.candidate.estimate.throughput_samples_per_s;
    out << "  " << std::left << std::setw(static_cast<int>(width) + 6) << label.str() << std::right << std::setw(11)
        << u::human_time_s(r.candidate.estimate.iteration_time_s) << std::setw(11)
        << (r.simulated ? u::human_time_s(r.simulated_s) : std::string("-")) << std::setw(11) << std::fixed
        << std::setprecision(1) << samples << std::setw(8) << (r.simulated ? percent(r.mfu) : std::string("-"))
        << std::setw(11)
        << u::human_bytes(r.candidate.headroom_bytes) << std::setw(8) << std::setprecision(3)
        << (r.simulated ? r.bubble : r.candidate.estimate.bubble_fraction) << std::setw(10)
        << (r.simulated ? u::human_time_s(r.exposed_comm_s) : std::string("-")) << "  " << r.candidate.slowest_device << " ("
        << u::human_time_s(r.candidate.slowest_busy_s) << ")" << (r.note.empty() ? "" : "  " + r.note) << "\n";
    out.unsetf(std::ios::fixed);
  }
}

Json row_json(const Row& r) {
  Json j = {{"plan", r.candidate.summary},
            {"policy", r.candidate.options.policy},
            {"tensor", r.candidate.options.tensor},
            {"pipeline", r.candidate.options.pipeline},
            {"micro_batch", r.candidate.options.micro_batch},
            {"schedule", r.candidate.options.schedule},
            {"virtual_stages", r.candidate.options.virtual_stages},
            {"global_batch", r.candidate.options.global_batch},
            {"recompute", std::string(partition::to_string(r.candidate.options.recompute))},
            {"sync", std::string(partition::to_string(r.candidate.options.sync.value_or(partition::SyncKind::allreduce)))},
            {"price_usd_per_hour", r.candidate.price_usd_per_hour},
            {"estimated_iteration_time_s", r.candidate.estimate.iteration_time_s},
            {"iteration_time_s", r.time_s()},
            {"simulated", r.simulated},
            {"samples_per_s", r.simulated ? r.samples_per_s : r.candidate.estimate.throughput_samples_per_s},
            {"bubble_fraction", r.simulated ? r.bubble : r.candidate.estimate.bubble_fraction},
            {"headroom_bytes", r.candidate.headroom_bytes},
            {"busiest_device", r.candidate.slowest_device},
            {"busiest_device_busy_s", r.candidate.slowest_busy_s}};
  if (!r.candidate.options.groups.empty()) j["groups"] = r.candidate.options.groups;
  if (r.candidate.options.sync == partition::SyncKind::wsp) j["staleness"] = r.candidate.options.staleness;
  if (r.simulated) j["mfu"] = r.mfu, j["exposed_comm_s"] = r.exposed_comm_s;
  if (!r.name.empty()) j["name"] = r.name;
  return j;
}

// Reports on a terminal only: "searching: 412 of 1,200 candidates (350/s), 2 s left".
class SearchProgress {
 public:
  SearchProgress() : enabled_(isatty(fileno(stderr)) != 0), started_(std::chrono::steady_clock::now()) {}
  ~SearchProgress() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }
  SearchProgress(const SearchProgress&) = delete;
  SearchProgress& operator=(const SearchProgress&) = delete;
  std::function<void(int, int)> reporter() {
    if (!enabled_) return {};
    return [this](int done, int total) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      if (elapsed < 1 || done >= total) return;
      const double rate = done / elapsed;
      std::fprintf(stderr, "\r\033[Ksearching: %d of %d candidates (%.0f/s), %.0f s left", done, total, rate,
                   rate > 0 ? (total - done) / rate : 0.0);
      std::fflush(stderr);
      shown_ = true;
    };
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point started_;
};

// What one search of one cluster settles.
struct SearchSettings {
  partition::SearchSpace space;
  partition::PlanOptions base;
  int global_batch = 0, top = 3, sim_iterations = 3, threads = 0;
  bool by_cost = false;  // rank by time x price (samples per dollar) instead of time
  std::string calibration;  // --calibration (a file or published:NAME), resolved for each cluster; empty: none
  partition::SearchSpread spread;  // the processes mpirun started
};

struct Outcome {
  partition::SearchResult result;
  std::vector<Row> ranked;     // finalists, best first (by the objective)
  std::vector<Row> baselines;  // the best of each baseline family
  std::vector<std::pair<std::string, std::string>> dropped;  // baseline families with no plan, and why
};

// The objective a row is ranked by: seconds per iteration, or dollars per iteration.
double score(const Row& r, bool by_cost) {
  return by_cost ? r.time_s() * r.candidate.price_usd_per_hour / 3600 : r.time_s();
}

// The processes `mpirun -np N hetflow search` started (one outside mpirun), as the search
// spreads its work over them.
partition::SearchSpread spread_over(exec::Ranks& ranks) {
  partition::SearchSpread spread;
  spread.rank = ranks.rank();
  spread.size = ranks.size();
  if (ranks.alone()) return spread;
  spread.all_gather = [&ranks](const std::vector<double>& mine) {
    static const std::atomic<bool> never{false};
    std::vector<int> among(static_cast<size_t>(ranks.size()));
    std::iota(among.begin(), among.end(), 0);
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(mine.data()), mine.size() * sizeof(double));
    std::vector<double> all;
    for (const std::vector<std::byte>& part : ranks.exchange(among, bytes, never)) {
      const size_t at = all.size();
      all.resize(at + part.size() / sizeof(double));
      std::memcpy(all.data() + at, part.data(), part.size());
    }
    return all;
  };
  return spread;
}

// Simulates each distinct plan of `rows` once, the plans shared out over the processes, and
// gives every row its plan's result.
void simulate_rows(std::vector<Row*> rows, const model::Cluster& cluster, const model::Network& network,
                   const model::Calibration& calibration, const partition::CostModel& cost, int iterations,
                   const partition::SearchSpread& spread) {
  std::vector<std::string> plans;  // distinct fingerprints, in first-seen order
  std::map<std::string, Row> done;
  for (Row* r : rows) {
    if (done.emplace(r->fingerprint, *r).second) plans.push_back(r->fingerprint);
  }
  std::vector<double> mine;
  for (size_t j = static_cast<size_t>(spread.rank); j < plans.size(); j += static_cast<size_t>(spread.size)) {
    Row& r = done.at(plans[j]);
    simulate_row(r, cluster, network, calibration, cost, iterations);
    mine.insert(mine.end(), {r.simulated ? 1.0 : 0.0, r.simulated_s, r.samples_per_s, r.mfu, r.bubble, r.exposed_comm_s});
  }
  if (spread.size > 1) {
    const std::vector<double> all = spread.all_gather(mine);
    size_t next = 0;
    for (size_t k = 0; k < static_cast<size_t>(spread.size); ++k) {
      for (size_t j = k; j < plans.size(); j += static_cast<size_t>(spread.size), next += 6) {
        Row& r = done.at(plans[j]);
        r.simulated = all.at(next) != 0;
        r.simulated_s = all[next + 1], r.samples_per_s = all[next + 2], r.mfu = all[next + 3];
        r.bubble = all[next + 4], r.exposed_comm_s = all[next + 5];
        r.note = r.simulated ? "" : "simulation did not complete";
      }
    }
  }
  for (Row* r : rows) {
    const Row& d = done.at(r->fingerprint);
    r->simulated = d.simulated, r->simulated_s = d.simulated_s, r->samples_per_s = d.samples_per_s;
    r->mfu = d.mfu, r->bubble = d.bubble, r->exposed_comm_s = d.exposed_comm_s, r->note = d.note;
  }
}

Outcome search_cluster(const model::Cluster& cluster, const model::Network& network, const SearchSettings& s) {
  const model::Calibration calibration =
      s.calibration.empty() ? model::Calibration{}
                            : model::resolve_calibration(model::load_calibration(s.calibration), cluster, s.calibration);
  const partition::CostModel cost(cluster, network.precision, calibration);
  for (const std::string& g : s.space.groupings) {
    try {
      (void)partition::parse_groups(g, cluster);
    } catch (const InputError& e) {
      throw InputError("<command line>", 0, "--groupings", cluster.name + ": " + e.message());
    }
  }
  const int top = s.top;
  Outcome o;
  {
    SearchProgress progress;
    // Keep what the finalists and the baselines are drawn from: the best --top of each family.
    o.result = partition::search_plans(cluster, network, s.global_batch, s.space, s.base, cost, s.threads,
                                       std::max(top, 1), progress.reporter(), s.spread);
  }
  const partition::SearchResult& result = o.result;
  if (result.ranked.empty()) {
    throw PlanError("search: none of the " + std::to_string(result.candidates) + " candidates fits " + cluster.name +
                    " (" + std::to_string(result.refused) + " refused by the policies or the builder, " +
                    std::to_string(result.over_memory) + " over device memory): more devices, a smaller model or batch");
  }
  // By cost, the estimates rank by time x the price of the devices each plan uses.
  std::vector<partition::Candidate> candidates = result.ranked;
  std::stable_sort(candidates.begin(), candidates.end(), [&](const partition::Candidate& a, const partition::Candidate& b) {
    const double x = a.estimate.iteration_time_s * (s.by_cost ? a.price_usd_per_hour : 1);
    const double y = b.estimate.iteration_time_s * (s.by_cost ? b.price_usd_per_hour : 1);
    return x < y;
  });

  // The finalists: the best --top estimates, and the best estimate of each synchronisation
  // that has none among them. The estimate leaves contention out, and that errs most for
  // parameter servers (every worker's pushes and pulls meet at a few devices, hidden from the
  // estimate under WSP's staleness), so a synchronisation whose estimates flatter it cannot
  // crowd out the others: the simulation ranks across them. Options that build the same plan
  // (a balanced layout HetPipe-ED also finds, selective recomputation of a network without
  // attention) are one finalist, the first by estimate.
  std::set<std::string> finalists;
  std::set<partition::SyncKind> represented;
  const auto sync_of = [](const partition::Candidate& c) { return c.options.sync.value_or(partition::SyncKind::allreduce); };
  const auto add_finalist = [&](const partition::Candidate& c) {
    Row r;
    r.candidate = c;
    r.fingerprint = work_of(build(cluster, network, c.options, cost));
    if (!finalists.insert(r.fingerprint).second) return;
    represented.insert(sync_of(c));
    o.ranked.push_back(std::move(r));
  };
  for (size_t i = 0; i < candidates.size() && static_cast<int>(o.ranked.size()) < std::max(top, 1); ++i) add_finalist(candidates[i]);
  if (top > 0) {
    for (const partition::Candidate& c : candidates) {
      if (!represented.count(sync_of(c))) add_finalist(c);
    }
  }
  // Each baseline family's best --top estimates, judged as the winner is.
  const auto allreduce = [](const partition::Candidate& c) { return c.options.sync == partition::SyncKind::allreduce; };
  std::vector<std::pair<std::string, std::function<bool(const partition::Candidate&)>>> families = {
      // Megatron and PyTorch DDP synchronise by all-reduce.
      {"uniform (Megatron)", [&](const partition::Candidate& c) { return c.options.policy == "uniform" && allreduce(c); }},
      {"data parallel", [&](const partition::Candidate& c) {
         return c.options.policy == "uniform" && c.options.tensor == 1 && c.options.pipeline == 1 && allreduce(c);
       }}};
  for (const char* p : {"hetpipe-np", "hetpipe-ed", "hetpipe-hd"}) {
    families.emplace_back(p, [p](const partition::Candidate& c) { return c.options.policy == p; });
  }
  std::vector<std::vector<Row>> tried(families.size());
  for (size_t f = 0; f < families.size(); ++f) {
    std::set<std::string> seen;
    for (const partition::Candidate& c : candidates) {
      if (static_cast<int>(seen.size()) >= std::max(top, 1)) break;
      if (!families[f].second(c)) continue;
      Row r;
      r.candidate = c;
      r.name = families[f].first;
      r.fingerprint = work_of(build(cluster, network, c.options, cost));
      if (seen.insert(r.fingerprint).second) tried[f].push_back(std::move(r));
    }
  }
  if (top > 0) {
    std::vector<Row*> rows;
    for (Row& r : o.ranked) rows.push_back(&r);
    for (auto& family : tried) {
      for (Row& r : family) rows.push_back(&r);
    }
    simulate_rows(rows, cluster, network, calibration, cost, s.sim_iterations, s.spread);
  }
  for (size_t f = 0; f < tried.size(); ++f) {
    auto& family = tried[f];
    if (family.empty()) {
      // Said, not left out: a baseline missing from the table reads as one never tried.
      const std::string policy = f < 2 ? "uniform" : families[f].first;
      const auto& asked = s.space.policies;
      const bool searched = asked.empty() || std::find(asked.begin(), asked.end(), policy) != asked.end();
      o.dropped.emplace_back(families[f].first,
                             searched ? "no candidate of it fits: each was refused by its policy or the builder, or "
                                        "overflows a device's memory"
                                      : "not searched: --policies leaves out " + policy);
      continue;
    }
    const auto best = std::min_element(family.begin(), family.end(), [&](const Row& a, const Row& b) {
      return score(a, s.by_cost) < score(b, s.by_cost);
    });
    o.baselines.push_back(*best);
  }
  // The baselines' finalists compete too: the estimate leaves contention out (a parameter
  // server's, above all), so the best estimates of one family can all lose to another's.
  for (const Row& b : o.baselines) {
    if (!finalists.insert(b.fingerprint).second) continue;
    Row r = b;
    r.name.clear();
    o.ranked.push_back(std::move(r));
  }
  std::stable_sort(o.ranked.begin(), o.ranked.end(), [&](const Row& a, const Row& b) {
    if (a.simulated != b.simulated) return a.simulated;
    return score(a, s.by_cost) < score(b, s.by_cost);
  });
  return o;
}

std::vector<std::string> cluster_list(const po::variables_map& vm) {
  if (!vm.count("clusters")) return {};
  std::vector<std::string> names = split_list(vm["clusters"].as<std::string>());
  if (names.size() < 2) throw InputError("<command line>", 0, "--clusters", "expected two or more comma-separated clusters");
  if (!vm["cluster"].defaulted()) throw InputError("<command line>", 0, "--clusters", "give --cluster or --clusters, not both");
  return names;
}

// A long duration the way people plan them: "41 min", "5.4 h", "2.3 days".
std::string long_duration(double s) {
  std::ostringstream out;
  out << std::setprecision(3);
  if (s < 3600) return u::human_time_s(s);
  if (s < 2 * 86400) {
    out << s / 3600 << " h";
  } else {
    out << s / 86400 << " days";
  }
  return out.str();
}

// --clusters: each cluster's best plan, and the clusters ranked by the time and the cost of
// training `tokens` tokens with it.
int compare_clusters(const std::vector<std::string>& names, const model::Network& network, const SearchSettings& s,
                     double tokens, bool json, std::ostream& out) {
  struct Entry {
    model::Cluster cluster;
    Row best;
    double tokens_per_s = 0, train_s = 0, train_usd = 0;
  };
  std::vector<Entry> entries;
  for (const std::string& name : names) {
    Entry e;
    e.cluster = model::load_cluster(name);
    if (s.by_cost && !e.cluster.priced()) {
      throw InputError(name, 0, "nodes.price", "--objective cost needs a price on every node (price: 2.1 USD/h)");
    }
    const Outcome o = search_cluster(e.cluster, network, s);
    e.best = o.ranked.front();
    const double samples_per_s = e.best.time_s() > 0 ? e.best.candidate.options.global_batch / e.best.time_s() : 0;
    e.tokens_per_s = samples_per_s * network.tokens_per_sample;
    e.train_s = e.tokens_per_s > 0 ? tokens / e.tokens_per_s : 0;
    e.train_usd = e.train_s / 3600 * e.best.candidate.price_usd_per_hour;
    entries.push_back(std::move(e));
  }
  std::vector<size_t> by_time(entries.size()), by_cost(entries.size());
  std::iota(by_time.begin(), by_time.end(), 0);
  by_cost = by_time;
  std::stable_sort(by_time.begin(), by_time.end(), [&](size_t a, size_t b) { return entries[a].train_s < entries[b].train_s; });
  const bool priced = std::all_of(entries.begin(), entries.end(), [](const Entry& e) { return e.cluster.priced(); });
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t a, size_t b) { return entries[a].train_usd < entries[b].train_usd; });
  if (json) {
    Json j;
    j["tokens"] = tokens;
    j["clusters"] = Json::array();
    for (const size_t i : by_time) {
      const Entry& e = entries[i];
      Json c = {{"cluster", e.cluster.name}, {"gpus", e.cluster.device_count()}, {"best", row_json(e.best)},
                {"tokens_per_s", e.tokens_per_s}, {"train_time_s", e.train_s}};
      if (e.cluster.priced()) {
        c["price_usd_per_hour"] = e.best.candidate.price_usd_per_hour;
        c["train_cost_usd"] = e.train_usd;
      }
      j["clusters"].push_back(c);
    }
    j["by_time"] = Json::array();
    for (const size_t i : by_time) j["by_time"].push_back(entries[i].cluster.name);
    if (priced) {
      j["by_cost"] = Json::array();
      for (const size_t i : by_cost) j["by_cost"].push_back(entries[i].cluster.name);
    }
    print_json(out, j);
    return 0;
  }
  out << "compared " << entries.size() << " clusters for " << network.name << ", global batch " << s.global_batch
      << ", to train " << u::human_count(tokens) << " tokens (" << network.tokens_per_sample
      << " per sample), each with its best plan (" << (s.by_cost ? "cheapest" : "fastest") << ", simulated):\n\n";
  size_t width = 7;
  for (const Entry& e : entries) width = std::max(width, e.cluster.name.size());
  out << "  rank " << std::left << std::setw(static_cast<int>(width)) << "cluster" << std::right << std::setw(6) << "GPUs"
      << std::setw(10) << "USD/h" << std::setw(11) << "iteration" << std::setw(12) << "tokens/s" << std::setw(12)
      << "train time" << std::setw(13) << "train cost" << "  best plan\n";
  for (size_t rank = 0; rank < by_time.size(); ++rank) {
    const Entry& e = entries[by_time[rank]];
    const bool has_price = e.cluster.priced();
    std::ostringstream price, spend;
    price << std::fixed << std::setprecision(2) << e.best.candidate.price_usd_per_hour;
    spend << std::fixed << std::setprecision(0) << e.train_usd;
    out << "  " << std::setw(4) << rank + 1 << " " << std::left << std::setw(static_cast<int>(width)) << e.cluster.name
        << std::right << std::setw(6) << e.cluster.device_count() << std::setw(10) << (has_price ? price.str() : "-")
        << std::setw(11) << u::human_time_s(e.best.time_s()) << std::setw(12) << u::human_count(e.tokens_per_s)
        << std::setw(12) << long_duration(e.train_s) << std::setw(13) << (has_price ? "$" + spend.str() : "-") << "  "
        << e.best.candidate.summary << "\n";
  }
  out << "\nfastest: " << entries[by_time.front()].cluster.name;
  if (priced) {
    out << "; cheapest: " << entries[by_cost.front()].cluster.name << " (by cost:";
    for (const size_t i : by_cost) out << " " << entries[i].cluster.name;
    out << ")";
  }
  out << "\ntrain time = tokens / (global batch x tokens per sample / iteration time); train cost = train time x the "
         "hourly price of the GPUs the plan uses\n";
  return 0;
}

}  // namespace

void search_options(po::options_description& options) {
  add_cluster_model_options(options);
  options.add_options()
      ("global-batch", po::value<int>()->required(), "samples per iteration over all virtual workers")
      ("top", po::value<int>()->default_value(3), "how many of the best estimates to re-simulate before ranking")
      ("threads", po::value<int>()->default_value(0), "threads scoring candidates (0: every core)")
      ("policies", po::value<std::string>(),
       "policies to try (default uniform,balanced,hetpipe-np,hetpipe-ed,hetpipe-hd,grouped)")
      ("tensor", po::value<std::string>(), "tensor-parallel degrees to try (default powers of 2 up to a node)")
      ("pipeline", po::value<std::string>(), "pipeline depths to try (default every divisor of the devices up to the layers)")
      ("micro-batch", po::value<std::string>(), "micro-batch sizes to try (default powers of 2 up to 32 dividing the batch)")
      ("schedules", po::value<std::string>(), "schedules to try (default 1f1b,gpipe,interleaved; bfs too on request, at 2 chunks a rank)")
      ("recompute", po::value<std::string>(), "recomputation to try (default none,selective,full)")
      ("sync", po::value<std::string>(), "synchronisation to try (default allreduce,ps; add wsp for WSP at --staleness)")
      ("staleness", po::value<int>()->default_value(1), "WSP's staleness bound D, the most your training tolerates")
      ("groupings", po::value<std::string>(),
       "policy grouped's groupings to try, separated by ';' (default: by GPU type and mixed, fastest types first)")
      ("sim-iterations", po::value<int>()->default_value(3), "iterations of each re-simulation (the first warms up)")
      ("objective", po::value<std::string>()->default_value("time"),
       "time (the fastest plan) or cost (the most samples per dollar: needs `price` on every node of the cluster)")
      ("clusters", po::value<std::string>(),
       "compare these clusters (comma-separated names or files) by the time and cost of training --tokens tokens")
      ("tokens", po::value<std::string>()->default_value("1e9"), "tokens to train, for --clusters")
      ("workspace", po::value<std::string>()->default_value("1 GiB"), "per-device memory reserved for workspace")
      ("bucket-size", po::value<std::string>()->default_value("25 MiB"), "gradient all-reduce bucket size")
      ("overlap-grad-reduce", "all-reduce candidates start each bucket as the last backward makes its gradients")
      ("calibration", po::value<std::string>(), "calibration YAML or published:NAME, for estimates and simulations")
      ("out", po::value<std::string>(), "write the best plan here (for hetflow simulate --plan / run --plan)")
      ("out-layout", po::value<std::string>(), "write the best plan's layout file here (hetflow plan --layout)");
  add_kernel_options(options);
}

int run_search(const std::vector<std::string>& args, std::ostream& to_user) {
  const auto command_started = std::chrono::steady_clock::now();
  po::options_description options("search options");
  po::variables_map vm;
  if (!parse_command_options("search", args, options, vm, to_user)) return 0;
  // Under mpirun every rank searches its share and all reach the same result; rank 0 tells.
  exec::Ranks& ranks = exec::Ranks::world();
  std::ostringstream discarded;
  std::ostream& out = ranks.rank() == 0 ? to_user : discarded;
  const bool writes = ranks.rank() == 0;
  const std::vector<std::string> compared = cluster_list(vm);
  const model::Network network = load_network_option(vm);
  SearchSettings s;
  s.global_batch = vm["global-batch"].as<int>();
  if (s.global_batch < 1) {
    throw InputError("<command line>", 0, "--global-batch",
                     "expected at least 1 sample, found " + std::to_string(s.global_batch));
  }
  s.top = int_option_in(vm, "top", 0, 1000);
  s.sim_iterations = int_option_in(vm, "sim-iterations", 1, 100);
  s.threads = int_option_in(vm, "threads", 0, 1024);
  const std::string objective = vm["objective"].as<std::string>();
  if (objective != "time" && objective != "cost") throw InputError("<command line>", 0, "--objective", "expected time or cost, found '" + objective + "'");
  s.by_cost = objective == "cost";
  if (vm.count("calibration")) s.calibration = vm["calibration"].as<std::string>();
  s.spread = spread_over(ranks);
  if (s.threads == 0 && !ranks.alone()) {
    // The cores of a node shared by its ranks (OpenMPI says how many it started here).
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int here = local != nullptr ? std::max(1, std::atoi(local)) : 1;
    s.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / here);
  }

  partition::SearchSpace& space = s.space;
  if (vm.count("policies")) space.policies = split_list(vm["policies"].as<std::string>());
  space.tensors = int_list(vm, "tensor");
  space.pipelines = int_list(vm, "pipeline");
  space.micro_batches = int_list(vm, "micro-batch");
  for (const int m : space.micro_batches) {
    if (s.global_batch % m != 0) {
      throw InputError("<command line>", 0, "--micro-batch",
                       "expected sizes that divide --global-batch " + std::to_string(s.global_batch) + ", found " +
                           std::to_string(m));
    }
  }
  if (vm.count("schedules")) space.schedules = split_list(vm["schedules"].as<std::string>());
  space.staleness = int_option_in(vm, "staleness", 0, 64);
  if (vm.count("groupings")) {
    std::stringstream in(vm["groupings"].as<std::string>());
    for (std::string g; std::getline(in, g, ';');) {
      if (g.find_first_not_of(" \t") != std::string::npos) space.groupings.push_back(g);
    }
    if (space.groupings.empty()) throw InputError("<command line>", 0, "--groupings", "expected groupings separated by ';'");
  }
  try {
    if (vm.count("recompute")) {
      for (const std::string& r : split_list(vm["recompute"].as<std::string>())) space.recomputes.push_back(partition::parse_recompute(r));
    }
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, "--recompute", e.what());
  }
  try {
    if (vm.count("sync")) {
      for (const std::string& sync : split_list(vm["sync"].as<std::string>())) space.syncs.push_back(partition::parse_sync(sync));
    }
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, "--sync", e.what());
  }
  for (const std::string& p : space.policies) {
    bool known = false;
    for (const partition::PolicyInfo& info : partition::policies()) known = known || info.name == p;
    if (!known) throw InputError("<command line>", 0, "--policies", "unknown policy '" + p + "'");
  }

  partition::PlanOptions& base = s.base;
  base.precision = network.precision;
  base.kernels = read_kernel_options(vm);
  try {
    base.workspace_bytes = u::parse_bytes(vm["workspace"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, "--workspace", e.what());
  }
  try {
    base.bucket_bytes = u::parse_bytes(vm["bucket-size"].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, "--bucket-size", e.what());
  }
  if (!(base.bucket_bytes >= 1)) {
    throw InputError("<command line>", 0, "--bucket-size", "expected a size of at least 1 B");
  }
  base.overlap_grad_reduce = vm.count("overlap-grad-reduce") > 0;
  if (!compared.empty()) {
    if (vm.count("out") || vm.count("out-layout")) {
      throw InputError("<command line>", 0, "--clusters", "writes no plan: search one cluster for --out and --out-layout");
    }
    double tokens = 0;
    try {
      tokens = u::parse_number(vm["tokens"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      throw InputError("<command line>", 0, "--tokens", e.what());
    }
    if (!(tokens > 0)) throw InputError("<command line>", 0, "--tokens", "expected a positive number of tokens");
    return compare_clusters(compared, network, s, tokens, vm.count("json") > 0, out);
  }

  const model::Cluster cluster = load_cluster_option(vm);
  if (s.by_cost && !cluster.priced()) {
    throw InputError(cluster.name, 0, "nodes.price", "--objective cost needs a price on every node (price: 2.1 USD/h)");
  }
  const partition::CostModel cost(cluster, network.precision, read_calibration_option(vm, cluster));
  const int top = s.top, sim_iterations = s.sim_iterations, global_batch = s.global_batch;

  const Outcome outcome = search_cluster(cluster, network, s);
  const partition::SearchResult& result = outcome.result;
  const std::vector<Row>& ranked = outcome.ranked;
  const std::vector<Row>& baselines = outcome.baselines;
  const Row& best = ranked.front();
  partition::PlanOptions best_options = best.candidate.options;
  const partition::Plan best_plan = build(cluster, network, best_options, cost);
  if (vm.count("out") && writes) write_file(vm["out"].as<std::string>(), partition::write_plan_json(best_plan), "--out");
  std::string layout_note;
  if (vm.count("out-layout")) {
    if (best_plan.layout.virtual_stages > 1) {
      layout_note = "not written: the layout file has no virtual stages; use the plan file";
    } else {
      if (writes) write_file(vm["out-layout"].as<std::string>(), partition::write_layout_file(best_plan.layout, cluster), "--out-layout");
    }
  }

  if (vm.count("json")) {
    Json j;
    j["best"] = row_json(best);
    j["best"]["layout"] = partition::write_layout_file(best_plan.layout, cluster);
    j["ranked"] = Json::array();
    for (const Row& r : ranked) j["ranked"].push_back(row_json(r));
    j["baselines"] = Json::array();
    for (const Row& r : baselines) j["baselines"].push_back(row_json(r));
    j["dropped_baselines"] = Json::array();
    for (const auto& [name, why] : outcome.dropped) j["dropped_baselines"].push_back({{"baseline", name}, {"why", why}});
    j["candidates"] = result.candidates;
    j["candidates_evaluated"] = result.candidates - result.refused;
    j["pruned"] = result.pruned;
    j["refused"] = result.refused;
    j["over_memory"] = result.over_memory;
    j["screened"] = result.screened;
    j["plans_built"] = result.candidates - result.refused - result.pruned - result.screened;
    j["search_wall_s"] = result.wall_s;  // scoring and building
    j["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - command_started).count();
    print_json(out, j);
    return 0;
  }
  const int built = result.candidates - result.refused - result.pruned - result.screened;
  out << "searched " << network.name << " on " << cluster.name << ", global batch " << global_batch << ": "
      << result.candidates << " candidates, " << result.refused << " refused by the policies or the builder, "
      << result.over_memory << " over memory (" << result.screened << " by their layout's bound); "
      << result.candidates - result.refused << " estimated in " << u::human_time_s(result.wall_s) << " ("
      << static_cast<long long>(result.wall_s > 0 ? (result.candidates - result.refused) / result.wall_s : 0)
      << " candidates/s), " << built << " built into plans (the best of each family)";
  if (top > 0) {
    out << "; " << ranked.size() << " plans simulated (" << sim_iterations << " iterations): the best " << top
        << " estimates, each other synchronisation's best and each baseline family's";
  } else {
    out << "; none simulated (--top 0): ranked by the estimate alone";
  }
  out << "\n\n";
  print_rows(out, ranked, false);
  out << "\nbaselines (the " << (s.by_cost ? "cheapest" : "fastest") << " of each one's best " << std::max(top, 1)
      << (top > 0 ? " estimates, simulated):\n" : " estimate):\n");
  print_rows(out, baselines, true);
  for (const auto& [name, why] : outcome.dropped) out << "  " << name << ": none, " << why << "\n";
  out << "\nbest: " << best.candidate.summary << ", " << u::human_time_s(best.time_s()) << " per iteration";
  if (cluster.priced()) {
    out << ", " << std::fixed << std::setprecision(2) << best.candidate.price_usd_per_hour << " USD/h for the GPUs it uses, ";
    out.unsetf(std::ios::fixed);
    out
        << u::human_count(global_batch / (score(best, true) > 0 ? score(best, true) : 1)) << " samples per USD";
  }
  for (const Row& b : baselines) {
    if (b.fingerprint == best.fingerprint) {
      out << "; the same plan as " << b.name;
    } else if (score(b, s.by_cost) > 0 && score(best, s.by_cost) > 0) {
      out << "; " << std::fixed << std::setprecision(2) << score(b, s.by_cost) / score(best, s.by_cost)
          << (s.by_cost ? "x the samples per dollar of " : "x as fast as ") << b.name;
      out.unsetf(std::ios::fixed);
    }
  }
  out << "\n";
  if (vm.count("out")) out << "wrote " << vm["out"].as<std::string>() << " (hetflow simulate --plan, hetflow run --plan)\n";
  if (vm.count("out-layout")) {
    out << (layout_note.empty() ? "wrote " + vm["out-layout"].as<std::string>() + " (hetflow plan --layout)" : "layout " + layout_note)
        << "\n";
  }
  return 0;
}

}  // namespace hetflow::tools
