#include "tools/dropped_report.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/units.hpp"
#include "partition/layout.hpp"
#include "tools/options.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;
using search::DropReason;
using search::DroppedCandidate;

// A refusal as the command line says it: the option a PlanOptions member stands for, its
// message's `members` as options; a layout's field as the layout's; a PlanError unnamed.
struct Refusal {
  std::string option;  // "--global-batch", "layout workers[0].stages", "" (none named)
  std::string message;
};

Refusal refusal_of(const partition::Rejected& r) {
  if (r.field.empty()) return {"", r.message};
  if (r.file != partition::kOptions) return {"layout " + r.field, r.message};
  const InputError e = as_command_line_error(InputError(r.file, 0, r.field, r.message));
  return {e.field(), e.message()};
}

// What a group of one reason says, after its count.
std::string reason_text(DropReason reason, const std::string& option) {
  switch (reason) {
    case DropReason::refused:
      return option.empty() ? "refused by the builder" : "refused on " + option;
    case DropReason::over_memory: return "over memory, the fastest estimates first";
    case DropReason::same_plan: return "the same plan as a candidate estimated faster";
    case DropReason::not_completed: return "whose simulation did not complete";
    case DropReason::estimate_above_best: return "estimated slower than the best simulated";
    case DropReason::over_budget: return "not reached within --search-time";
    case DropReason::estimate_only: return "ranked by their estimate alone (--top 0)";
  }
  return "?";
}

// One candidate's line after its plan: why, in its reason's terms.
std::string detail_text(const DroppedCandidate& c) {
  const partition::Rejected& d = c.detail;
  switch (c.reason) {
    case DropReason::refused: return refusal_of(d).message;
    case DropReason::over_memory:
      return "estimate " + u::human_time_s(c.estimate_s) + "; " + (d.device.empty() ? "a device" : d.device) +
             " over by " + u::human_bytes(d.over_bytes) + (d.screened ? " (the layout's bound)" : " (the plan's memory)");
    case DropReason::same_plan: return c.same_as.empty() ? "its plan was simulated before" : "builds the plan of " + c.same_as;
    default: return "estimate " + u::human_time_s(c.estimate_s);
  }
}

struct Group {
  DropReason reason;
  std::string option;  // refused: the option named
  std::vector<const DroppedCandidate*> members;
};

std::vector<Group> groups_of(const search::Dropped& dropped) {
  std::vector<Group> groups;
  std::map<std::pair<int, std::string>, size_t> at;
  for (const DroppedCandidate& c : dropped.candidates) {
    const std::string option = c.reason == DropReason::refused ? refusal_of(c.detail).option : "";
    const auto key = std::make_pair(static_cast<int>(c.reason), option);
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, groups.size()).first;
      groups.push_back(Group{c.reason, option, {}});
    }
    groups[it->second].members.push_back(&c);
  }
  // The reasons in their order, the refusals largest first; the over-memory fastest first
  // (the walks' are in estimate order already, the refusals in the space's).
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    if (a.reason != b.reason) return a.reason < b.reason;
    return a.members.size() > b.members.size();
  });
  for (Group& g : groups) {
    if (g.reason == DropReason::over_memory) {
      std::stable_sort(g.members.begin(), g.members.end(),
                       [](const DroppedCandidate* a, const DroppedCandidate* b) { return a->estimate_s < b->estimate_s; });
    } else if (g.reason == DropReason::refused) {
      // Each different refusal's first candidate before the ones that repeat a refusal (the
      // same one under another schedule or recomputation): the few shown say the most.
      std::map<std::string, int> seen;
      std::vector<int> rank;
      for (const DroppedCandidate* c : g.members) rank.push_back(seen[refusal_of(c->detail).message]++ == 0 ? 0 : 1);
      std::vector<size_t> order(g.members.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank[a] < rank[b]; });
      std::vector<const DroppedCandidate*> reordered;
      for (const size_t i : order) reordered.push_back(g.members[i]);
      g.members = std::move(reordered);
    }
  }
  return groups;
}

}  // namespace

void print_dropped_candidates(std::ostream& out, const search::Dropped& dropped, size_t shown) {
  if (shown == 0 || dropped.candidates.empty()) return;
  out << "dropped candidates by reason (" << shown << " of each; --dropped N shows N, --json lists every one):\n";
  for (const Group& g : groups_of(dropped)) {
    out << "  " << g.members.size() << " " << reason_text(g.reason, g.option) << ":\n";
    for (size_t i = 0; i < g.members.size() && i < shown; ++i) {
      out << "    " << g.members[i]->detail.summary << ": " << detail_text(*g.members[i]) << "\n";
    }
    if (g.members.size() > shown) out << "    and " << g.members.size() - shown << " more\n";
  }
}

Json plan_options_json(const partition::PlanOptions& o) {
  Json j = {{"policy", o.policy},
            {"tensor", o.tensor},
            {"pipeline", o.pipeline},
            {"micro_batch", o.micro_batch},
            {"schedule", o.schedule},
            {"virtual_stages", o.virtual_stages},
            {"recompute", std::string(partition::to_string(o.recompute))},
            {"sync", std::string(partition::to_string(o.sync.value_or(partition::SyncKind::allreduce)))}};
  if (!o.groups.empty()) j["groups"] = o.groups;
  if (o.context > 1) j["context"] = o.context;
  if (o.context > 1) j["context_comm"] = std::string(partition::to_string(o.context_comm));
  if (o.experts.parallel > 1) {
    j["expert_parallel"] = o.experts.parallel;
    j["expert_placement"] = o.experts_by_speed ? "speed" : o.experts.placement.empty() ? "contiguous" : "given";
  }
  if (o.sync == partition::SyncKind::wsp) j["staleness"] = o.staleness;
  return j;
}

Json dropped_candidates_json(const search::Dropped& dropped) {
  Json all = Json::array();
  for (const DroppedCandidate& c : dropped.candidates) {
    Json j = {{"plan", c.detail.summary}, {"reason", std::string(search::to_string(c.reason))}};
    j.update(plan_options_json(c.detail.options));
    if (c.estimate_s > 0) j["estimated_iteration_time_s"] = c.estimate_s;
    if (c.reason == DropReason::refused) {
      const Refusal r = refusal_of(c.detail);
      if (!r.option.empty()) j["option"] = r.option;
      j["why"] = r.message;
    } else if (c.reason == DropReason::over_memory) {
      j["device"] = c.detail.device;
      j["over_bytes"] = c.detail.over_bytes;
      j["by_layout_bound"] = c.detail.screened;
    } else if (c.reason == DropReason::same_plan) {
      j["same_plan_as"] = c.same_as;
    }
    all.push_back(std::move(j));
  }
  return all;
}

}  // namespace hetflow::tools
