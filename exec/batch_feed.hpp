#pragma once
// The batch feed of real training (torchtitan's data loader seam): which samples of a step
// each virtual worker's micro-batch takes, read from the token source once and kept for the
// forwards that need them.
//
// Step k's global batch is the source's batch k, B samples of T tokens, B the sum over the
// layout's data-parallel replicas of micro-batches x micro-batch size. Worker w's micro-batch
// m takes samples [base_w + m mbs, base_w + (m + 1) mbs), base_w the samples of the replicas
// before it; the workers of a context group (partition::Axis::context) take the same samples,
// each its rows of them.
//
// Thread-safe: loads and forwards of any workers ask at once. A micro-batch is read outside
// the lock, so two readers of the same one may both read it; the first kept wins and both
// get the same tokens (the source is deterministic).
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "exec/token_data.hpp"
#include "partition/layout.hpp"

namespace hetflow::exec {

class BatchFeed {
 public:
  // `steps_kept`: how many steps behind the one kept last a micro-batch may still be asked
  // for (a worker's forwards trail its loads by its prefetch and WSP's staleness); older
  // ones are dropped, and asked for again they are read again. A null `source` feeds
  // nothing: asking for a micro-batch throws Error.
  BatchFeed(const partition::Layout& layout, std::unique_ptr<TokenSource> source, int seq_len, int steps_kept);

  int global_batch() const { return global_batch_; }         // B: samples per step
  int first_sample(int worker) const { return base_.at(static_cast<size_t>(worker)); }  // base_w
  // Reads step 0's batch: a source too short for one step is the input's fault (InputError),
  // said before anything runs. Nothing with a null source.
  void check() const;
  // A load task: reads worker's micro-batch of `iteration` and keeps it.
  void load(int iteration, int worker, int microbatch);
  // A resumed run's iteration i reads the source's batch `step` + i (before any is read).
  void start_at(long long step) { first_step_ = step; }
  // The kept micro-batch, or read (and kept) now.
  std::shared_ptr<const Batch> get(int iteration, int worker, int microbatch);
  size_t kept() const;  // micro-batches held now

 private:
  Batch read(int iteration, int worker, int microbatch) const;
  std::shared_ptr<const Batch> keep(int iteration, int worker, int microbatch, Batch b);
  std::unique_ptr<TokenSource> source_;
  int seq_len_ = 0, micro_batch_size_ = 0, steps_kept_ = 0, global_batch_ = 0;
  long long first_step_ = 0;
  std::vector<int> base_;  // per virtual worker
  mutable std::mutex mutex_;
  std::map<std::tuple<int, int, int>, std::shared_ptr<const Batch>> kept_;  // (iteration, worker, micro-batch)
};

}  // namespace hetflow::exec
