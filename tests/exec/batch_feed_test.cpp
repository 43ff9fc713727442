// The batch feed against the token source's whole-batch read: each worker's micro-batch is
// its rows of the global batch, context groups share theirs, and kept micro-batches are
// dropped and read again alike.
#include <gtest/gtest.h>

#include <memory>

#include "exec/batch_feed.hpp"
#include "exec/token_data.hpp"
#include "model/error.hpp"
#include "partition/layout.hpp"

namespace hetflow {
namespace {

constexpr int kVocab = 50, kSeq = 8;

partition::Layout workers(std::vector<int> microbatches, int micro_batch_size, int context = 1) {
  partition::Layout layout;
  layout.micro_batch_size = micro_batch_size;
  for (size_t w = 0; w < microbatches.size(); ++w) {
    partition::VirtualWorker vw;
    vw.ranks = {{static_cast<int>(w)}};
    vw.stages = {partition::Stage{}};
    vw.microbatches = microbatches[w];
    layout.workers.push_back(vw);
  }
  if (context > 1) layout.set_size(partition::Axis::context, context);
  return layout;
}

// Rows [first, first + count) of step's whole batch, as the source reads it in one piece.
exec::Batch rows(const exec::TokenSource& source, int step, int B, int first, int count) {
  const exec::Batch whole = source.batch(step, B, kSeq);
  exec::Batch out;
  out.inputs.assign(whole.inputs.begin() + first * kSeq, whole.inputs.begin() + (first + count) * kSeq);
  out.targets.assign(whole.targets.begin() + first * kSeq, whole.targets.begin() + (first + count) * kSeq);
  return out;
}

TEST(BatchFeed, EachMicroBatchIsItsRowsOfTheGlobalBatchInWorkerThenMicroBatchOrder) {
  const auto oracle = exec::markov_stream(kVocab, 3);
  exec::BatchFeed feed(workers({2, 1, 3}, 2), exec::markov_stream(kVocab, 3), kSeq, 2);
  ASSERT_EQ(feed.global_batch(), 12);  // (2 + 1 + 3) micro-batches of 2
  EXPECT_EQ(feed.first_sample(0), 0);
  EXPECT_EQ(feed.first_sample(1), 4);
  EXPECT_EQ(feed.first_sample(2), 6);
  for (const int step : {0, 1, 5}) {
    const int firsts[][2] = {{0, 0}, {0, 1}, {1, 0}, {2, 0}, {2, 2}};  // (worker, micro-batch)
    for (const auto& [w, m] : firsts) {
      const exec::Batch want = rows(*oracle, step, 12, feed.first_sample(w) + 2 * m, 2);
      const auto got = feed.get(step, w, m);
      EXPECT_EQ(got->inputs, want.inputs) << "step " << step << " worker " << w << " micro-batch " << m;
      EXPECT_EQ(got->targets, want.targets);
    }
  }
}

TEST(BatchFeed, AContextGroupsWorkersTakeTheSameSamples) {
  // Workers 0, 1 are one context group (one replica), 2, 3 the next.
  exec::BatchFeed feed(workers({2, 2, 2, 2}, 1, 2), exec::markov_stream(kVocab, 3), kSeq, 2);
  EXPECT_EQ(feed.global_batch(), 4);
  EXPECT_EQ(feed.first_sample(1), 0);
  EXPECT_EQ(feed.first_sample(3), 2);
  EXPECT_EQ(feed.get(0, 1, 1)->inputs, feed.get(0, 0, 1)->inputs);
  EXPECT_NE(feed.get(0, 2, 0)->inputs, feed.get(0, 0, 0)->inputs);
}

TEST(BatchFeed, StepsBehindAreDroppedAndReadAgainAlike) {
  exec::BatchFeed feed(workers({1, 1}, 1), exec::markov_stream(kVocab, 3), kSeq, 2);
  feed.load(0, 0, 0);
  const auto first = feed.get(0, 1, 0);
  EXPECT_EQ(feed.kept(), 2u);
  EXPECT_EQ(feed.get(0, 0, 0), feed.get(0, 0, 0));  // kept: the same batch, not read again
  feed.load(2, 0, 0);  // two steps on: step 0's are still kept
  EXPECT_EQ(feed.kept(), 3u);
  feed.load(3, 0, 0);  // three: they are dropped
  EXPECT_EQ(feed.kept(), 2u);
  EXPECT_EQ(feed.get(0, 1, 0)->inputs, first->inputs);
}

TEST(BatchFeed, ASourceTooShortForAStepIsTheInputsFaultAndNoSourceFeedsNothing) {
  std::vector<std::uint16_t> tokens(2 * kSeq, 1);  // one sample's worth; a step needs 2 and one more token
  exec::BatchFeed shorter(workers({1, 1}, 1), std::make_unique<exec::TokenFile>(tokens, kVocab, "short"), kSeq, 2);
  EXPECT_THROW(shorter.check(), InputError);
  exec::BatchFeed none(workers({1}, 1), nullptr, kSeq, 2);
  EXPECT_NO_THROW(none.check());
  EXPECT_THROW(none.get(0, 0, 0), Error);
}

}  // namespace
}  // namespace hetflow
