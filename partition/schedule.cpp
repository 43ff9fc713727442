// The schedule registry and the activation-memory measure shared by every schedule.
#include "partition/schedule.hpp"

#include <algorithm>

#include "model/error.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

// Defined in schedule_*.cpp; one line each in the registry below.
void check_schedule_sizes(std::string_view schedule, int p, int m, int v, bool interleaved, int min_chunks) {
  const std::string name(schedule);
  if (p < 1) {
    throw InputError(kOptions, 0, "pipeline", "expected at least 1 pipeline rank, found " + std::to_string(p));
  }
  if (m < 1) {
    throw InputError(kOptions, 0, "microbatches", "expected at least 1 micro-batch, found " + std::to_string(m));
  }
  if (interleaved && v < min_chunks) {
    throw InputError(kOptions, 0, "virtual_stages",
                     "schedule " + name + " expects at least " + std::to_string(min_chunks) + " chunk" +
                         (min_chunks == 1 ? "" : "s") + " per rank, found " + std::to_string(v));
  }
  if (!interleaved && v != 1) {
    throw InputError(kOptions, 0, "virtual_stages",
                     "schedule " + name + " expects 1 chunk per rank, found " + std::to_string(v));
  }
}

RankPrograms build_gpipe(int p, int m, int v);
RankPrograms build_1f1b(int p, int m, int v);
RankPrograms build_interleaved(int p, int m, int v);
RankPrograms build_1f1b_split_w(int p, int m, int v);
RankPrograms build_bfs(int p, int m, int v);

const std::vector<Schedule>& schedules() {
  static const std::vector<Schedule> all = {
      {"gpipe", "GPipe: all forwards, then all backwards (Huang et al. 2019)", false, false, 1, &build_gpipe},
      {"1f1b", "1F1B / PipeDream-flush: warm-up forwards, one forward one backward, cool-down", false, false, 1,
       &build_1f1b},
      {"interleaved", "Megatron-LM interleaved 1F1B over v model chunks per rank (Narayanan et al. 2021)", true,
       false, 2, &build_interleaved},
      {"1f1b-split-w", "1F1B with backward split into input gradient B and weight gradient W (Qi et al. 2023)",
       false, true, 1, &build_1f1b_split_w},
      {"bfs", "looped breadth-first: each chunk's forwards for all micro-batches, then its backwards (Lamy-Poirier 2022)",
       true, false, 1, &build_bfs},
  };
  return all;
}

const Schedule& schedule_by_name(std::string_view name) {
  std::string known;
  for (const Schedule& s : schedules()) {
    if (s.name == name) return s;
    known += known.empty() ? "" : ", ";
    known += s.name;
  }
  throw InputError(kOptions, 0, "schedule",
                   "expected one of " + known + ", found '" + std::string(name) + "'");
}

bool stash_leaves(const std::vector<ScheduledOp>& program, size_t i) {
  const ScheduledOp& f = program[i];
  return f.kind == OpKind::F &&
         !(i + 1 < program.size() && program[i + 1] == ScheduledOp{OpKind::B, f.microbatch, f.chunk});
}

bool any_stash_leaves(const RankPrograms& programs) {
  for (const std::vector<ScheduledOp>& program : programs) {
    for (size_t i = 0; i < program.size(); ++i) {
      if (stash_leaves(program, i)) return true;
    }
  }
  return false;
}

std::vector<std::vector<int>> peak_in_flight(const RankPrograms& programs, int v) {
  if (v < 1) {
    throw InputError(kOptions, 0, "virtual_stages",
                     "expected at least 1 chunk per rank, found " + std::to_string(v));
  }
  std::vector<std::vector<int>> peak(programs.size(), std::vector<int>(v, 0));
  for (std::size_t r = 0; r < programs.size(); ++r) {
    const std::vector<ScheduledOp>& ops = programs[r];
    const bool split = std::any_of(ops.begin(), ops.end(),
                                   [](const ScheduledOp& op) { return op.kind == OpKind::W; });
    const OpKind release = split ? OpKind::W : OpKind::B;
    std::vector<int> held(v, 0);
    for (const ScheduledOp& op : ops) {
      if (op.chunk < 0 || op.chunk >= v) {
        throw PlanError("peak_in_flight: rank " + std::to_string(r) + " has an op on chunk " +
                        std::to_string(op.chunk) + ", expected 0.." + std::to_string(v - 1));
      }
      if (op.kind == OpKind::F) {
        peak[r][op.chunk] = std::max(peak[r][op.chunk], ++held[op.chunk]);
      } else if (op.kind == release) {
        --held[op.chunk];
      }
    }
  }
  return peak;
}

}  // namespace hetflow::partition
