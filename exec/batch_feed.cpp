#include "exec/batch_feed.hpp"

#include <algorithm>

#include "model/error.hpp"

namespace hetflow::exec {

BatchFeed::BatchFeed(const partition::Layout& layout, std::unique_ptr<TokenSource> source, int seq_len,
                     int steps_kept)
    : source_(std::move(source)),
      seq_len_(seq_len),
      micro_batch_size_(layout.micro_batch_size),
      steps_kept_(steps_kept) {
  const size_t context = static_cast<size_t>(std::max(1, layout.size(partition::Axis::context)));
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    base_.push_back(w % context == 0 ? global_batch_ : base_[w - w % context]);
    if (w % context == 0) global_batch_ += layout.workers[w].microbatches * micro_batch_size_;
  }
}

void BatchFeed::check() const {
  if (source_) (void)source_->batch(first_step_, global_batch_, seq_len_);
}

Batch BatchFeed::read(int iteration, int worker, int microbatch) const {
  if (!source_) throw Error("the training was given no token source, and a task asks for a micro-batch");
  return source_->samples(first_step_ + iteration, global_batch_, seq_len_, first_sample(worker) + microbatch * micro_batch_size_,
                          micro_batch_size_);
}

std::shared_ptr<const Batch> BatchFeed::keep(int iteration, int worker, int microbatch, Batch b) {
  auto made = std::make_shared<const Batch>(std::move(b));
  std::lock_guard lock(mutex_);
  const auto kept = kept_.emplace(std::tuple(iteration, worker, microbatch), std::move(made)).first->second;
  kept_.erase(kept_.begin(), kept_.lower_bound({iteration - steps_kept_, 0, 0}));
  return kept;
}

void BatchFeed::load(int iteration, int worker, int microbatch) {
  keep(iteration, worker, microbatch, read(iteration, worker, microbatch));
}

std::shared_ptr<const Batch> BatchFeed::get(int iteration, int worker, int microbatch) {
  {
    std::lock_guard lock(mutex_);
    if (const auto found = kept_.find({iteration, worker, microbatch}); found != kept_.end()) return found->second;
  }
  return keep(iteration, worker, microbatch, read(iteration, worker, microbatch));
}

size_t BatchFeed::kept() const {
  std::lock_guard lock(mutex_);
  return kept_.size();
}

}  // namespace hetflow::exec
