#pragma once
// What each step of a real training run measured (torchtitan's metrics seam): every
// micro-batch's summed token loss, a mixture of experts' load-balancing losses per
// (worker, stage, micro-batch), and the steps the optimizer skipped (gradients not finite
// under loss scaling). Thread-safe: the forwards of every device write to it at once.
//
// Under mpirun each rank logs what its devices computed; save() and merge() bring them
// together at rank 0 (Training::collect_at_root), where the sums are exact: each part is
// written by one rank and is zero elsewhere.
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/ranks.hpp"

namespace hetflow::exec {

class StepLog {
 public:
  // `microbatches`: per virtual worker, its micro-batches per step.
  explicit StepLog(const std::vector<int>& microbatches);

  // Worker's micro-batch's token losses of step `iteration`, summed (not yet averaged).
  void add_loss(int iteration, int worker, int microbatch, double loss_sum);
  // A chunk's MoE layers' load-balancing losses for one micro-batch, summed, and how many.
  void add_balance(int iteration, int worker, int stage, int microbatch, double sum, int layers);
  void add_skipped(int iteration);

  // The steps with a loss, ascending.
  std::vector<int> iterations() const;
  // Each of iterations()'s mean token loss: its parts summed in (worker, micro-batch) order,
  // over `tokens_per_step`.
  std::vector<double> losses(double tokens_per_step) const;
  // Each step's load-balancing loss: the mean over its MoE layers and micro-batches. Empty
  // for a model without experts.
  std::vector<double> balance_losses() const;
  std::set<int> skipped() const;
  int skipped_steps() const;

  // The steps this log has not saved before, as bytes (a run collected at every checkpoint
  // sends each step once; it must be called between steps, never during one), and another
  // rank's added to this one.
  void save(std::vector<std::byte>& out);
  void merge(ByteReader& in);

 private:
  std::vector<int> base_;  // per worker: the index of its first micro-batch in a step's parts
  int parts_ = 0;          // micro-batches per step, over every worker
  mutable std::mutex mutex_;
  std::map<int, std::vector<double>> loss_parts_;  // per iteration: per (worker, micro-batch)
  // per iteration: per (worker, stage, micro-batch): the summed losses and the layers
  std::map<int, std::map<std::tuple<int, int, int>, std::pair<double, int>>> balance_parts_;
  std::set<int> skipped_;
  int first_unsaved_ = 0;  // save(): the steps before it were sent
};

}  // namespace hetflow::exec
