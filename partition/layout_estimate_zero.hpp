#pragma once
// ZeRO's collectives in estimate_layout (partition/layout_estimate.cpp), as the builder makes
// them (partition/plan_builder_zero.cpp), timed with the same cost model: each piece's
// reduce-scatter and all-gather over its replicas, once per layout (every replica cuts the
// model alike), then run on the devices' streams each iteration:
//  - stage 1: the data-parallel buckets reduce-scattered instead of all-reduced (the estimate's
//    all-reduce path, overlapped with the last backward as there), each optimizer stepping its
//    shard, then the updated parameters all-gathered on the comm stream, which the next
//    iteration's first compute waits for (exposed);
//  - stage 2: each backward's gradients reduce-scattered on the comm stream once every
//    replica's backward has made them (overlapped with the next passes, exposed where they
//    outlast them), then as stage 1;
//  - stage 3: the parameters all-gathered before every pass on the gather stream, prefetched
//    one ahead (ZeroGathers, run inside the pipelines), or without resharding once per chunk
//    and iteration with one reduce-scatter after its last backward.
// Concurrent flows share links as the estimate's other phases do: the pieces of one chunk
// (every tensor rank's ring over the replicas) run at once. Under expert parallelism a
// chunk's pieces are its all-reduce's (builder::data_parallel_segments): the dense part over
// every replica, each expert rank's experts over the replicas holding them, one after the
// other on a device's comm stream (timed here as if at once, which over-counts what they
// share).
#include <map>
#include <vector>

#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"
#include "partition/layout_estimate_detail.hpp"
#include "partition/layout_estimate_memo.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition::estimate_detail {

class ZeroSync {
 public:
  // Throws InputError where the builder would refuse the layout's sharding (builder::check_zero).
  ZeroSync(const model::Network& network, const Layout& layout, const CostModel& cost, WorkMemo& memo, bool shared);
  // The stage the plan runs: 0 where nothing is sharded (one worker, parameter servers).
  int stage() const { return stage_; }
  // Stage 3: the all-gathers before the passes, for run_pipelines; else nullptr.
  const ZeroGathers* gathers() const { return stage_ >= 3 ? &pass_gathers_ : nullptr; }
  // The parameters worker w's optimizer steps of tensor rank j's piece of chunk `s` (its shard,
  // of its device's memory share under shares by memory, or all; under expert parallelism the
  // experts' part sharded over the replicas holding them).
  double optimizer_params(const Stage& s, const WorkMemo::Entry& chunk, size_t j, int w) const;
  // The part of tensor rank j's tied gradients worker w sums with its other copy: from stage 2
  // its share of the first chunk's piece (1/D, or its memory share), else all.
  double tied_share(size_t w, int j) const;
  // A rank's program and what its passes keep, as estimate_layout's activation peak takes them.
  struct Stashes {
    const std::vector<ScheduledOp>* program = nullptr;
    const std::vector<double>* stash_bytes = nullptr;  // per chunk of the rank: one micro-batch's
    double scratch_bytes = 0;                           // during a backward (full recomputation)
    bool splits_backward = false;
  };
  // Tensor rank j of a rank of worker w that holds `chunks` at degree t, from stage 1: its
  // persistent state as the plan's shards hold it (whole elements); from stage 2 the most its
  // stashes and ZeRO's whole copies hold at once over its program, counting of the copies
  // only what is surely alive during each pass: its own gathered parameters and the gradients
  // it makes (a layer's at stage 3, a bucket's at stage 2), or kept gathered every chunk's from
  // its first pass to its last. The closed form's two units of each (memory.hpp,
  // gathered_bytes) need not coincide with the peak, so the estimate's memory stays a lower
  // bound of the plan's.
  void sharded_memory(WorkMemo& memo, int w, const std::vector<Stage>& chunks, int t, int j, const Stashes& stashes,
                      DeviceMemory& m) const;
  // Stages 2 and 3: each gradient-making pass's reduce-scatters (kept gathered: each chunk's
  // last), piece by piece over the replicas, in program order on the comm streams.
  void reduce_scatter(const std::vector<WorkerRun>& runs, const RankPrograms& programs,
                      std::vector<double>& comm_free) const;
  // Stages 1 and 2: after every replica's optimizer (stream_free, per device), the pieces'
  // all-gathers on the comm streams, last chunk first; each device's next iteration (its
  // stream_free) waits for its last one, and the iteration's end (`makespan`) for all.
  void gather_after_optimizers(std::vector<double>& stream_free, std::vector<double>& comm_free, double& makespan) const;

 private:
  int device_of(size_t w, size_t k, size_t j) const;
  // One reduce-scatter and its all-gather over `workers` (every replica, or under expert
  // parallelism an expert rank's holders).
  struct Piece {
    std::vector<size_t> workers;
    double scatter_s = 0, gather_s = 0;
  };
  std::map<std::pair<int, size_t>, std::vector<double>> parts_;  // (chunk's first layer, rank j) -> builder::zero_parts
  const model::Network& network_;
  const Layout& layout_;
  int stage_ = 0;
  std::vector<std::vector<std::vector<Piece>>> pieces_;  // per chunk and tensor rank, in the builder's order
  ZeroGathers pass_gathers_;  // stage 3 (no expert parallelism): per chunk and tensor rank, its one all-gather
};

}  // namespace hetflow::partition::estimate_detail
