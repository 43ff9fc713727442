// Context parallelism's split of a sequence (exec/decoder_detail.hpp): each rank of a group
// of C takes chunks r and 2C - 1 - r of 2C, so that the ranks cover the sequence once and
// causal attention's work (a query at position p meets p + 1 keys) is equal on every rank.
#include <gtest/gtest.h>

#include <vector>

#include "exec/decoder_detail.hpp"

using namespace hetflow::exec::decoder_detail;

TEST(ContextRuns, EachRankTakesAChunkFromEachEndSoCausalWorkBalances) {
  for (const int cp : {1, 2, 4, 8}) {
    const int S = 2 * cp * 5;
    std::vector<int> covered(static_cast<size_t>(S), 0);
    std::vector<long long> work(static_cast<size_t>(cp), 0);
    for (int rank = 0; rank < cp; ++rank) {
      int local = 0;
      for (const ContextRun& run : context_runs(S, cp, rank)) {
        EXPECT_EQ(run.local, local) << cp << " " << rank;  // a rank's rows are its runs, in order
        local += run.length;
        for (int p = run.position; p < run.position + run.length; ++p) {
          ++covered[static_cast<size_t>(p)];
          work[static_cast<size_t>(rank)] += p + 1;
        }
      }
      EXPECT_EQ(local, S / cp);
    }
    for (const int c : covered) EXPECT_EQ(c, 1) << cp;
    for (const long long w : work) EXPECT_EQ(w, work.front()) << cp;
  }
}
