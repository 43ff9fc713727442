// Pipeline schedules, each checked against an oracle written independently of the code under
// test: a greedy count-based 1F1B, Megatron's interleaved loop with its per-chunk queues, the
// structural invariants every schedule must keep, and a dependency-respecting replay whose
// makespans are compared with the closed-form bubble of each schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "model/error.hpp"
#include "partition/layout.hpp"
#include "partition/schedule.hpp"

using namespace hetflow::partition;
using hetflow::InputError;

namespace {

ScheduledOp F(int mb, int chunk = 0) { return {OpKind::F, mb, chunk}; }
ScheduledOp B(int mb, int chunk = 0) { return {OpKind::B, mb, chunk}; }
ScheduledOp W(int mb, int chunk = 0) { return {OpKind::W, mb, chunk}; }

std::string show(const std::vector<ScheduledOp>& ops) {
  std::string out;
  for (const ScheduledOp& op : ops) {
    out += op.kind == OpKind::F ? 'F' : op.kind == OpKind::B ? 'B' : 'W';
    out += std::to_string(op.microbatch);
    if (op.chunk != 0) out += "." + std::to_string(op.chunk);
    out += ' ';
  }
  return out;
}

RankPrograms build(const std::string& name, int p, int m, int v) {
  return schedule_by_name(name).build(p, m, v);
}

// Every size a test walks through: (p, m, v).
std::vector<std::tuple<int, int, int>> sizes_for(const Schedule& s) {
  std::vector<std::tuple<int, int, int>> out;
  if (s.interleaved && s.min_chunks >= 2) {  // Megatron's interleaving: m a multiple of p
    for (int p : {2, 3, 4})
      for (int v : {2, 3})
        for (int k : {1, 2, 3}) out.emplace_back(p, k * p, v);
  } else if (s.interleaved) {  // any m, any v
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 9; ++m)
        for (int v = 1; v <= 3; ++v) out.emplace_back(p, m, v);
  } else {
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) out.emplace_back(p, m, 1);
  }
  return out;
}

// --- Oracle: 1F1B as a greedy rule on counts. Rank r may hold at most p - r micro-batches;
// it runs the next forward whenever one is left and the cap allows, otherwise the oldest
// backward.
std::vector<ScheduledOp> one_f_one_b_oracle(int p, int r, int m) {
  std::vector<ScheduledOp> ops;
  int forwards = 0, backwards = 0;
  while (backwards < m) {
    if (forwards < m && forwards - backwards < p - r) {
      ops.push_back(F(forwards++));
    } else {
      ops.push_back(B(backwards++));
    }
  }
  return ops;
}

// --- Oracle: Megatron-LM's forward_backward_pipelining_with_interleaving, transcribed as a
// loop over "virtual micro-batch ids" with its get_model_chunk_id helper; which micro-batch a
// chunk runs comes from per-chunk FIFO queues (Megatron's input_tensors / output_tensors
// lists), not from a closed form.
std::vector<ScheduledOp> interleaved_oracle(int p, int r, int m, int v) {
  const int num_model_chunks = v;
  const int total_num_microbatches = m * num_model_chunks;
  int num_warmup_microbatches = 0;
  if (m == p) {
    num_warmup_microbatches = total_num_microbatches;
  } else {
    num_warmup_microbatches = (p - r - 1) * 2;
    num_warmup_microbatches += (num_model_chunks - 1) * p;
    num_warmup_microbatches = std::min(num_warmup_microbatches, total_num_microbatches);
  }
  const int num_microbatches_remaining = total_num_microbatches - num_warmup_microbatches;

  const auto get_model_chunk_id = [&](int microbatch_id, bool forward) {
    const int microbatch_id_in_group = microbatch_id % (p * num_model_chunks);
    int model_chunk_id = microbatch_id_in_group / p;
    if (!forward) model_chunk_id = num_model_chunks - model_chunk_id - 1;
    return model_chunk_id;
  };
  std::vector<int> forwards_run(v, 0);   // next micro-batch a chunk's forward takes
  std::vector<int> backwards_run(v, 0);  // oldest micro-batch a chunk still has to backprop
  std::vector<ScheduledOp> ops;
  const auto forward_step_helper = [&](int microbatch_id) {
    const int chunk = get_model_chunk_id(microbatch_id, true);
    ops.push_back(F(forwards_run[chunk]++, chunk));
  };
  const auto backward_step_helper = [&](int microbatch_id) {
    const int chunk = get_model_chunk_id(microbatch_id, false);
    ops.push_back(B(backwards_run[chunk]++, chunk));
  };

  for (int k = 0; k < num_warmup_microbatches; ++k) forward_step_helper(k);
  for (int k = 0; k < num_microbatches_remaining; ++k) {
    forward_step_helper(k + num_warmup_microbatches);
    backward_step_helper(k);
  }
  for (int k = num_microbatches_remaining; k < total_num_microbatches; ++k) {
    backward_step_helper(k);
  }
  return ops;
}

// --- Oracle: PyTorch's ScheduleLoopedBFS._calculate_single_rank_operations, transcribed in
// its own terms: the rank's stage indices rank, rank + p, ...; every micro-batch's forward of
// each stage in turn; then the stages reversed, each with its micro-batches reversed. (PyTorch
// pads the list with idle slots for its time-step printout; they order nothing.) The chunk of
// a stage index is index / p.
std::vector<ScheduledOp> looped_bfs_oracle(int p, int rank, int m, int n_local_stages) {
  std::vector<int> stage_indices;
  for (int s = rank; s < p * n_local_stages; s += p) stage_indices.push_back(s);
  std::vector<ScheduledOp> rank_ops;
  for (const int stage_index : stage_indices) {
    for (int mb_index = 0; mb_index < m; ++mb_index) rank_ops.push_back(F(mb_index, stage_index / p));
  }
  for (auto it = stage_indices.rbegin(); it != stage_indices.rend(); ++it) {
    for (int mb_index = m - 1; mb_index >= 0; --mb_index) rank_ops.push_back(B(mb_index, *it / p));
  }
  return rank_ops;
}

// --- Replay: each rank runs its program in order; an op starts when the rank is free and
// its cross-rank inputs are done. Virtual stage s = chunk * p + rank. Integer durations.
struct Durations {
  long f = 1, b = 1, w = 1;
};

// Makespan, or nullopt when the programs deadlock (or reference an op that never runs).
std::optional<long> replay(const RankPrograms& programs, int m, int v, Durations d) {
  const int p = static_cast<int>(programs.size());
  const int stages = p * v;
  // done[kind][stage][mb]: finish time, -1 while not run.
  std::vector<std::vector<std::vector<long>>> done(
      3, std::vector<std::vector<long>>(stages, std::vector<long>(m, -1)));
  const auto at = [&](OpKind k, int s, int mb) -> long& {
    return done[static_cast<int>(k)][s][mb];
  };
  std::vector<std::size_t> next(p, 0);
  std::vector<long> free_at(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < programs[r].size()) {
        const ScheduledOp& op = programs[r][next[r]];
        const int s = op.chunk * p + r;
        std::vector<long> inputs;
        long duration = 0;
        switch (op.kind) {
          case OpKind::F:
            if (s > 0) inputs.push_back(at(OpKind::F, s - 1, op.microbatch));
            duration = d.f;
            break;
          case OpKind::B:
            if (s + 1 < stages) inputs.push_back(at(OpKind::B, s + 1, op.microbatch));
            inputs.push_back(at(OpKind::F, s, op.microbatch));
            duration = d.b;
            break;
          case OpKind::W:
            inputs.push_back(at(OpKind::B, s, op.microbatch));
            duration = d.w;
            break;
        }
        if (std::any_of(inputs.begin(), inputs.end(), [](long t) { return t < 0; })) break;
        long start = free_at[r];
        for (long t : inputs) start = std::max(start, t);
        free_at[r] = start + duration;
        at(op.kind, s, op.microbatch) = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < programs[r].size()) return std::nullopt;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

TEST(Schedule, RegistryOrderAndLookup) {
  std::vector<std::string> names;
  for (const Schedule& s : schedules()) {
    names.push_back(s.name);
    EXPECT_NE(s.build, nullptr) << s.name;
    EXPECT_FALSE(s.description.empty()) << s.name;
    EXPECT_EQ(&schedule_by_name(s.name), &s);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"gpipe", "1f1b", "interleaved", "1f1b-split-w", "bfs"}));
  EXPECT_TRUE(schedule_by_name("interleaved").interleaved);
  EXPECT_TRUE(schedule_by_name("bfs").interleaved);
  EXPECT_EQ(schedule_by_name("interleaved").min_chunks, 2);
  EXPECT_EQ(schedule_by_name("bfs").min_chunks, 1);
  EXPECT_FALSE(schedule_by_name("1f1b").interleaved);
  EXPECT_TRUE(schedule_by_name("1f1b-split-w").splits_backward);
  EXPECT_FALSE(schedule_by_name("1f1b").splits_backward);
}

TEST(Schedule, BfsMatchesPyTorchsLoopedBfs) {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 9; ++m)
      for (int v = 1; v <= 3; ++v) {
        const RankPrograms programs = build("bfs", p, m, v);
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(show(programs[r]), show(looped_bfs_oracle(p, r, m, v)))
              << "p=" << p << " m=" << m << " v=" << v << " r=" << r;
        }
      }
}

TEST(Schedule, BfsHoldsEveryMicroBatchOfEachChunk) {
  // Breadth-first keeps GPipe's memory: all m forwards of a chunk run before its first backward.
  const auto peak = peak_in_flight(build("bfs", 3, 5, 2), 2);
  EXPECT_EQ(peak, (std::vector<std::vector<int>>(3, std::vector<int>{5, 5})));
}

TEST(Schedule, GpipeRunsAllForwardsThenAllBackwards) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      std::vector<ScheduledOp> expected;
      for (int i = 0; i < m; ++i) expected.push_back(F(i));
      for (int i = 0; i < m; ++i) expected.push_back(B(i));
      const RankPrograms programs = build("gpipe", p, m, 1);
      ASSERT_EQ(programs.size(), static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(programs[r], expected) << "p=" << p << " m=" << m << " r=" << r;
      }
    }
  }
}

TEST(Schedule, OneFOneBMatchesTheGreedyCountOracle) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const RankPrograms programs = build("1f1b", p, m, 1);
      ASSERT_EQ(programs.size(), static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        const std::vector<ScheduledOp> expected = one_f_one_b_oracle(p, r, m);
        EXPECT_EQ(programs[r], expected) << "p=" << p << " m=" << m << " r=" << r << "\n got "
                                         << show(programs[r]) << "\nwant " << show(expected);
      }
    }
  }
}

TEST(Schedule, OneFOneBHandWrittenExample) {
  // p = 4, m = 6, rank 1: warm-up 2 forwards, 4 steady pairs, 2 cool-down backwards.
  const RankPrograms programs = build("1f1b", 4, 6, 1);
  EXPECT_EQ(programs[1], (std::vector<ScheduledOp>{F(0), F(1), F(2), B(0), F(3), B(1), F(4),
                                                   B(2), F(5), B(3), B(4), B(5)}));
  EXPECT_EQ(programs[3], (std::vector<ScheduledOp>{F(0), B(0), F(1), B(1), F(2), B(2), F(3),
                                                   B(3), F(4), B(4), F(5), B(5)}));
}

TEST(Schedule, InterleavedMatchesMegatronsLoop) {
  for (int p : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int k : {1, 2, 3}) {
        const int m = k * p;
        const RankPrograms programs = build("interleaved", p, m, v);
        ASSERT_EQ(programs.size(), static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r) {
          const std::vector<ScheduledOp> expected = interleaved_oracle(p, r, m, v);
          EXPECT_EQ(programs[r], expected)
              << "p=" << p << " v=" << v << " m=" << m << " r=" << r << "\n got "
              << show(programs[r]) << "\nwant " << show(expected);
        }
      }
    }
  }
}

TEST(Schedule, OneFOneBSplitWHandWrittenExample) {
  // p = 3, m = 4. Rank 0: 2 warm-up forwards, 2 steady F B W triples, then B W, B W.
  const RankPrograms programs = build("1f1b-split-w", 3, 4, 1);
  EXPECT_EQ(programs[0], (std::vector<ScheduledOp>{F(0), F(1), F(2), B(0), W(0), F(3), B(1),
                                                   W(1), B(2), W(2), B(3), W(3)}));
  EXPECT_EQ(programs[2], (std::vector<ScheduledOp>{F(0), B(0), W(0), F(1), B(1), W(1), F(2),
                                                   B(2), W(2), F(3), B(3), W(3)}));
}

TEST(Schedule, EveryOpExactlyOnceInOrderOnItsRank) {
  for (const Schedule& s : schedules()) {
    for (const auto& [p, m, v] : sizes_for(s)) {
      const RankPrograms programs = s.build(p, m, v);
      ASSERT_EQ(programs.size(), static_cast<std::size_t>(p)) << s.name;
      for (int r = 0; r < p; ++r) {
        const std::string where = s.name + " p=" + std::to_string(p) + " m=" +
                                  std::to_string(m) + " v=" + std::to_string(v) +
                                  " r=" + std::to_string(r);
        // position[kind][(mb, chunk)] = index in the program.
        std::map<std::pair<int, int>, int> position[3];
        const std::vector<ScheduledOp>& ops = programs[r];
        for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
          const ScheduledOp& op = ops[i];
          ASSERT_GE(op.microbatch, 0) << where;
          ASSERT_LT(op.microbatch, m) << where;
          ASSERT_GE(op.chunk, 0) << where;
          ASSERT_LT(op.chunk, v) << where;
          const bool fresh =
              position[static_cast<int>(op.kind)].emplace(std::pair(op.microbatch, op.chunk), i)
                  .second;
          EXPECT_TRUE(fresh) << where << ": duplicate op at " << i << ": " << show(ops);
        }
        const std::size_t pairs = static_cast<std::size_t>(m) * v;
        EXPECT_EQ(position[0].size(), pairs) << where;
        EXPECT_EQ(position[1].size(), pairs) << where;
        EXPECT_EQ(position[2].size(), s.splits_backward ? pairs : 0u) << where;
        EXPECT_EQ(ops.size(), pairs * (s.splits_backward ? 3 : 2)) << where;
        for (const auto& [key, b_at] : position[1]) {
          ASSERT_TRUE(position[0].count(key)) << where;
          EXPECT_LT(position[0].at(key), b_at) << where << " mb=" << key.first;
          if (s.splits_backward) {
            ASSERT_TRUE(position[2].count(key)) << where;
            EXPECT_LT(b_at, position[2].at(key)) << where << " mb=" << key.first;
          }
        }
      }
    }
  }
}

TEST(Schedule, PeakInFlight) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const auto gpipe = peak_in_flight(build("gpipe", p, m, 1), 1);
      const auto one = peak_in_flight(build("1f1b", p, m, 1), 1);
      const auto split = peak_in_flight(build("1f1b-split-w", p, m, 1), 1);
      ASSERT_EQ(gpipe.size(), static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        const std::string where =
            "p=" + std::to_string(p) + " m=" + std::to_string(m) + " r=" + std::to_string(r);
        ASSERT_EQ(gpipe[r].size(), 1u);
        EXPECT_EQ(gpipe[r][0], m) << where;
        EXPECT_EQ(one[r][0], std::min(p - r, m)) << where;
        EXPECT_EQ(split[r][0], std::min(p - r, m)) << where;
      }
    }
  }
}

TEST(Schedule, PeakInFlightCountsPerChunkAndReleasesAtW) {
  // Hand-made programs: chunk 1 holds two micro-batches at once, chunk 0 one at a time.
  const RankPrograms two_chunks = {{F(0, 0), F(0, 1), F(1, 1), B(0, 1), B(0, 0), F(1, 0),
                                    B(1, 1), B(1, 0)}};
  EXPECT_EQ(peak_in_flight(two_chunks, 2), (std::vector<std::vector<int>>{{1, 2}}));
  // With a W present on the rank, B no longer releases: F0 B0 F1 W0 holds 2.
  const RankPrograms split = {{F(0), B(0), F(1), W(0), B(1), W(1)}, {F(0), B(0), F(1), B(1)}};
  EXPECT_EQ(peak_in_flight(split, 1), (std::vector<std::vector<int>>{{2}, {1}}));
}

TEST(Schedule, ReplayNeverDeadlocks) {
  for (const Schedule& s : schedules()) {
    for (const auto& [p, m, v] : sizes_for(s)) {
      for (Durations d : {Durations{1, 1, 1}, Durations{1, 2, 1}, Durations{3, 1, 2}}) {
        EXPECT_TRUE(replay(s.build(p, m, v), m, v, d).has_value())
            << s.name << " p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(Schedule, ReplayDetectsADeadlock) {
  // Rank 0 waits for the backward of rank 1, which waits for rank 0's second forward.
  const RankPrograms bad = {{F(0), B(0), F(1), B(1)}, {F(1), F(0), B(0), B(1)}};
  EXPECT_FALSE(replay(bad, 2, 1, {}).has_value());
}

TEST(Schedule, GpipeAndOneFOneBMakespanIsTheClassicBubble) {
  // F = B = 1: makespan 2 (m + p - 1), i.e. bubble fraction (p - 1) / (m + p - 1).
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (const char* name : {"gpipe", "1f1b"}) {
        EXPECT_EQ(replay(build(name, p, m, 1), m, 1, {1, 1, 0}), 2L * (m + p - 1))
            << name << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(Schedule, InterleavedMakespanIsTheBubbleOverV) {
  // F = B = 1/v of a full stage per chunk. In chunk units (F = B = 1) the per-rank work is
  // 2 m v and Megatron's bubble is 2 (p - 1): makespan 2 m v + 2 (p - 1), i.e.
  // 2 m + 2 (p - 1) / v in full-stage units, bubble fraction (p - 1) / (v m + p - 1).
  for (int p : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int k : {1, 2, 3}) {
        const int m = k * p;
        EXPECT_EQ(replay(build("interleaved", p, m, v), m, v, {1, 1, 0}),
                  2L * m * v + 2L * (p - 1))
            << "p=" << p << " v=" << v << " m=" << m;
      }
    }
  }
}

TEST(Schedule, BfsMakespanClosedForm) {
  // F = B = 1. Rank 0 starts chunk c's forwards when it has ended chunk c - 1's (m units) and
  // rank p - 1 has ended chunk c - 1's first forward (p units after chunk c - 1 began on rank
  // 0): chunks begin max(m, p) apart; the last forward ends (v - 1) max(m, p) + m + p - 1 in,
  // and the backwards mirror it. With m >= p that is interleaving's 2 m v + 2 (p - 1); with
  // v = 1, GPipe's 2 (m + p - 1).
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 9; ++m)
      for (int v = 1; v <= 3; ++v) {
        const long expected = 2L * ((v - 1) * std::max(m, p) + m + p - 1);
        EXPECT_EQ(replay(build("bfs", p, m, v), m, v, {1, 1, 0}), expected) << "p=" << p << " m=" << m << " v=" << v;
      }
}

TEST(Schedule, SplitWMakespanWithEqualStageTimes) {
  // F = B = W = 1: 1F1B with a fused backward (B = 2) takes 3 (m + p - 1); splitting W off
  // the chain of gradients leaves a bubble of (p - 1)(T_F + T_B) = 2 (p - 1).
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      EXPECT_EQ(replay(build("1f1b", p, m, 1), m, 1, {1, 2, 0}), 3L * (m + p - 1))
          << "1f1b p=" << p << " m=" << m;
      EXPECT_EQ(replay(build("1f1b-split-w", p, m, 1), m, 1, {1, 1, 1}), 3L * m + 2L * (p - 1))
          << "1f1b-split-w p=" << p << " m=" << m;
    }
  }
}

TEST(Schedule, BadInputsNameTheirField) {
  const auto field_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), kOptions);  // the library names data; tools/ maps it to options
      EXPECT_EQ(e.line(), 0);
      EXPECT_FALSE(e.message().empty());
      return e.field();
    }
    return "(no InputError)";
  };
  EXPECT_EQ(field_of([] { build("interleaved", 4, 6, 2); }), "microbatches");
  EXPECT_EQ(field_of([] { build("interleaved", 3, 4, 2); }), "microbatches");
  EXPECT_EQ(field_of([] { build("interleaved", 4, 8, 1); }), "virtual_stages");
  EXPECT_EQ(field_of([] { build("gpipe", 4, 8, 2); }), "virtual_stages");
  EXPECT_EQ(field_of([] { build("1f1b", 4, 8, 2); }), "virtual_stages");
  EXPECT_EQ(field_of([] { build("1f1b-split-w", 4, 8, 2); }), "virtual_stages");
  EXPECT_EQ(field_of([] { build("1f1b", 4, 0, 1); }), "microbatches");
  EXPECT_EQ(field_of([] { schedule_by_name("zero-bubble"); }), "schedule");
  try {
    schedule_by_name("zero-bubble");
  } catch (const InputError& e) {
    for (const Schedule& s : schedules()) {
      EXPECT_NE(e.message().find(s.name), std::string::npos) << e.message();
    }
    EXPECT_NE(e.message().find("zero-bubble"), std::string::npos) << e.message();
  }
}
