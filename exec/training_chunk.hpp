#pragma once
// Inside exec/training*.cpp only: a chunk's state on its device (its decoder math, its
// parameters, gradients and AdamW moments in the device's memory, the stashes its forwards
// leave), and the helpers the training's files share.
#include <algorithm>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "exec/training.hpp"

namespace hetflow::exec {

struct Training::Chunk {
  Chunk(const DecoderShape& shape, int layer_begin, int layer_end, partition::Recompute recompute, int rank, int degree,
        const DecoderOps& device_ops, bool sequence_parallel, ContextSplit context = {}, ExpertGroup experts = {})
      : math(shape, layer_begin, layer_end, recompute, rank, degree, device_ops, sequence_parallel, context,
             std::move(experts)),
        ops_(&device_ops) {}
  DecoderChunk math;
  const DecoderOps* ops_;  // its device's: every array below is in its memory
  const DecoderOps& ops() const { return *ops_; }
  int device = -1, worker = -1, stage = -1;
  int tp_rank = 0, tp = 1;
  int communicator = -1;  // its tensor-parallel group's, when tp > 1
  OpsFloats params, grads, m, v;
  int steps = 0;  // AdamW steps taken
  bool split = false;  // its backwards are split: B, then W adds the weights' gradients
  // ZeRO: the flat ranges of its arrays this replica owns, ascending (empty: not sharded).
  std::vector<std::pair<size_t, size_t>> owned;
  // ZeRO: the part of `owned` no reduce-scatter moves (experts one replica holds): from stage
  // 2, added to the gradients from a pass's whole buffer after its last reduce-scatter.
  std::vector<std::pair<size_t, size_t>> alone;
  // f(offset, count) for each owned run of [begin, end), in order; all of it when not sharded.
  template <class F>
  void each_owned(size_t begin, size_t end, F&& f) const {
    if (owned.empty()) {
      if (end > begin) f(begin, end - begin);
      return;
    }
    for (const auto& [a, b] : owned) {
      const size_t lo = std::max(a, begin), hi = std::min(b, end);
      if (hi > lo) f(lo, hi - lo);
    }
  }
  // The gradients of the parameters every rank holds whole (norms, biases after a reduction,
  // positions) as the backward left them: each part of a data-parallel all-reduce between
  // workers of different degrees sums them from these (taken by the iteration's first part).
  struct Replicated {
    size_t at = 0, count = 0, base = 0;  // the slot in the flat array; where local_replicated holds it
  };
  std::vector<Replicated> replicated;  // ascending
  OpsFloats local_replicated;
  int local_iteration = -1;
  void take_replicated(int iteration) {
    if (local_iteration == iteration) return;
    size_t total = 0;
    for (Replicated& r : replicated) {
      r.base = total;
      total += r.count;
    }
    local_replicated = ops().floats(total);
    for (const Replicated& r : replicated) ops().copy(local_replicated.data() + r.base, grads.data() + r.at, r.count);
    local_iteration = iteration;
  }
  // Every array to `to`'s memory (no stash may be alive).
  void move_to(const DecoderOps& to) {
    // All four copied before any is replaced: a failure (no memory there) leaves the chunk
    // whole where it was.
    OpsFloats* const arrays[] = {&params, &grads, &m, &v};
    OpsFloats moved[4];
    for (size_t i = 0; i < 4; ++i) {
      std::vector<float> host(arrays[i]->size());
      ops().download(host.data(), arrays[i]->data(), arrays[i]->size());
      moved[i] = to.floats(host.size());
      to.upload(moved[i].data(), host.data(), host.size());
    }
    for (size_t i = 0; i < 4; ++i) *arrays[i] = std::move(moved[i]);
    local_replicated = OpsFloats();
    local_iteration = -1;
    math.set_ops(to);
    ops_ = &to;
  }
  std::vector<float> host_params() const {
    std::vector<float> host(params.size());
    ops().download(host.data(), params.data(), params.size());
    return host;
  }
  // The snapshot's gradient at `offset` of the flat array (inside a replicated slot).
  const float* replicated_at(size_t offset) const {
    const auto after = std::upper_bound(replicated.begin(), replicated.end(), offset,
                                        [](size_t o, const Replicated& r) { return o < r.at; });
    const Replicated& r = *(after - 1);
    return local_replicated.data() + r.base + (offset - r.at);
  }
  std::mutex mutex;  // the stashes: the compute stream writes them, nothing else reads
  std::map<std::pair<int, int>, DecoderChunk::StashPtr> stashes;  // (iteration, micro-batch)
};

namespace training_detail {

// Whether the chunk holds routed experts of layers [begin, end).
bool has_routed_experts(const ChunkParams& p, int begin, int end);
// The floats of layers [begin, end) that are routed experts' (`routed`), or all the others, in
// array order, adjacent runs merged: an expert-parallel gradient piece.
std::vector<FloatRun> expert_piece_runs(const ChunkParams& p, int begin, int end, bool routed);
// The first of `ids` whose tensor is of `kind`, or -1.
int tensor_of_kind(const partition::Plan& plan, std::span<const int> ids, partition::TensorKind kind);
}  // namespace training_detail

}  // namespace hetflow::exec
