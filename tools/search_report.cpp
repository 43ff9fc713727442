#include "tools/search_report.hpp"

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <vector>

#include "model/units.hpp"
#include "tools/dropped_report.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;
using search::PlanRow;

std::string percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return s.str();
}

// A figure in the objective's unit: "24.7 s", or "$0.0311" per iteration.
std::string objective_text(double value, bool by_cost) {
  if (!by_cost) return u::human_time_s(value);
  std::ostringstream s;
  s << "$" << std::setprecision(3) << value;
  return s.str();
}

// The first `shown` rows (all by default) as a table.
void print_rows(std::ostream& out, const std::vector<PlanRow>& all, bool named, size_t shown = SIZE_MAX) {
  const std::vector<PlanRow> rows(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(shown, all.size())));
  size_t width = 4;
  for (const PlanRow& r : rows) width = std::max(width, (named ? r.name + ": " : std::string()).size() + r.candidate.summary.size());
  out << "  " << std::left << std::setw(static_cast<int>(width) + 6) << (named ? "baseline" : "rank plan") << std::right
      << std::setw(11) << "estimate" << std::setw(11) << "simulated" << std::setw(11) << "samples/s" << std::setw(8) << "MFU"
      << std::setw(11) << "headroom" << std::setw(8) << "bubble" << std::setw(10) << "exposed" << "  busiest device\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const PlanRow& r = rows[i];
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
        << std::setw(11) << u::human_bytes(r.candidate.headroom_bytes) << std::setw(8) << std::setprecision(3)
        << (r.simulated ? r.bubble : r.candidate.estimate.bubble_fraction) << std::setw(10)
        << (r.simulated ? u::human_time_s(r.exposed_comm_s) : std::string("-")) << "  " << r.candidate.slowest_device << " ("
        << u::human_time_s(r.candidate.slowest_busy_s) << ")"
        << (r.candidate.input_bound
                ? "  input-bound (GPUs alone " + u::human_time_s(r.candidate.estimate.compute_iteration_time_s) + ")"
                : "")
        << (r.note.empty() ? "" : "  " + r.note) << "\n";
    out.unsetf(std::ios::fixed);
  }
}

// How a walk ended, as a clause: "stopped at the next estimate, 24.8 s, above the best simulated, 24.7 s".
std::string stop_text(const search::Walk& w, const search::Request& request) {
  switch (w.stop) {
    case search::Stop::estimate_above_best:
      return "stopped at the next estimate, " + objective_text(w.next_estimate, request.by_cost) +
             ", above the best simulated, " + objective_text(w.best, request.by_cost);
    case search::Stop::exhausted: return "every candidate that fits simulated";
    case search::Stop::budget:
      return "stopped when --search-time " + u::human_time_s(request.budget_s) +
             " was spent: candidates estimated below the best were left unsimulated";
    case search::Stop::not_simulating: break;
  }
  return "none simulated";
}

// "dropped: 789 refused by the policies or the builder, ..." (the reasons that occurred).
std::string dropped_text(const search::Dropped& d) {
  std::string text;
  const auto add = [&](int n, const std::string& why) {
    if (n > 0) text += (text.empty() ? "" : ", ") + std::to_string(n) + " " + why;
  };
  add(d.refused, "refused by the policies or the builder");
  add(d.over_memory, "over memory (" + std::to_string(d.screened) + " by their layout's bound)");
  add(d.same_plan, "the same plan as a candidate estimated faster");
  add(d.estimate_above_best, "estimated slower than the best simulated");
  add(d.over_budget, "not reached within --search-time");
  add(d.not_completed, "whose simulation did not complete");
  add(d.estimate_only, "ranked by their estimate alone (--top 0)");
  return text.empty() ? "none" : text;
}

Json dropped_json(const search::Dropped& d) {
  return {{"refused", d.refused},       {"over_memory", d.over_memory}, {"screened", d.screened},
          {"simulated", d.simulated},   {"not_completed", d.not_completed}, {"same_plan", d.same_plan},
          {"estimate_above_best", d.estimate_above_best}, {"over_budget", d.over_budget},
          {"estimate_only", d.estimate_only}};
}

Json walk_json(const search::Walk& w) {
  Json j = {{"simulated", w.simulated}, {"stop", std::string(search::to_string(w.stop))}, {"best", w.best}};
  if (w.stop == search::Stop::estimate_above_best) j["next_estimate"] = w.next_estimate;
  return j;
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

}  // namespace

Json row_json(const PlanRow& r) {
  Json j = {{"plan", r.candidate.summary}};
  j.update(plan_options_json(r.candidate.options));
  j.update(Json{{"global_batch", r.candidate.options.global_batch},
            {"price_usd_per_hour", r.candidate.price_usd_per_hour},
            {"estimated_iteration_time_s", r.candidate.estimate.iteration_time_s},
            {"iteration_time_s", r.time_s()},
            {"simulated", r.simulated},
            {"samples_per_s", r.simulated ? r.samples_per_s : r.candidate.estimate.throughput_samples_per_s},
            {"bubble_fraction", r.simulated ? r.bubble : r.candidate.estimate.bubble_fraction},
            {"headroom_bytes", r.candidate.headroom_bytes},
            {"busiest_device", r.candidate.slowest_device},
            {"busiest_device_busy_s", r.candidate.slowest_busy_s},
            {"input_bound", r.candidate.input_bound},
            {"compute_iteration_time_s", r.candidate.estimate.compute_iteration_time_s}});
  if (r.simulated) j["mfu"] = r.mfu, j["exposed_comm_s"] = r.exposed_comm_s;
  if (!r.name.empty()) j["name"] = r.name;
  return j;
}

void print_search(std::ostream& out, const model::Network& network, const model::Cluster& cluster,
                  const search::Request& request, const search::Outcome& o, size_t dropped_shown) {
  const partition::SearchResult& s = o.scoring;
  const int estimated = s.candidates - s.refused;
  out << "searched " << network.name << " on " << cluster.name << ", global batch " << request.global_batch << ": "
      << s.candidates << " candidates, " << estimated << " estimated in " << u::human_time_s(s.wall_s) << " ("
      << static_cast<long long>(s.wall_s > 0 ? estimated / s.wall_s : 0) << " candidates/s); ";
  if (request.top > 0) {
    out << o.finalists.simulated << " plans simulated (" << request.sim_iterations
        << " iterations) in estimate order, at least the best " << request.top << ": " << stop_text(o.finalists, request)
        << "; " << o.ranked.size() << " simulated with the baselines' in " << u::human_time_s(o.wall_s) << "\n";
  } else {
    out << "none simulated (--top 0): ranked by the estimate alone\n";
  }
  out << "dropped: " << dropped_text(o.dropped) << "\n";
  print_dropped_candidates(out, o.dropped, dropped_shown);
  out << "\n";
  // The best, as many as --top asks for and at least 10; --json lists every one.
  const size_t shown = std::max<size_t>(10, static_cast<size_t>(request.top));
  print_rows(out, o.ranked, false, shown);
  if (o.ranked.size() > shown) out << "  ... and " << o.ranked.size() - shown << " more simulated, slower (--json lists them)\n";
  out << "\nbaselines (the " << (request.by_cost ? "cheapest" : "fastest") << " of each family"
      << (request.top > 0 ? ", simulated in estimate order as above):\n" : " by estimate):\n");
  std::vector<PlanRow> found;
  for (const search::Baseline& b : o.baselines) {
    if (b.found) found.push_back(b.row);
  }
  print_rows(out, found, true);
  for (const search::Baseline& b : o.baselines) {
    if (!b.found) {
      out << "  " << b.name << ": none, " << b.why_none << "\n";
    } else if (b.walk.stop == search::Stop::budget) {
      out << "  " << b.name << ": the best of " << b.walk.simulated << " simulated before --search-time was spent\n";
    }
  }
  const PlanRow& best = o.ranked.front();
  out << "\nbest: " << best.candidate.summary << ", " << u::human_time_s(best.time_s()) << " per iteration";
  if (cluster.priced()) {
    const double usd = search::score(best, true);
    out << ", " << std::fixed << std::setprecision(2) << best.candidate.price_usd_per_hour << " USD/h for the GPUs it uses, ";
    out.unsetf(std::ios::fixed);
    out << u::human_count(request.global_batch / (usd > 0 ? usd : 1)) << " samples per USD";
  }
  for (const search::Baseline& b : o.baselines) {
    if (!b.found) continue;
    const double mine = search::score(b.row, request.by_cost), ours = search::score(best, request.by_cost);
    if (b.row.fingerprint == best.fingerprint) {
      out << "; the same plan as " << b.name;
    } else if (mine > 0 && ours > 0) {
      out << "; " << std::fixed << std::setprecision(2) << mine / ours
          << (request.by_cost ? "x the samples per dollar of " : "x as fast as ") << b.name;
      out.unsetf(std::ios::fixed);
    }
  }
  out << "\n";
}

Json search_json(const search::Request& request, const search::Outcome& o) {
  const partition::SearchResult& s = o.scoring;
  Json j;
  j["best"] = row_json(o.ranked.front());
  j["ranked"] = Json::array();
  for (const PlanRow& r : o.ranked) j["ranked"].push_back(row_json(r));
  j["baselines"] = Json::array();
  j["dropped_baselines"] = Json::array();
  for (const search::Baseline& b : o.baselines) {
    if (b.found) {
      Json row = row_json(b.row);
      if (request.top > 0) row["walk"] = walk_json(b.walk);
      j["baselines"].push_back(row);
    } else {
      j["dropped_baselines"].push_back({{"baseline", b.name}, {"why", b.why_none}});
    }
  }
  if (request.top > 0) j["finalists"] = walk_json(o.finalists);
  j["dropped"] = dropped_json(o.dropped);
  j["dropped_candidates"] = dropped_candidates_json(o.dropped);
  j["candidates"] = s.candidates;
  j["candidates_evaluated"] = s.candidates - s.refused;
  j["pruned"] = s.pruned;
  j["refused"] = s.refused;
  j["over_memory"] = s.over_memory;
  j["screened"] = s.screened;
  j["plans_built"] = s.candidates - s.refused - s.pruned - s.screened;
  j["search_wall_s"] = s.wall_s;  // scoring and building
  return j;
}

void print_comparison(std::ostream& out, const model::Network& network, const search::Request& request,
                      const search::Comparison& c, double tokens) {
  const auto& entries = c.entries;
  out << "compared " << entries.size() << " clusters for " << network.name << ", global batch " << request.global_batch
      << ", to train " << u::human_count(tokens) << " tokens (" << network.tokens_per_sample
      << " per sample), each with its best plan (" << (request.by_cost ? "cheapest" : "fastest") << ", simulated):\n\n";
  size_t width = 7;
  for (const search::ClusterEntry& e : entries) width = std::max(width, e.cluster.name.size());
  out << "  rank " << std::left << std::setw(static_cast<int>(width)) << "cluster" << std::right << std::setw(6) << "GPUs"
      << std::setw(10) << "USD/h" << std::setw(11) << "iteration" << std::setw(12) << "tokens/s" << std::setw(12)
      << "train time" << std::setw(13) << "train cost" << "  best plan\n";
  for (size_t rank = 0; rank < c.by_time.size(); ++rank) {
    const search::ClusterEntry& e = entries[c.by_time[rank]];
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
  out << "\nfastest: " << entries[c.by_time.front()].cluster.name;
  if (c.priced) {
    out << "; cheapest: " << entries[c.by_cost.front()].cluster.name << " (by cost:";
    for (const size_t i : c.by_cost) out << " " << entries[i].cluster.name;
    out << ")";
  }
  out << "\ntrain time = tokens / (global batch x tokens per sample / iteration time); train cost = train time x the "
         "hourly price of the GPUs the plan uses\n";
}

Json comparison_json(const search::Comparison& c, double tokens) {
  Json j;
  j["tokens"] = tokens;
  j["clusters"] = Json::array();
  for (const size_t i : c.by_time) {
    const search::ClusterEntry& e = c.entries[i];
    Json row = {{"cluster", e.cluster.name}, {"gpus", e.cluster.device_count()}, {"best", row_json(e.best)},
                {"tokens_per_s", e.tokens_per_s}, {"train_time_s", e.train_s}};
    if (e.cluster.priced()) {
      row["price_usd_per_hour"] = e.best.candidate.price_usd_per_hour;
      row["train_cost_usd"] = e.train_usd;
    }
    j["clusters"].push_back(row);
  }
  j["by_time"] = Json::array();
  for (const size_t i : c.by_time) j["by_time"].push_back(c.entries[i].cluster.name);
  if (c.priced) {
    j["by_cost"] = Json::array();
    for (const size_t i : c.by_cost) j["by_cost"].push_back(c.entries[i].cluster.name);
  }
  return j;
}

}  // namespace hetflow::tools
