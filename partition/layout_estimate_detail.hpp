#pragma once
// The parts of estimate_layout (partition/layout_estimate.cpp) in their own files: the chunks
// of each virtual worker with their operations' costs (layout_estimate_chunks.cpp), the
// communication among them costed phase by phase where concurrent flows share links, and
// one run of a worker's pipeline through its schedule (layout_estimate_pipeline.cpp).
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"
#include "partition/layout_estimate_memo.hpp"
#include "partition/link_sharing.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition::estimate_detail {

// One chunk of one virtual worker, per micro-batch.
struct Chunk {
  const std::vector<int>* devices = nullptr;  // its rank's
  int rank = 0;
  double f_s = 0, b_s = 0, w_s = 0;           // each operation, collectives included
  std::vector<double> f_compute_s, b_compute_s, w_compute_s;  // per tensor rank: compute alone
  double f_before_s = 0, b_before_s = 0;      // collectives before each pass's compute (gathers)
  double f_after_s = 0, b_after_s = 0;        // and inside it (tp_calls.hpp), timed after the compute
  double last_b_after_s = 0;                  // once a step, in its last B: the summed gains
  double to_next_s = 0;                       // its output to the next chunk
  double to_previous_s = 0;                   // its input gradient to the previous chunk
  double stash_copy_s = 0;                    // activation offload: a stash's copy either way (slowest device)
};

inline double largest(const std::vector<double>& v) {
  double most = 0;
  for (const double x : v) most = x > most ? x : most;
  return v.empty() ? 0 : most;
}

// The communication of the workers' pipelines, gathered while their chunks are made and then
// costed in phases of what runs at once: one tensor-parallel collective of chunk k (or one
// boundary transfer between chunks k and k + 1) of every virtual worker, since the replicas
// run their pipelines side by side. Within a phase every flow (a ring's edges, each tensor
// rank's slice of a boundary) shares the links it crosses with the others
// (partition/link_sharing.hpp); without sharing, each is timed alone on its route.
class PipelineComm {
 public:
  // Where a time goes in a Chunk: the collectives before or after a pass (added up, in the
  // order given), or a boundary transfer (the slowest tensor rank's).
  enum Slot { kForwardBefore, kForwardAfter, kBackwardBefore, kBackwardAfter, kLastBackwardAfter, kToNext, kToPrevious };
  PipelineComm(const CostModel& cost, bool shared) : cost_(cost), shared_(shared) {}
  // The `order`-th collective of chunk k's slot in worker w (nothing when it moves nothing).
  // `overlap`: per message of an in-pass collective whose messages overlap the pass, the part
  // of the pass's compute it may hide behind (Collective::until - at): each costs only what
  // outlasts that part. Empty: every message adds its whole time.
  void collective(int w, size_t k, Slot slot, int order, const CollectiveSpec& c, std::vector<double> overlap = {});
  // One tensor rank's share of chunk k's boundary transfer in worker w.
  void transfer(int w, size_t k, Slot slot, int src, int dst, double bytes);
  // Costs every phase into the workers' chunks (per worker, as chunks_of made them).
  void resolve(std::vector<std::vector<Chunk>*>& chunks);

 private:
  struct Use {
    int worker;
    size_t chunk;
    Slot slot;
    std::vector<double> overlap{};
  };
  struct Phase {
    SharedPhase items;
    std::vector<Use> uses;  // per item
  };
  Phase& phase(int w, size_t k, Slot slot, int order);
  const CostModel& cost_;
  bool shared_;
  std::map<std::tuple<size_t, int, int, int>, Phase> phases_;  // (chunk, slot, order, worker or -1)
};

// A virtual worker's chunks: each operation's compute per tensor rank; their collectives and
// transfers go to `comm`, which fills them in.
std::vector<Chunk> chunks_of(const model::Network& network, const Layout& layout, const CostModel& cost, int w,
                             bool splits_backward, WorkMemo& memo, PipelineComm& comm);

// What running one worker's pipeline leaves for the rest of the iteration.
struct WorkerRun {
  std::vector<double> rank_end_s;         // per rank: the end of its last operation
  std::vector<double> channel_free;       // per sending rank and direction: when its channel is free
  std::vector<std::vector<double>> busy;  // per rank and tensor rank: compute and collectives
  double bubble_sum = 0;                  // over its devices: 1 - F/B/W compute / the worker's span
  int bubble_count = 0;
  // Per chunk and tensor rank: the start and length of the compute that completes its
  // gradients (its last B or W in program order), for --overlap-grad-reduce.
  std::vector<std::vector<double>> made_start, made_s;
  // Per chunk and micro-batch (chunk * m + mb): when the pass that makes its gradients (B, or
  // W when backward is split) ends, for ZeRO's reduce-scatters.
  std::vector<double> made_end;
  // Per rank: when its devices' copy streams are free (to_host, to_device: activation offload).
  std::vector<double> to_host_free, to_device_free;
};

// Where a worker's pipeline starts an iteration from: when each rank's compute stream and
// each channel are free (the last iteration's ends: a plan's streams run their tasks of
// iteration i after those of i - 1), and when each chunk's first forward (of micro-batch 0)
// may start (WSP: the pull of iteration i - D - 1 arrived). Empty: all at 0.
struct PipelineStart {
  std::vector<double> rank_free;
  // Per rank and tensor rank: when each device's stream is free. A rank's devices may free at
  // different times (the data-parallel pieces of ranks of unequal degree run one after
  // another); each device's first compute starts then, and its tensor-parallel collective
  // waits for the others: the bubble counts a device's span from its own first start.
  std::vector<std::vector<double>> device_free;
  std::vector<double> channel_free;
  std::vector<double> first_forward;  // per chunk
  std::vector<double> to_host_free, to_device_free;  // per rank: its copy streams (empty: 0)
};

// The same times for the same pipeline: workers whose chunks cost alike run alike.
bool same_timing(const std::vector<Chunk>& a, const std::vector<Chunk>& b);

// ZeRO-3's all-gathers (Builder::pass_params) in the pipelines of one data-parallel group:
// on each device's gather stream in program order, one per pass (F and B) or, without
// resharding, one per chunk before its first pass; each after the one before it on the
// stream, after the compute before the previous one's first reader (prefetched one ahead),
// the first of an iteration after the device's last optimizer (PipelineStart::device_free),
// and each one after every replica's is ready (one collective over the replicas). A pass's
// compute waits for its gather.
struct ZeroGathers {
  bool reshard = true;
  std::vector<std::vector<double>> gather_s;  // per chunk and tensor rank: one all-gather (every worker's alike)
};

// One worker's pipeline to run: its chunks, programs, micro-batches and start.
struct PipelineInput {
  const std::vector<Chunk>* chunks = nullptr;
  const RankPrograms* programs = nullptr;
  int microbatches = 1;
  PipelineStart from;
};

// One iteration of one worker's pipeline through its ranks' programs, from `from`. Throws
// PlanError where the schedule deadlocks.
WorkerRun run_pipeline(const Layout& layout, const std::vector<Chunk>& chunks, const RankPrograms& programs, int m,
                       const PipelineStart& from);
// The pipelines of workers that run together: with `gathers` (ZeRO-3; workers cut alike and
// running the same programs), each all-gather starts once every worker's replica is ready
// for it; without, each worker alone (run_pipeline's).
std::vector<WorkerRun> run_pipelines(const Layout& layout, const std::vector<PipelineInput>& workers,
                                     const ZeroGathers* gathers);

// The most activation bytes one rank holds at once: a micro-batch's stash of chunk c lives
// from its F to its B (its W when backward is split), as the plan's stash tensors do, and a
// backward under full recomputation adds its scratch (one layer rebuilt) while it runs.
double activation_peak_bytes(const std::vector<ScheduledOp>& program, const std::vector<double>& stash_bytes,
                             double scratch_bytes, bool splits_backward);

// A rank's stashes (layout_estimate_memory.cpp), ZeRO's whole copies left out: what its
// memory bound holds (the peak; offloaded, a pass's own, the largest), and for the search's
// screens, offloaded, what the plan may add in copies (two more of the largest) and what its
// host holds (every stash in flight), or not offloaded, what the bound and those copies would
// be were they offloaded.
struct RankStashes {
  double device = 0, in_copies = 0, host = 0, if_offloaded = 0;
};
RankStashes rank_stashes(const std::vector<ScheduledOp>& program, const std::vector<double>& stash_bytes,
                         double scratch_bytes, bool splits_backward, bool offloaded);

// LayoutEstimate's headrooms over the devices that compute (`computes`) and, where the layout
// `offloads`, their nodes' hosts; per device the bytes its copies may add and its memory were
// its stashes offloaded (RankStashes, with ZeRO's whole copies).
struct Headroom {
  double bytes = 0, with_copies = 0, stashes_offloaded = 0, host = 0;
  int tightest = -1;
};
Headroom headroom_of(const std::vector<DeviceMemory>& memory, const std::vector<bool>& computes,
                     const std::vector<double>& in_copies, const std::vector<double>& if_offloaded,
                     const CostModel& cost, bool offloads);

// Under expert parallelism: a rank's weights, gradients and optimizer state (on the device or
// offloaded) as the `params` it holds (WorkMemo's, its expert rank's experts alone), where the
// closed form (memory.hpp) counts every expert of its layers.
void hold_own_experts(const Layout& layout, double params, DeviceMemory& m);

// The position of an operation in a queue of operations that run one after another: an
// operation that waits for w others on any of its queues runs in wave w, with the others of
// that wave (what the shared phases group).
class Waves {
 public:
  // The wave of an operation on `queues` (ids of its devices' streams or channels), counted in.
  int next(const std::vector<long long>& queues) {
    int wave = 0;
    for (const long long q : queues) wave = std::max(wave, depth_[q]);
    for (const long long q : queues) depth_[q] = wave + 1;
    return wave;
  }

 private:
  std::map<long long, int> depth_;
};

}  // namespace hetflow::partition::estimate_detail
