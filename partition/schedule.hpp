#pragma once
// Pipeline schedules as data: for each pipeline rank, the order in which it runs its compute
// operations. A schedule knows nothing of devices, layers or time; the plan builder turns
// these orders into tasks. A new schedule is one new schedule_*.cpp plus one registry line.
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::partition {

// F: forward; B: backward (input and weight gradients together, or only the input gradient
// when the schedule splits backward); W: weight gradient of a split backward.
enum class OpKind { F, B, W };

struct ScheduledOp {
  OpKind kind = OpKind::F;
  int microbatch = 0;  // 0 .. m-1
  int chunk = 0;       // model chunk on this rank, 0 .. v-1 (always 0 without interleaving)
  bool operator==(const ScheduledOp&) const = default;
};

// programs[r] is pipeline rank r's compute order. With v chunks, model chunk c of rank r is
// virtual stage c * p + r of the pipeline (Megatron's interleaving).
using RankPrograms = std::vector<std::vector<ScheduledOp>>;

struct Schedule {
  std::string name;
  std::string description;
  bool interleaved = false;       // takes v > 1 virtual stages per rank
  bool splits_backward = false;   // emits W ops
  int min_chunks = 1;             // the fewest chunks per rank it takes (interleaved: 2)
  // p ranks, m micro-batches, v chunks per rank. Throws hetflow::InputError (field
  // "schedule"/"microbatches"/"virtual-stages") when the combination is not supported.
  RankPrograms (*build)(int p, int m, int v) = nullptr;
};

// Every schedule, in a stable order: gpipe, 1f1b, interleaved, 1f1b-split-w, bfs.
const std::vector<Schedule>& schedules();
// Throws InputError naming the known schedules when the name is unknown.
const Schedule& schedule_by_name(std::string_view name);

// The checks every schedule makes on its sizes: p >= 1, m >= 1, and v == 1 (or v >= min_chunks
// for an interleaved schedule). Throws InputError naming the option at fault.
void check_schedule_sizes(std::string_view schedule, int p, int m, int v, bool interleaved, int min_chunks = 2);

// Activation offload: whether forward `i` of a rank's program sends its stash to the host,
// which it does unless the rank's next op is that micro-batch's backward (a copy out and back
// would only delay it). Whether any of `programs`' forwards does.
bool stash_leaves(const std::vector<ScheduledOp>& program, size_t i);
bool any_stash_leaves(const RankPrograms& programs);

// Peak number of micro-batches whose activations rank r holds at once, per chunk summed:
// a micro-batch is held from its F until its B (or its W, when backward is split).
// Returned per rank, per chunk: peak_in_flight(programs)[r][c].
std::vector<std::vector<int>> peak_in_flight(const RankPrograms& programs, int v);

}  // namespace hetflow::partition
