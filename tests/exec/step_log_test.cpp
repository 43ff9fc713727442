// The step log: mean token losses in worker order, balance losses over layers, and two
// ranks' logs merged into the sums one process would have logged.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "exec/step_log.hpp"
#include "model/error.hpp"

namespace hetflow {
namespace {

TEST(StepLog, ALossIsEveryMicroBatchsSumOverTheStepsTokens) {
  exec::StepLog log({2, 1});
  log.add_loss(0, 0, 0, 10);
  log.add_loss(0, 0, 1, 20);
  log.add_loss(0, 1, 0, 30);
  log.add_loss(1, 1, 0, 6);
  EXPECT_EQ(log.iterations(), (std::vector<int>{0, 1}));
  EXPECT_EQ(log.losses(12), (std::vector<double>{5, 0.5}));
  log.add_balance(0, 0, 0, 0, 3.0, 2);
  log.add_balance(0, 1, 1, 0, 1.0, 2);
  EXPECT_EQ(log.balance_losses(), (std::vector<double>{1.0}));  // (3 + 1) over 4 layers
}

TEST(StepLog, TwoRanksLogsMergeIntoOneProcesss) {
  exec::StepLog whole({1, 1}), rank0({1, 1}), rank1({1, 1});
  for (exec::StepLog* log : {&whole, &rank0}) {
    log->add_loss(0, 0, 0, 1.5);
    log->add_balance(0, 0, 0, 0, 2.0, 1);
  }
  for (exec::StepLog* log : {&whole, &rank1}) {
    log->add_loss(0, 1, 0, 2.5);
    log->add_loss(1, 1, 0, 4.0);
    log->add_skipped(1);
    log->add_balance(0, 1, 0, 0, 4.0, 1);
  }
  std::vector<std::byte> bytes;
  rank1.save(bytes);
  exec::ByteReader in(bytes);
  rank0.merge(in);
  EXPECT_TRUE(in.done());
  EXPECT_EQ(rank0.losses(2), whole.losses(2));
  EXPECT_EQ(rank0.balance_losses(), whole.balance_losses());
  EXPECT_EQ(rank0.skipped(), whole.skipped());
  EXPECT_EQ(rank0.skipped_steps(), 1);

  exec::StepLog other({3});  // another layout's log
  other.add_loss(0, 0, 2, 1.0);
  std::vector<std::byte> theirs;
  other.save(theirs);
  exec::ByteReader wrong(theirs);
  EXPECT_THROW(rank0.merge(wrong), Error);
}

}  // namespace
}  // namespace hetflow
