#pragma once
// The trained model as one HuggingFace file (torchtitan's checkpoint seam, at the end of a
// run): virtual worker 0's parameters, each tensor put together from the chunks that hold
// its pieces (tensor-parallel ranks in order; under expert parallelism each routed expert
// from the member of worker 0's expert group that holds it), each element from the replica
// that owns it under ZeRO, and under a parameter server the servers' weights (the latest:
// workers adopt them a step later). Tied copies are left out.
//
// Under mpirun a process holds only its rank's chunks: save() writes what rank 0 needs of
// them (worker 0's chunks and its expert group's, every other replica's ZeRO shards), and
// merge() keeps another rank's at rank 0. Not thread-safe: used after the run.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "exec/chunk_state.hpp"
#include "exec/ranks.hpp"
#include "exec/safetensors.hpp"

namespace hetflow::exec {

class ModelWeights {
 public:
  // `expert_placement`: each expert's rank in its expert group (empty without expert
  // parallelism, `expert_parallel` 1); `expert_group`: the workers of worker 0's, by expert
  // rank (partition::expert_group; under context parallelism not the first workers).
  ModelWeights(const DecoderShape& shape, int expert_parallel, std::vector<int> expert_placement,
               std::vector<int> expert_group = {});

  // Which of a chunk's arrays a file holds: the parameters or one of AdamW's moments (a
  // training checkpoint's, exec/training_checkpoint.hpp), named as the parameters.
  enum class Array { params, exp_avg, exp_avg_sq };

  // This process's part, for rank 0: the parameters, with `moments` both moments too.
  void save(const std::vector<std::unique_ptr<ChunkState>>& chunks, std::vector<std::byte>& out,
            bool moments = false) const;
  // Rank `rank`'s part, kept. Error when it does not fit the model.
  void merge(ByteReader& in, int rank);
  // Forgets what merge() kept (before every rank's newer parts come: a run collected at each
  // checkpoint).
  void forget_merged();

  // The file from this process's `chunks` and what merge() kept; `served`: parameters a
  // server holds whole, by name (they win over the chunks' copies).
  // Error for moments another rank did not save().
  SafetensorsFile file(const std::vector<std::unique_ptr<ChunkState>>& chunks,
                       const std::map<std::string, const float*>& served, Array which = Array::params) const;

 private:
  struct Chunk {  // another rank's chunk of worker 0 (or of its expert group)
    int stage = 0, tp_rank = 0;
    int worker = 0;
    int expert_rank = 0;
    ChunkParams params;
    std::vector<float> values[3];  // by Array; the moments empty unless saved
  };
  struct Shard {  // a part of a parameter another replica owns under ZeRO
    int stage = 0, tp_rank = 0;
    int array = 0;  // an Array
    std::string name;   // the parameter's slot
    size_t offset = 0;  // in the slot
    std::vector<float> values;
  };
  // Each element of `values` (a chunk of `stage`, `tp_rank` laid out as `params`) that
  // another replica owns, from it: its `which` array, matched by parameter name.
  void fill_from_shards(const std::vector<std::unique_ptr<ChunkState>>& chunks, int stage, int tp_rank,
                        const ChunkParams& params, Array which, std::vector<float>& values) const;
  DecoderShape shape_;
  int expert_parallel_ = 1;
  std::vector<int> expert_placement_;
  std::vector<int> expert_group_;  // worker 0's expert group (0 alone without one)
  // A chunk rank 0's file takes: worker 0's, or under expert parallelism its group's.
  bool in_file(const ChunkState& c) const;
  std::vector<Chunk> chunks_;
  std::vector<Shard> shards_;
};

}  // namespace hetflow::exec
