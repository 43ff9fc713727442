#pragma once
// Gradient synchronisation for real training (the data axis of torchtitan's parallelize
// seam): which floats of a chunk each of the plan's gradient collectives moves, and under
// ZeRO what each replica owns and the transient whole buffers its passes use. Back ends call
// data() before a collective and done() after it; Training's passes read their parameters
// and add their gradients where pass_params() and pass_grads() say.
//
//  - A data-parallel all-reduce of layers [a, b) reduces those layers' gradients (bucket k of
//    K its k-th share); the embedding all-reduce the tied embedding's two copies. Between
//    ranks of different tensor-parallel degrees it sums the part of Megatron's split its
//    members hold in common (SplitPart: [1/4, 1/2) between rank 0 of 2 and rank 1 of 4),
//    gathered from each member's gradients in the part's order and put back after;
//    parameters every rank holds whole go with every part. Under expert parallelism a layer
//    range is two pieces: the layers less their routed experts over every replica, the
//    experts over the replicas that hold them.
//  - ZeRO (Layout::sync.zero): a replica owns the part of each reduce-scatter's buffer that
//    the collective's steps leave it (partition::member_part), the same part its all-gathers
//    bring (ChunkState::owned). Stage 1 reduce-scatters and all-gathers in place, bucket by
//    bucket; from stage 2 a pass adds its gradients to a transient whole buffer (the plan's
//    unsharded_grad) that its reduce-scatters add into the shard; stage 3 passes read a
//    transient whole copy of the parameters (gathered_weight) their all-gather makes, freed
//    when its last reader ends.
// Plans it cannot run are refused in the constructor with PlanError naming the collective:
// members that would sum different parameters, all-gathers that bring back other ranges
// than the reduce-scatters left, a tied embedding summed between stages from stage 2 whose
// ends would own different rows of it, sequence parallelism from stage 2, a stage-3
// all-gather of an expert-parallel piece.
//  - From stage 2 a tied embedding's two copies add shard by shard: the chunks holding them
//    are moved by their ZeRO collectives member by member, each member's rows of the table
//    first (the same rows at both ends), and the embedding all-reduce sums those in place.
//
// Thread-safety: each device's collectives and passes run on its own threads in the plan's
// order; the transient buffers, which passes and collectives of one device share, are
// behind a lock.
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "exec/backend.hpp"
#include "exec/chunk_state.hpp"
#include "exec/decoder_params.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

class GradientSync {
 public:
  // `chunk_of_tensor`: this rank's chunks by their weight and weight_grad tensors;
  // `tp_position`: each device's (rank, size) in its tensor-parallel group; `local`: whether
  // a device is this process's. The maps must outlive this object. `zero_stage`: 0 unless
  // the plan shards over several replicas.
  GradientSync(const partition::Plan& plan, const DecoderShape& shape, const std::map<int, ChunkState*>& chunk_of_tensor,
               const std::map<int, std::pair<int, int>>& tp_position, std::function<bool(int)> local, int zero_stage);

  int zero_stage() const { return zero_stage_; }
  // The floats a gradient collective task reduces or gathers in place (empty: nothing of the
  // model's), and after it, where they go back.
  std::span<float> data(const TaskContext& task);
  void done(const TaskContext& task);
  // The parameters a pass reads and the gradients it adds to: the chunk's own, or ZeRO's
  // transients; pass_done when the pass ends (a gathered copy's reader ended).
  const float* pass_params(const TaskContext& task, ChunkState& c);
  float* pass_grads(const TaskContext& task, ChunkState& c);
  void pass_done(const TaskContext& task);

 private:
  enum class ZeroRole : char {
    none,
    scatter,        // reduce-scatter a span of the chunk's gradients in place (stage 1)
    scatter_whole,  // reduce-scatter a pass's unsharded_grad buffer, then add the shard (2, 3)
    gather,         // all-gather a span of the chunk's parameters in place (1, 2)
    gather_copy,    // all-gather the parameters into a gathered_weight buffer, or a piece's runs of it (3)
  };
  void map_collectives();  // the all-reduces' spans and runs
  void check_collective_sizes() const;
  SplitPart common_part(const std::vector<int>& members) const;
  void map_zero();  // the sharded collectives' roles and parts, each chunk's owned ranges
  // From stage 2: the tied embedding's all-reduces (tied_shard_) and the runs its chunks' ZeRO
  // collectives move them in, by chunk.
  std::map<const ChunkState*, std::vector<FloatRun>> map_tied_embedding(const std::function<int(int)>& node);
  std::span<float> zero_data(const TaskContext& task);
  void zero_done(const TaskContext& task);

  const partition::Plan& plan_;
  const DecoderShape& shape_;
  const std::map<int, ChunkState*>& chunk_of_tensor_;
  const std::map<int, std::pair<int, int>>& tp_position_;
  std::function<bool(int)> local_;
  int zero_stage_ = 0;
  std::vector<std::pair<size_t, size_t>> collective_span_;  // per task: [begin, end) in its chunk's gradients
  std::vector<ChunkState*> collective_chunk_;               // per task
  std::vector<std::vector<FloatRun>> collective_runs_;      // per task: gathered instead (empty: the span)
  std::vector<OpsFloats> gathered_;                         // per task: its runs' floats while it runs
  std::vector<ZeroRole> zero_role_;                         // per task
  std::vector<std::pair<size_t, size_t>> zero_part_;        // per task: the flat range this member owns
  std::vector<char> tied_shard_;  // per task: sums its span of the tied table's owned rows, in place (stage 2, 3)
  std::map<int, int> readers_of_;         // gathered_weight tensor -> tasks reading it in an iteration
  // Stage 3 under expert parallelism: a pass reads one gathered copy per piece (the dense
  // part's, its experts'), which together make the chunk's whole copy, kept under the
  // smallest of them: gathered_weight tensor -> that copy's.
  std::map<int, int> copy_of_;
  int copy_read_by(int task) const;  // the whole copy a pass reads (-1: none)
  std::map<int, int> scatters_of_whole_;  // unsharded_grad tensor -> its reduce-scatters (2 under expert parallelism)
  struct Transient {
    OpsFloats floats;
    int reads_left = 0;
  };
  std::mutex transient_mutex_;  // the map; each buffer's floats are ordered by the plan's edges
  std::map<std::pair<int, int>, Transient> transient_;  // (iteration, tensor)
};

}  // namespace hetflow::exec
