// exec::Training's results: the losses, and the weights gathered from every rank into one
// file at rank 0.
#include "exec/training.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "model/error.hpp"

namespace hetflow::exec {

std::vector<double> Training::losses() const {
  return log_->losses(static_cast<double>(feed_->global_batch()) * shape_.S);
}

std::vector<double> Training::balance_losses() const { return log_->balance_losses(); }

SafetensorsFile Training::weights() const {
  return weights_->file(chunks_, servers_ ? servers_->weights() : std::map<std::string, const float*>{});
}

TrainingState Training::state() const {
  // (Under parameter servers every parameter is a server's: its weights and moments win.)
  const auto served = [&](int array) { return servers_ ? servers_->weights(array) : std::map<std::string, const float*>{}; };
  TrainingState s;
  s.weights = weights();
  s.exp_avg = weights_->file(chunks_, served(1), ModelWeights::Array::exp_avg);
  s.exp_avg_sq = weights_->file(chunks_, served(2), ModelWeights::Array::exp_avg_sq);
  for (SafetensorsFile* f : {&s.exp_avg, &s.exp_avg_sq}) f->metadata["content"] = "AdamW moments of model.safetensors";
  const auto run = static_cast<long long>(log_->iterations().size());
  s.progress.iterations = start_.iterations + run;
  s.progress.optimizer_steps = start_.optimizer_steps + run - log_->skipped_steps();
  s.progress.global_batch = feed_->global_batch();
  s.progress.seq_len = shape_.S;
  s.progress.loss_scaler = step_->scaler_state();
  s.progress.model = describe();
  return s;
}

void Training::collect_at_root(bool with_moments) {
  if (ranks_ == nullptr) return;
  // Records: 1 the losses, balance losses and skipped steps it logged; 2 its part of the
  // model; 3 its servers' weights.
  std::vector<std::byte> mine;
  put(mine, std::uint64_t{1});
  log_->save(mine);
  put(mine, std::uint64_t{2});
  weights_->save(chunks_, mine, with_moments);
  if (servers_) {
    put(mine, std::uint64_t{3});
    servers_->save(mine, with_moments);
  }
  const auto all = ranks_->gather(mine);
  if (ranks_->rank() != 0) return;
  weights_->forget_merged();  // (the losses come once each; the servers' weights replace the last ones)
  for (size_t r = 1; r < all.size(); ++r) {
    ByteReader in(all[r]);
    while (!in.done()) {
      const auto kind = in.get<std::uint64_t>();
      if (kind == 1) {
        log_->merge(in);
      } else if (kind == 2) {
        weights_->merge(in, static_cast<int>(r));
      } else if (kind == 3 && servers_) {
        servers_->merge(in);
      } else {
        throw Error("rank " + std::to_string(r) + " sent an unknown record of its training");
      }
    }
  }
}

}  // namespace hetflow::exec
