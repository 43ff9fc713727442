#include "search/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "model/calibration.hpp"
#include "model/error.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "traces/metrics.hpp"

namespace hetflow::search {

namespace {

using Clock = std::chrono::steady_clock;

// What a plan does, whatever its options were called: its fingerprint without the policy's
// name and the recomputation setting (which shows in the tasks and memory where it acts).
std::string work_of(partition::Plan plan) {
  plan.layout.policy.clear();
  plan.layout.recompute = partition::Recompute::none;
  return partition::plan_fingerprint(plan);
}

// A baseline family: its name and which candidates belong to it.
struct Family {
  std::string name;
  std::string policy;  // the policy --policies must include for it to be searched
  std::function<bool(const partition::PlanOptions&)> member;
};

std::vector<Family> families() {
  const auto allreduce = [](const partition::PlanOptions& o) { return o.sync == partition::SyncKind::allreduce; };
  // Megatron and PyTorch DDP synchronise by all-reduce.
  std::vector<Family> out = {
      {"uniform (Megatron)", "uniform", [=](const partition::PlanOptions& o) { return o.policy == "uniform" && allreduce(o); }},
      {"data parallel", "uniform", [=](const partition::PlanOptions& o) {
         return o.policy == "uniform" && o.tensor == 1 && o.pipeline == 1 && o.context == 1 && allreduce(o);
       }}};
  for (const char* p : {"hetpipe-np", "hetpipe-ed", "hetpipe-hd"}) {
    out.push_back({p, p, [p](const partition::PlanOptions& o) { return o.policy == p; }});
  }
  return out;
}

// A candidate on its way through the walks.
struct Entry {
  enum State { pending, built, refused, over_memory };
  partition::PlanOptions options;
  std::string summary;
  double score = 0;  // its estimate in the objective's unit
  double time_s = 0;  // its estimated iteration time
  partition::RankKey key;  // what orders it (partition::search_order), the score its objective's
  State state = pending;
  partition::Rejected why;         // refused or over memory: why
  partition::Candidate candidate;  // built
  std::string fingerprint;         // built
  std::optional<partition::Plan> plan;  // built, until simulated: the plan the simulation runs
  bool used = false;               // a walk simulated it (or took its plan's result)
  bool duplicate = false;          // a walk met its plan before, under another candidate
};

// The walks over one cluster's candidates, sharing their simulations.
class Walker {
 public:
  Walker(const model::Cluster& cluster, const model::Network& network, const Request& request,
         const partition::CostModel& cost, const model::Calibration& calibration, Clock::time_point started)
      : cluster_(cluster), network_(network), request_(request), cost_(cost), calibration_(calibration),
        started_(started) {}

  // The candidates the scoring kept, built or not, in estimate order (by the objective).
  void add(const partition::SearchResult& scoring) {
    for (const partition::Candidate& c : scoring.ranked) {
      Entry e;
      e.options = c.options;
      e.summary = c.summary;
      e.time_s = c.estimate.iteration_time_s;
      e.score = c.estimate.iteration_time_s * (request_.by_cost ? c.price_usd_per_hour / 3600 : 1);
      e.key = partition::rank_key(c);
      e.key.score = e.score;
      e.candidate = c;
      e.state = Entry::pending;  // its plan for the simulation is built when a walk reaches it
      entries_.push_back(std::move(e));
      prebuilt_.push_back(true);
    }
    for (const partition::Scored& s : scoring.unbuilt) {
      Entry e;
      e.options = s.options;
      e.summary = s.summary;
      e.time_s = s.iteration_time_s;
      e.score = s.iteration_time_s * (request_.by_cost ? s.price_usd_per_hour / 3600 : 1);
      e.key = partition::rank_key(s);
      e.key.score = e.score;
      entries_.push_back(std::move(e));
      prebuilt_.push_back(false);
    }
    order_ = partition::search_order(entries_.size(), [&](size_t i) { return entries_[i].key; });
  }

  // Walks the candidates `member` admits in estimate order: at least `at_least` simulated,
  // then on until the next estimate exceeds the best simulated; rows gets the rows it simulated.
  Walk walk(const std::function<bool(const partition::PlanOptions&)>& member, int at_least, std::vector<PlanRow>* rows) {
    Walk w;
    std::set<std::string> seen;
    double best = std::numeric_limits<double>::infinity();
    size_t k = 0;
    for (;;) {
      // A round: up to one candidate per process.
      std::vector<size_t> round;
      bool stopped = false;
      for (; k < order_.size() && round.size() < static_cast<size_t>(request_.spread.size); ++k) {
        Entry& e = entries_[order_[k]];
        if (!member(e.options)) continue;
        if (w.simulated + static_cast<int>(round.size()) >= at_least && e.score > best) {
          w.stop = Stop::estimate_above_best, w.next_estimate = e.score, stopped = true;
          break;
        }
        if (!build(order_[k])) continue;
        bool again = seen.count(e.fingerprint) > 0;
        for (const size_t r : round) again = again || entries_[r].fingerprint == e.fingerprint;
        if (again) {
          e.duplicate = !e.used;
          e.plan.reset();
          continue;
        }
        if (over_budget_ && simulations_ > 0) {
          w.stop = Stop::budget, stopped = true;
          break;
        }
        round.push_back(order_[k]);
      }
      if (round.empty()) {
        if (!stopped) w.stop = Stop::exhausted;
        break;
      }
      simulate(round);
      // In estimate order, as one process would: a candidate after the stop is not counted.
      for (size_t j = 0; j < round.size(); ++j) {
        Entry& e = entries_[round[j]];
        if (j > 0 && w.simulated >= at_least && e.score > best) {
          for (size_t later = j; later < round.size(); ++later) forget(round[later]);
          w.stop = Stop::estimate_above_best, w.next_estimate = e.score, stopped = true;
          k = order_.size();
          break;
        }
        e.used = true;
        e.duplicate = false;
        seen.insert(e.fingerprint);
        ++w.simulated;
        const PlanRow& row = results_.at(e.fingerprint);
        PlanRow mine = row;
        mine.candidate = e.candidate;
        if (row.simulated) best = std::min(best, score(mine, request_.by_cost));
        rows->push_back(std::move(mine));
      }
      if (stopped) break;
    }
    w.best = std::isfinite(best) ? best : 0;
    return w;
  }

  // The first candidate `member` admits that builds and fits, unsimulated (top 0).
  std::optional<PlanRow> best_estimate(const std::function<bool(const partition::PlanOptions&)>& member) {
    for (const size_t i : order_) {
      if (!member(entries_[i].options) || !build(i)) continue;
      PlanRow row;
      row.candidate = entries_[i].candidate;
      row.fingerprint = entries_[i].fingerprint;
      entries_[i].plan.reset();
      return row;
    }
    return std::nullopt;
  }

  // Where the candidates that reached the walks went (scoring's refusals are the caller's):
  // each simulated plan counts once, for the first candidate by estimate that built it.
  void count(Dropped& d, double best) const {
    std::map<std::string, std::string> first;  // fingerprint -> the first candidate by estimate that simulated it
    for (const size_t i : order_) {
      const Entry& e = entries_[i];
      if (e.used && e.state == Entry::built) first.emplace(e.fingerprint, e.summary);
    }
    std::set<std::string> counted;
    for (const size_t i : order_) {
      const Entry& e = entries_[i];
      const auto drop = [&](DropReason reason, int& n) {
        ++n;
        DroppedCandidate c{reason, e.why, e.time_s, ""};
        c.detail.options = e.options;
        c.detail.summary = e.summary;
        if (reason == DropReason::same_plan && first.count(e.fingerprint)) c.same_as = first.at(e.fingerprint);
        d.candidates.push_back(std::move(c));
      };
      if (e.state == Entry::refused) {
        drop(DropReason::refused, d.refused);
      } else if (e.state == Entry::over_memory) {
        drop(DropReason::over_memory, d.over_memory);
      } else if (e.duplicate || (e.used && counted.count(e.fingerprint))) {
        drop(DropReason::same_plan, d.same_plan);
      } else if (e.used) {
        counted.insert(e.fingerprint);
        if (results_.at(e.fingerprint).simulated) {
          ++d.simulated;
        } else {
          drop(DropReason::not_completed, d.not_completed);
        }
      } else if (request_.top == 0) {
        drop(DropReason::estimate_only, d.estimate_only);
      } else if (e.score > best) {
        drop(DropReason::estimate_above_best, d.estimate_above_best);
      } else {
        drop(DropReason::over_budget, d.over_budget);
      }
    }
  }

 private:
  // Builds an entry's plan (and, for one the scoring left unbuilt, its candidate): false when
  // it is refused or overflows a device's memory.
  bool build(size_t i) {
    Entry& e = entries_[i];
    if (e.state == Entry::built) return true;
    if (e.state != Entry::pending) return false;
    if (!prebuilt_[i]) {
      if (!partition::evaluate_candidate(cluster_, network_, e.options, cost_, &e.candidate, &e.why)) {
        e.state = Entry::refused;
        return false;
      }
      e.time_s = e.candidate.estimate.iteration_time_s;
      if (e.candidate.headroom_bytes < 0) {
        e.state = Entry::over_memory;
        e.why.over_memory = true;
        e.why.iteration_time_s = e.time_s;
        e.why.device = e.candidate.tightest_device;
        e.why.over_bytes = -e.candidate.headroom_bytes;
        return false;
      }
    }
    partition::PlanOptions o = e.options;
    o.iterations = std::max(request_.sim_iterations, partition::estimated_iterations(o));  // WSP's steady state
    try {
      e.plan = build_candidate_plan(cluster_, network_, o, cost_);
    } catch (const Error& error) {
      e.state = Entry::refused;
      partition::note_refusal(error, &e.why);
      return false;
    }
    e.fingerprint = work_of(*e.plan);
    e.state = Entry::built;
    return true;
  }

  // Simulates the round's plans that have no result yet, shared out over the processes.
  void simulate(const std::vector<size_t>& round) {
    std::vector<size_t> fresh;
    for (const size_t i : round) {
      if (!results_.count(entries_[i].fingerprint)) fresh.push_back(i);
    }
    if (fresh.empty()) return;
    const auto size = static_cast<size_t>(request_.spread.size), rank = static_cast<size_t>(request_.spread.rank);
    std::vector<double> mine;
    for (size_t j = rank; j < fresh.size(); j += size) {
      const PlanRow r = simulate_one(entries_[fresh[j]]);
      mine.insert(mine.end(), {r.simulated ? 1.0 : 0.0, r.simulated_s, r.samples_per_s, r.mfu, r.bubble, r.exposed_comm_s});
    }
    ++simulations_;
    const bool late = std::chrono::duration<double>(Clock::now() - started_).count() > request_.budget_s;
    mine.push_back(late ? 1.0 : 0.0);
    const std::vector<double> all = size > 1 ? request_.spread.all_gather(mine) : mine;
    // Every process's values, in rank order: its simulations' six, then its clock's verdict.
    size_t next = 0;
    over_budget_ = false;
    for (size_t p = 0; p < size; ++p) {
      for (size_t j = p; j < fresh.size(); j += size, next += 6) {
        PlanRow r;
        r.simulated = all.at(next) != 0;
        r.simulated_s = all[next + 1], r.samples_per_s = all[next + 2], r.mfu = all[next + 3];
        r.bubble = all[next + 4], r.exposed_comm_s = all[next + 5];
        r.note = r.simulated ? "" : "simulation did not complete";
        r.fingerprint = entries_[fresh[j]].fingerprint;
        results_[r.fingerprint] = r;
      }
      over_budget_ = over_budget_ || all.at(next++) != 0;
    }
    for (const size_t i : fresh) entries_[i].plan.reset();
  }

  PlanRow simulate_one(const Entry& e) {
    sim::SimOptions options;
    options.calibration = calibration_;
    if (request_.on_simulation) {
      SimulationProgress p;
      p.index = ++simulations_started_;
      p.plan = e.candidate.summary;
      p.estimate = e.score;
      p.best = best_so_far();
      request_.on_simulation(p);
      options.on_progress = [this, p](const sim::Progress& s) mutable {
        p.simulation = s;
        request_.on_simulation(p);
      };
    }
    const sim::SimResult r = sim::simulate(*e.plan, options);
    PlanRow row;
    if (!r.completed) return row;
    const traces::Metrics m = traces::compute_metrics(r.trace, *e.plan, cost_);
    row.simulated = true;
    row.simulated_s = m.iteration_time_s;
    row.samples_per_s = m.samples_per_s;
    row.mfu = m.mfu;
    row.bubble = m.bubble_fraction;
    row.exposed_comm_s = m.exposed_comm_s;
    return row;
  }

  // A result computed beyond a walk's stop (another process's share of its last round).
  void forget(size_t i) {
    const Entry& e = entries_[i];
    bool elsewhere = false;
    for (const Entry& other : entries_) elsewhere = elsewhere || (other.used && other.fingerprint == e.fingerprint);
    if (!elsewhere) results_.erase(e.fingerprint);
  }

  double best_so_far() const {
    double best = 0;
    for (const Entry& e : entries_) {
      if (!e.used) continue;
      const PlanRow& r = results_.at(e.fingerprint);
      if (!r.simulated) continue;
      PlanRow mine = r;
      mine.candidate = e.candidate;
      const double s = score(mine, request_.by_cost);
      best = best == 0 ? s : std::min(best, s);
    }
    return best;
  }

  const model::Cluster& cluster_;
  const model::Network& network_;
  const Request& request_;
  const partition::CostModel& cost_;
  const model::Calibration& calibration_;
  Clock::time_point started_;
  std::vector<Entry> entries_;
  std::vector<bool> prebuilt_;   // the scoring built it (and checked its memory)
  std::vector<size_t> order_;    // entries_ by score
  std::map<std::string, PlanRow> results_;  // by fingerprint: every simulation's figures
  int simulations_ = 0;          // rounds that simulated something
  int simulations_started_ = 0;  // simulations this process started
  bool over_budget_ = false;     // the budget was spent at the last round (by any process)
};

// Rows in the search's order: the simulated ones first, each part by its objective in
// partition::search_order, so rows the loader holds to one rate go to the cheaper, as in the
// scoring (their simulations differ in the last digits, not by anything the plans do).
std::vector<PlanRow> in_order(std::vector<PlanRow> rows, bool by_cost) {
  const auto simulated = static_cast<size_t>(
      std::stable_partition(rows.begin(), rows.end(), [](const PlanRow& r) { return r.simulated; }) - rows.begin());
  std::vector<PlanRow> out;
  out.reserve(rows.size());
  for (const auto& [from, to] : {std::pair<size_t, size_t>{0, simulated}, {simulated, rows.size()}}) {
    const std::vector<size_t> order = partition::search_order(to - from, [&](size_t i) {
      partition::RankKey k = partition::rank_key(rows[from + i].candidate);
      k.score = score(rows[from + i], by_cost);
      return k;
    });
    for (const size_t i : order) out.push_back(std::move(rows[from + i]));
  }
  return out;
}

}  // namespace

double score(const PlanRow& row, bool by_cost) {
  return by_cost ? row.time_s() * row.candidate.price_usd_per_hour / 3600 : row.time_s();
}

std::string_view to_string(Stop stop) {
  switch (stop) {
    case Stop::not_simulating: return "not simulating";
    case Stop::estimate_above_best: return "estimate above the best simulated";
    case Stop::exhausted: return "every candidate simulated";
    case Stop::budget: return "time budget spent";
  }
  return "?";
}

std::string_view to_string(DropReason reason) {
  switch (reason) {
    case DropReason::refused: return "refused";
    case DropReason::over_memory: return "over_memory";
    case DropReason::same_plan: return "same_plan";
    case DropReason::not_completed: return "not_completed";
    case DropReason::estimate_above_best: return "estimate_above_best";
    case DropReason::over_budget: return "over_budget";
    case DropReason::estimate_only: return "estimate_only";
  }
  return "?";
}

std::vector<std::string> baseline_families() {
  std::vector<std::string> names;
  for (const Family& f : families()) names.push_back(f.name);
  return names;
}

partition::Plan build_candidate_plan(const model::Cluster& cluster, const model::Network& network,
                                     const partition::PlanOptions& options, const partition::CostModel& cost) {
  partition::Plan plan =
      partition::build_plan(cluster, network, partition::make_layout(cluster, network, options, cost), cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

Outcome search_cluster(const model::Cluster& cluster, const model::Network& network, const Request& request) {
  const Clock::time_point started = Clock::now();
  const model::Calibration calibration =
      request.calibration.empty()
          ? model::Calibration{}
          : model::resolve_calibration(model::load_calibration(request.calibration), cluster, request.calibration);
  const partition::CostModel cost(cluster, network.precision, calibration);
  for (const std::string& g : request.space.groupings) {
    try {
      (void)partition::parse_groups(g, cluster);
    } catch (const InputError& e) {
      throw InputError("<command line>", 0, "--groupings", cluster.name + ": " + e.message());
    }
  }
  Outcome o;
  // Keep the best --top of each family built; the walks build the rest as they reach them.
  o.scoring = partition::search_plans(cluster, network, request.global_batch, request.space, request.base, cost,
                                      request.threads, std::max(request.top, 1), request.on_scoring, request.spread);
  const partition::SearchResult& scoring = o.scoring;
  const auto none_fits = [&] {
    return PlanError("search: none of the " + std::to_string(scoring.candidates) + " candidates fits " + cluster.name +
                     " (" + std::to_string(scoring.refused) + " refused by the policies or the builder, " +
                     std::to_string(scoring.over_memory) +
                     " over device memory): more devices, a smaller model or batch");
  };
  if (scoring.ranked.empty() && scoring.unbuilt.empty()) throw none_fits();

  Walker walker(cluster, network, request, cost, calibration, started);
  walker.add(scoring);
  const auto everyone = [](const partition::PlanOptions&) { return true; };
  std::vector<PlanRow> rows;
  if (request.top > 0) {
    o.finalists = walker.walk(everyone, request.top, &rows);
  } else if (std::optional<PlanRow> r = walker.best_estimate(everyone)) {
    rows.push_back(*r);
  }
  if (rows.empty()) throw none_fits();
  for (const Family& f : families()) {
    Baseline b;
    b.name = f.name;
    std::vector<PlanRow> mine;
    if (request.top > 0) {
      b.walk = walker.walk(f.member, request.top, &mine);
    } else if (std::optional<PlanRow> r = walker.best_estimate(f.member)) {
      mine.push_back(*r);
    }
    if (mine.empty()) {
      // Said, not left out: a baseline missing from the table reads as one never tried.
      const auto& asked = request.space.policies;
      const bool searched = asked.empty() || std::find(asked.begin(), asked.end(), f.policy) != asked.end();
      b.why_none = !searched ? "not searched: --policies leaves out " + f.policy
                   : b.walk.stop == Stop::budget ? "not simulated: the time budget was spent before its turn"
                                                 : "no candidate of it fits: each was refused by its policy or the "
                                                   "builder, or overflows a device's memory";
    } else {
      b.found = true;
      b.row = in_order(mine, request.by_cost).front();
      b.row.name = f.name;
      // The baselines' walks compete too: every plan simulated is ranked.
      rows.insert(rows.end(), mine.begin(), mine.end());
    }
    o.baselines.push_back(std::move(b));
  }
  // Each plan once, the first candidate (by estimate) that built it.
  std::set<std::string> listed;
  for (PlanRow& r : rows) {
    if (!listed.insert(r.fingerprint).second) continue;
    r.name.clear();
    o.ranked.push_back(std::move(r));
  }
  o.ranked = in_order(std::move(o.ranked), request.by_cost);
  o.dropped.refused = scoring.refused;
  o.dropped.over_memory = scoring.over_memory;
  o.dropped.screened = scoring.screened;
  for (const partition::Rejected& x : scoring.rejected) {
    o.dropped.candidates.push_back(
        DroppedCandidate{x.over_memory ? DropReason::over_memory : DropReason::refused, x, x.iteration_time_s, ""});
  }
  walker.count(o.dropped, score(o.ranked.front(), request.by_cost));
  o.wall_s = std::chrono::duration<double>(Clock::now() - started).count();
  return o;
}

}  // namespace hetflow::search
