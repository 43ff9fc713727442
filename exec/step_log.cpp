#include "exec/step_log.hpp"

#include <algorithm>
#include <cstdint>

#include "model/error.hpp"

namespace hetflow::exec {

StepLog::StepLog(const std::vector<int>& microbatches) {
  for (const int m : microbatches) {
    base_.push_back(parts_);
    parts_ += m;
  }
}

void StepLog::add_loss(int iteration, int worker, int microbatch, double loss_sum) {
  std::lock_guard lock(mutex_);
  auto& parts = loss_parts_[iteration];
  parts.resize(static_cast<size_t>(parts_), 0.0);
  parts.at(static_cast<size_t>(base_.at(static_cast<size_t>(worker)) + microbatch)) = loss_sum;
}

void StepLog::add_balance(int iteration, int worker, int stage, int microbatch, double sum, int layers) {
  std::lock_guard lock(mutex_);
  balance_parts_[iteration][{worker, stage, microbatch}] = {sum, layers};
}

void StepLog::add_skipped(int iteration) {
  std::lock_guard lock(mutex_);
  skipped_.insert(iteration);
}

std::vector<int> StepLog::iterations() const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  for (const auto& [iteration, parts] : loss_parts_) out.push_back(iteration);
  return out;
}

std::vector<double> StepLog::losses(double tokens_per_step) const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  for (const auto& [iteration, parts] : loss_parts_) {
    double sum = 0;
    for (const double part : parts) sum += part;
    out.push_back(sum / tokens_per_step);
  }
  return out;
}

std::vector<double> StepLog::balance_losses() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  for (const auto& [iteration, parts] : balance_parts_) {
    double sum = 0;
    int layers = 0;
    for (const auto& [where, part] : parts) {  // in (worker, stage, micro-batch) order: the same sum on any ranks
      sum += part.first;
      layers += part.second;
    }
    out.push_back(sum / layers);
  }
  return out;
}

std::set<int> StepLog::skipped() const {
  std::lock_guard lock(mutex_);
  return skipped_;
}

int StepLog::skipped_steps() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(skipped_.size());
}

namespace {
enum Record : std::uint64_t { loss = 1, balance = 2, skipped = 3, end = 4 };
}

void StepLog::save(std::vector<std::byte>& out) {
  std::lock_guard lock(mutex_);
  // (Every step before the first unsaved one was complete when it was saved: a run collects
  // between iterations, never inside one.)
  int last = first_unsaved_ - 1;
  for (auto it = loss_parts_.lower_bound(first_unsaved_); it != loss_parts_.end(); ++it) {
    const auto& [iteration, parts] = *it;
    put(out, std::uint64_t{Record::loss});
    put(out, iteration);
    put(out, static_cast<std::uint64_t>(parts.size()));
    for (const double part : parts) put(out, part);
    last = std::max(last, iteration);
  }
  for (auto it = balance_parts_.lower_bound(first_unsaved_); it != balance_parts_.end(); ++it) {
    const auto& [iteration, parts] = *it;
    for (const auto& [where, part] : parts) {
      put(out, std::uint64_t{Record::balance});
      for (const int v : {iteration, std::get<0>(where), std::get<1>(where), std::get<2>(where), part.second}) put(out, v);
      put(out, part.first);
    }
    last = std::max(last, iteration);
  }
  for (auto it = skipped_.lower_bound(first_unsaved_); it != skipped_.end(); ++it) {
    put(out, std::uint64_t{Record::skipped});
    put(out, *it);
    last = std::max(last, *it);
  }
  put(out, std::uint64_t{Record::end});
  first_unsaved_ = last + 1;
}

void StepLog::merge(ByteReader& in) {
  std::lock_guard lock(mutex_);
  for (;;) {
    const auto kind = in.get<std::uint64_t>();
    if (kind == Record::end) return;
    if (kind == Record::loss) {
      const int iteration = in.get<int>();
      auto& parts = loss_parts_[iteration];
      const auto n = static_cast<size_t>(in.get<std::uint64_t>());
      if (n != static_cast<size_t>(parts_)) throw Error("a rank logged a step of another number of micro-batches");
      parts.resize(n, 0.0);
      for (size_t i = 0; i < n; ++i) parts[i] += in.get<double>();
    } else if (kind == Record::balance) {
      const int iteration = in.get<int>(), worker = in.get<int>(), stage = in.get<int>(), microbatch = in.get<int>();
      const int layers = in.get<int>();
      balance_parts_[iteration][{worker, stage, microbatch}] = {in.get<double>(), layers};
    } else if (kind == Record::skipped) {
      skipped_.insert(in.get<int>());
    } else {
      throw Error("a rank sent an unknown record of its step log");
    }
  }
}

}  // namespace hetflow::exec
