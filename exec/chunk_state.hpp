#pragma once
// One chunk of the model on one device, as real training holds it (torchtitan's model
// seam): its decoder math (exec/decoder.hpp), its parameters, gradients and AdamW moments in
// the device's memory (touched only through the device's DecoderOps), where it sits in the
// plan (device, virtual worker, stage, tensor-parallel rank), what it owns under ZeRO, and
// the stashes its forwards leave for their backwards.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "exec/decoder.hpp"
#include "exec/decoder_ops.hpp"
#include "partition/layout.hpp"

namespace hetflow::exec {

struct ChunkState {
  ChunkState(const DecoderShape& shape, int layer_begin, int layer_end, partition::Recompute recompute, int rank,
             int degree, const DecoderOps& device_ops, bool sequence_parallel, ContextSplit context = {},
             ExpertGroup experts = {})
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
  // ZeRO (keep_owned_state): where each owned range starts in `m` and `v` (and from stage 2
  // `grads`), which then hold those ranges alone, one after another; empty: they are whole.
  std::vector<size_t> shard_base;
  bool grads_sharded = false;   // `grads` holds the owned ranges alone (shard_at)
  bool params_sharded = false;  // `params` too (ZeRO 3: passes read the all-gathers' copies)
  size_t whole() const { return math.params().count; }  // the chunk's parameters, all of them
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
  // Shrinks the AdamW moments, with `gradients` (ZeRO 2 and 3, whose passes add into
  // transient whole buffers) the gradients, and with `parameters` (ZeRO 3, whose passes read
  // the all-gathers' transient copies) the parameters, to what this replica owns (its
  // optimizer steps nothing else): ZeRO's sharding in memory, not only in the math. Before the
  // first pass; the moments and parameters keep their owned values, the gradients are zero.
  void keep_owned_state(bool gradients, bool parameters = false) {
    if (owned.empty()) return;
    size_t total = 0;
    shard_base.clear();
    for (const auto& [a, b] : owned) {
      shard_base.push_back(total);
      total += b - a;
    }
    for (OpsFloats* kept : {&m, &v, parameters ? &params : nullptr}) {
      if (kept == nullptr) continue;
      OpsFloats shard = ops().floats(total);
      for (size_t k = 0; k < owned.size(); ++k) {
        ops().copy(shard.data() + shard_base[k], kept->data() + owned[k].first, owned[k].second - owned[k].first);
      }
      *kept = std::move(shard);
    }
    if (gradients) grads = ops().zeros(total);
    grads_sharded = gradients;
    params_sharded = parameters;
  }
  // Where the element at flat `offset` sits in `array` (one of the four above): once kept for
  // the owned alone, the moments (and from stage 2 the gradients) hold it at shard_at.
  size_t index_in(const OpsFloats& array, size_t offset) const {
    const bool sharded = &array == &m || &array == &v || (&array == &grads && grads_sharded) ||
                         (&array == &params && params_sharded);
    return sharded ? shard_at(offset) : offset;
  }
  // A host copy of `array` (params, m or v) as whole as the parameters: a shard's values at
  // their owned offsets, zeros where other replicas own them.
  std::vector<float> host_whole(const OpsFloats& array) const {
    std::vector<float> host(whole(), 0.0f);
    if ((&array == &params && !params_sharded) || shard_base.empty()) {
      ops().download(host.data(), array.data(), array.size());
    } else {
      for (const auto& [a, b] : owned) ops().download(host.data() + a, array.data() + index_in(array, a), b - a);
    }
    return host;
  }
  // The index in the sharded arrays of the parameter at flat `offset` (an owned one, once they
  // are kept for the owned alone); an owned run [offset, offset + n) is contiguous there.
  size_t shard_at(size_t offset) const {
    if (shard_base.empty()) return offset;
    const auto after = std::upper_bound(owned.begin(), owned.end(), offset,
                                        [](size_t o, const std::pair<size_t, size_t>& r) { return o < r.first; });
    const auto k = static_cast<size_t>(after - owned.begin()) - 1;
    return shard_base[k] + (offset - owned[k].first);
  }
  // The gradient of the parameter at flat `offset` (an owned one when they are sharded).
  float* grad_at(size_t offset) { return grads.data() + index_in(grads, offset); }
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
  // Sets every parameter outside `owned` to `value` (ZeRO 1 and 2: NaN where another replica
  // owns it, so a pass that read one before the plan's all-gather would show it in the loss).
  // Nothing once the parameters hold the shard alone.
  void set_unowned(float value) {
    if (params_sharded) return;
    size_t at = 0;
    std::vector<float> fill;
    const auto set = [&](size_t a, size_t b) {
      if (b <= a) return;
      fill.assign(b - a, value);
      ops().upload(params.data() + a, fill.data(), b - a);
    };
    for (const auto& [a, b] : owned) {
      set(at, a);
      at = b;
    }
    set(at, params.size());
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

}  // namespace hetflow::exec
