// Attention by blocks of keys (kernels/attention_block.hpp) against the whole-sequence
// reference (attention_forward / attention_backward, themselves checked against the
// definition and finite differences in transformer_test.cpp): the keys cut into blocks of
// scattered positions, taken in any order, merge into the same outputs, and the blocks'
// gradients add up to the same gradients; a query subset (a context rank's rows) gets its
// rows of them. Causal and under a sliding window, with grouped keys and values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_block.hpp"
#include "kernels/transformer.hpp"
#include "tests/kernels/gradient_check.hpp"

using namespace hetflow::kernels;
using namespace hetflow::test_support;

namespace {

struct Shape {
  int B = 2, T = 24, NH = 4, NKV = 2, HS = 8;
  int window = 0;
};

// Rows `positions` of a [B, T, heads, HS] array, as a [B, positions, heads, HS] one.
Vec rows_of(const Vec& a, const Shape& s, int heads, const std::vector<int>& positions) {
  const size_t width = static_cast<size_t>(heads * s.HS);
  Vec out(static_cast<size_t>(s.B) * positions.size() * width);
  for (int b = 0; b < s.B; ++b) {
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* from = a.data() + (static_cast<size_t>(b * s.T + positions[i])) * width;
      std::copy(from, from + width, out.data() + (static_cast<size_t>(b) * positions.size() + i) * width);
    }
  }
  return out;
}

// The whole sequence's positions cut into `blocks` blocks: a context rank's two runs each
// (chunks r and 2 blocks - 1 - r of 2 blocks), as ring attention's ranks hold them.
std::vector<std::vector<int>> context_blocks(int T, int blocks) {
  const int L = T / (2 * blocks);
  std::vector<std::vector<int>> out(static_cast<size_t>(blocks));
  for (int r = 0; r < blocks; ++r) {
    for (const int chunk : {r, 2 * blocks - 1 - r}) {
      for (int i = 0; i < L; ++i) out[static_cast<size_t>(r)].push_back(chunk * L + i);
    }
  }
  return out;
}

void expect_near(const Vec& got, const Vec& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

struct Case {
  Shape s;
  int blocks;
  std::vector<int> order;  // the blocks in the order a rank meets them
};

std::vector<Case> cases() {
  return {{{}, 2, {0, 1}},
          {{}, 3, {2, 0, 1}},
          {{2, 24, 4, 2, 8, 5}, 3, {1, 2, 0}},          // a window shorter than a block's runs
          {{1, 32, 6, 3, 4, 0}, 4, {3, 2, 1, 0}},        // a ring's order from rank 3
          {{1, 16, 2, 2, 4, 1}, 2, {1, 0}}};             // one key: the query's own
}

TEST(AttentionBlocks, MergedBlocksGiveTheWholeAttentionForEveryQueryRow) {
  for (const Case& c : cases()) {
    const Shape& s = c.s;
    std::mt19937 rng(21);
    const size_t qn = static_cast<size_t>(s.B * s.T * s.NH * s.HS), kvn = static_cast<size_t>(s.B * s.T * s.NKV * s.HS);
    const Vec q = random_vec(qn, rng, -2, 2), k = random_vec(kvn, rng, -2, 2), v = random_vec(kvn, rng);
    Vec want(qn), probs(static_cast<size_t>(s.B * s.NH * s.T * s.T));
    attention_forward(want.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
    const auto blocks = context_blocks(s.T, c.blocks);
    for (int rank = 0; rank < c.blocks; ++rank) {  // each rank's queries: its own block's rows
      const std::vector<int>& qpos = blocks[static_cast<size_t>(rank)];
      const int Tq = static_cast<int>(qpos.size());
      const Vec qr = rows_of(q, s, s.NH, qpos);
      Vec out(qr.size(), 0.0f), lse(static_cast<size_t>(s.B * s.NH * Tq), -std::numeric_limits<float>::infinity());
      Vec block_out(qr.size()), block_lse(lse.size());
      for (const int b : c.order) {
        const std::vector<int>& kpos = blocks[static_cast<size_t>(b)];
        const int Tk = static_cast<int>(kpos.size());
        attention_block_forward(block_out.data(), block_lse.data(), qr.data(), rows_of(k, s, s.NKV, kpos).data(),
                                rows_of(v, s, s.NKV, kpos).data(), qpos.data(), kpos.data(), s.B, Tq, Tk, s.NH, s.NKV,
                                s.HS, s.window);
        attention_block_merge(out.data(), lse.data(), block_out.data(), block_lse.data(), s.B, Tq, s.NH, s.HS);
      }
      const std::string what = std::to_string(c.blocks) + " blocks, window " + std::to_string(s.window) + ", rank " +
                               std::to_string(rank);
      expect_near(out, rows_of(want, s, s.NH, qpos), 2e-6, what + ": the output");
      // The log-sum-exp, by its definition from the scores (double).
      for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
          for (int i = 0; i < Tq; ++i) {
            const int t = qpos[static_cast<size_t>(i)];
            double sum = 0;
            for (int j = 0; j <= t; ++j) {
              if (s.window > 0 && t - j >= s.window) continue;
              double dot = 0;
              for (int d = 0; d < s.HS; ++d) {
                dot += static_cast<double>(q[static_cast<size_t>(((b * s.T + t) * s.NH + h) * s.HS + d)]) *
                       k[static_cast<size_t>(((b * s.T + j) * s.NKV + h / (s.NH / s.NKV)) * s.HS + d)];
              }
              sum += std::exp(dot / std::sqrt(static_cast<double>(s.HS)));
            }
            ASSERT_NEAR(lse[static_cast<size_t>((b * s.NH + h) * Tq + i)], std::log(sum), 2e-5) << what;
          }
        }
      }
    }
  }
}

// A block none of whose keys a query sees leaves it as it was: -inf and zeros, then merged
// away by the first block it does see.
TEST(AttentionBlocks, ABlockOfOnlyFutureKeysIsEmpty) {
  const Shape s{1, 8, 2, 1, 4};
  std::mt19937 rng(22);
  const std::vector<int> qpos{0, 1}, kpos{4, 5, 6};
  const Vec q = random_vec(static_cast<size_t>(2 * s.NH * s.HS), rng), k = random_vec(static_cast<size_t>(3 * s.HS), rng);
  Vec out(q.size(), 1.0f), lse(static_cast<size_t>(s.NH * 2), 1.0f);
  attention_block_forward(out.data(), lse.data(), q.data(), k.data(), k.data(), qpos.data(), kpos.data(), 1, 2, 3, s.NH,
                          s.NKV, s.HS, 0);
  for (const float o : out) EXPECT_EQ(o, 0.0f);
  for (const float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  Vec dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(k.size(), 0.0f), delta(lse.size(), 0.0f);
  attention_block_backward(dq.data(), dk.data(), dv.data(), q.data(), lse.data(), delta.data(), q.data(), k.data(),
                           k.data(), qpos.data(), kpos.data(), 1, 2, 3, s.NH, s.NKV, s.HS, 0);
  for (const Vec* g : {&dq, &dk, &dv}) {
    for (const float x : *g) EXPECT_EQ(x, 0.0f);
  }
}

TEST(AttentionBlocks, BlocksGradientsAddUpToTheWholeAttentionsGradients) {
  for (const Case& c : cases()) {
    const Shape& s = c.s;
    std::mt19937 rng(23);
    const size_t qn = static_cast<size_t>(s.B * s.T * s.NH * s.HS), kvn = static_cast<size_t>(s.B * s.T * s.NKV * s.HS);
    const Vec q = random_vec(qn, rng, -2, 2), k = random_vec(kvn, rng, -2, 2), v = random_vec(kvn, rng),
              dout = random_vec(qn, rng);
    Vec out(qn), probs(static_cast<size_t>(s.B * s.NH * s.T * s.T));
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
    Vec dq(qn, 0.0f), dk(kvn, 0.0f), dv(kvn, 0.0f);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(), v.data(), s.B,
                       s.T, s.NH, s.NKV, s.HS, s.window);
    // Every rank's queries against every block; each block's key gradients summed over the ranks.
    const auto blocks = context_blocks(s.T, c.blocks);
    std::vector<Vec> dk_blocks, dv_blocks;
    for (const auto& kpos : blocks) {
      dk_blocks.emplace_back(static_cast<size_t>(s.B) * kpos.size() * static_cast<size_t>(s.NKV * s.HS), 0.0f);
      dv_blocks.push_back(dk_blocks.back());
    }
    const std::string what = std::to_string(c.blocks) + " blocks, window " + std::to_string(s.window);
    for (int rank = 0; rank < c.blocks; ++rank) {
      const std::vector<int>& qpos = blocks[static_cast<size_t>(rank)];
      const int Tq = static_cast<int>(qpos.size());
      const Vec qr = rows_of(q, s, s.NH, qpos), dor = rows_of(dout, s, s.NH, qpos);
      // The forward's merged output and log-sum-exp, as the backward has them.
      Vec o(qr.size(), 0.0f), lse(static_cast<size_t>(s.B * s.NH * Tq), -std::numeric_limits<float>::infinity());
      Vec bo(qr.size()), bl(lse.size());
      for (const int b : c.order) {
        const auto& kpos = blocks[static_cast<size_t>(b)];
        attention_block_forward(bo.data(), bl.data(), qr.data(), rows_of(k, s, s.NKV, kpos).data(),
                                rows_of(v, s, s.NKV, kpos).data(), qpos.data(), kpos.data(), s.B, Tq,
                                static_cast<int>(kpos.size()), s.NH, s.NKV, s.HS, s.window);
        attention_block_merge(o.data(), lse.data(), bo.data(), bl.data(), s.B, Tq, s.NH, s.HS);
      }
      Vec delta(lse.size());
      attention_block_delta(delta.data(), dor.data(), o.data(), s.B, Tq, s.NH, s.HS);
      Vec dqr(qr.size(), 0.0f);
      for (const int b : c.order) {
        const auto& kpos = blocks[static_cast<size_t>(b)];
        attention_block_backward(dqr.data(), dk_blocks[static_cast<size_t>(b)].data(),
                                 dv_blocks[static_cast<size_t>(b)].data(), dor.data(), lse.data(), delta.data(),
                                 qr.data(), rows_of(k, s, s.NKV, kpos).data(), rows_of(v, s, s.NKV, kpos).data(),
                                 qpos.data(), kpos.data(), s.B, Tq, static_cast<int>(kpos.size()), s.NH, s.NKV, s.HS,
                                 s.window);
      }
      expect_near(dqr, rows_of(dq, s, s.NH, qpos), 2e-5, what + ", rank " + std::to_string(rank) + ": dq");
    }
    for (int b = 0; b < c.blocks; ++b) {
      const auto& kpos = blocks[static_cast<size_t>(b)];
      expect_near(dk_blocks[static_cast<size_t>(b)], rows_of(dk, s, s.NKV, kpos), 2e-5, what + ": dk of block " + std::to_string(b));
      expect_near(dv_blocks[static_cast<size_t>(b)], rows_of(dv, s, s.NKV, kpos), 2e-5, what + ": dv of block " + std::to_string(b));
    }
  }
}

}  // namespace
