// The decoder math on its ops (exec/decoder_ops.hpp). Two oracles:
//  - Guarded memory, on the CPU: every array the ops hand out is a page range kept
//    PROT_NONE except while one of the ops runs, so a read or write of ops memory by the
//    decoder's own code faults (it would be a read of device memory from the host on a GPU).
//    The math is the CPU reference's, so results must be the CPU ops' bits.
//  - The CUDA ops against the CPU ops (needs a GPU; skipped, saying so, without one): the same
//    two-chunk pipeline, GPT-2 and LLaMA, every recomputation mode and the split backward,
//    within the kernels' fp32 tolerance, and bitwise equal run to run; and tensor parallelism
//    2 (both ranks on one GPU, their all-reduces through the host), the whole model and a
//    pipeline of chunks with the plan's boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <random>
#include <string>

#include "exec/cuda_decoder_ops.hpp"
#include "exec/decoder.hpp"
#include "exec_test_util.hpp"
#include "guarded_ops.hpp"
#include "kernels/matmul.hpp"
#include "model/error.hpp"
#include "model/zoo.hpp"

namespace hetflow {
namespace {

using exec::OpsFloats;
using exec::OpsInts;
using partition::Recompute;
using test_support::GuardedOps;

model::Network odd_gpt() {
  return model::network_from_spec("gpt:layers=3,hidden=36,heads=3,seq=13,vocab=97", model::Precision::fp32);
}
model::Network odd_llama() {
  return model::network_from_spec("llama:layers=3,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                                  model::Precision::fp32);
}
// Qwen3's attention: 6 heads of 10 over a hidden of 48, q and k RMS-normalised per head.
model::Network odd_qwen3() {
  model::TransformerConfig c = *odd_llama().architecture;
  c.head_dim = 10;
  c.qk_norm = true;
  return model::make_transformer(c, model::Precision::fp32);
}

// Token ids (i * mul + add) mod vocabulary, i < n: every test's inputs (mul 37, add 5) and
// targets (53, 2).
std::vector<int> token_pattern(size_t n, size_t mul, size_t add, int vocabulary) {
  std::vector<int> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int>((i * mul + add) % static_cast<size_t>(vocabulary));
  return out;
}

// What a two-chunk pipeline of the whole model computes for one micro-batch, on the host.
struct PipelineRun {
  double loss = 0;
  std::vector<float> boundary, dboundary, grads_first, grads_last;
};

std::vector<float> download(const exec::DecoderOps& ops, const OpsFloats& a) {
  std::vector<float> host(a.size());
  ops.download(host.data(), a.data(), a.size());
  return host;
}

OpsFloats upload(const exec::DecoderOps& ops, const std::vector<float>& host) {
  OpsFloats a = ops.floats(host.size());
  ops.upload(a.data(), host.data(), host.size());
  return a;
}

// Chunk one: the embedding and block 1; chunk two: blocks 2 and 3 and the head. Weights are
// the seeded initialisation plus noise, so every part of the network carries gradient.
// `between` sees chunk one's stash between the forwards and the backwards.
PipelineRun run_pipeline(const exec::DecoderOps& ops, const model::Network& net, Recompute recompute, bool split,
                         const std::function<void(const exec::DecoderChunk&, exec::DecoderChunk::Stash&)>& between = {}) {
  const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
  const int layers = static_cast<int>(net.layers.size());
  const exec::DecoderChunk first(shape, 0, 2, recompute, 0, 1, ops), last(shape, 2, layers, recompute, 0, 1, ops);
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  const auto weights = [&](const exec::DecoderChunk& chunk, std::uint64_t seed) {
    std::vector<float> host(chunk.params().count);
    exec::init_params(chunk.params(), shape, seed, host.data());
    for (float& p : host) p += noise(rng);
    return upload(ops, host);
  };
  const OpsFloats w1 = weights(first, 3), w2 = weights(last, 4);
  const OpsFloats g1 = ops.zeros(w1.size()), g2 = ops.zeros(w2.size());
  const int samples = 2;
  const size_t tokens_n = static_cast<size_t>(samples * shape.S);
  const std::vector<int> tokens = token_pattern(tokens_n, 37, 5, shape.V), targets = token_pattern(tokens_n, 53, 2, shape.V);
  const OpsFloats boundary = ops.floats(tokens_n * static_cast<size_t>(shape.C)), dboundary = ops.floats(boundary.size());

  exec::DecoderChunk::Input in1;
  in1.samples = samples;
  in1.tokens = tokens.data();
  in1.output = boundary.data();
  exec::DecoderChunk::Input in2;
  in2.samples = samples;
  in2.input = boundary.data();
  in2.targets = targets.data();
  in2.loss_scale = 1.0f / static_cast<float>(tokens_n);
  PipelineRun run;
  double unused = 0;
  auto s1 = first.forward(w1.data(), in1, unused);
  auto s2 = last.forward(w2.data(), in2, run.loss);
  if (between) between(first, *s1);
  last.backward(*s2, w2.data(), g2.data(), nullptr, dboundary.data(), split);
  first.backward(*s1, w1.data(), g1.data(), dboundary.data(), nullptr, split);
  if (split) {
    last.backward_weight(*s2, g2.data());
    first.backward_weight(*s1, g1.data());
  }
  run.boundary = download(ops, boundary);
  run.dboundary = download(ops, dboundary);
  run.grads_first = download(ops, g1);
  run.grads_last = download(ops, g2);
  return run;
}

struct Mode {
  Recompute recompute;
  bool split;
};
const Mode kModes[] = {{Recompute::none, false},
                       {Recompute::selective, false},
                       {Recompute::full, false},
                       {Recompute::none, true},
                       {Recompute::full, true}};

std::string describe(const model::Network& net, const Mode& m) {
  return net.name + " recompute " + std::string(partition::to_string(m.recompute)) + (m.split ? " split" : "");
}

// ---------------------------------------------------------------------------------------------
// Activation offload: a stash's activations to host memory, released in the ops' memory, and
// back; the backward then computes the same bits, and refuses a stash still in host memory.

TEST(DecoderOps, AStashToTheHostAndBackGivesTheSameBitsAndLeavesTheDeviceMeanwhile) {
  for (const model::Network& net : {odd_gpt(), odd_llama(), odd_qwen3()}) {
    for (const Mode& m : kModes) {
      const PipelineRun want = run_pipeline(exec::cpu_decoder_ops(), net, m.recompute, m.split);
      const GuardedOps guarded;
      const auto offload = [&](const exec::DecoderChunk& chunk, exec::DecoderChunk::Stash& stash) {
        const size_t floats = exec::DecoderChunk::stash_floats(stash);
        ASSERT_GT(floats, 0u);
        const size_t before = guarded.memory().live_bytes();
        exec::DecoderChunk::stash_to_host(stash, guarded);
        EXPECT_TRUE(exec::DecoderChunk::stash_on_host(stash));
        EXPECT_EQ(exec::DecoderChunk::stash_floats(stash), 0u);
        // Arrays shared between fields were counted once per field, and freed once.
        EXPECT_LT(guarded.memory().live_bytes(), before) << describe(net, m);
        EXPECT_GE(before - guarded.memory().live_bytes(), sizeof(float)) << describe(net, m);
        const OpsFloats w = guarded.zeros(chunk.params().count), g = guarded.zeros(chunk.params().count);
        EXPECT_THROW(chunk.backward(stash, w.data(), g.data(), nullptr, nullptr, m.split), std::logic_error);
        exec::DecoderChunk::stash_to_device(stash, guarded);
        EXPECT_FALSE(exec::DecoderChunk::stash_on_host(stash));
        EXPECT_EQ(exec::DecoderChunk::stash_floats(stash), floats) << describe(net, m);
        EXPECT_THROW(exec::DecoderChunk::stash_to_device(stash, guarded), std::logic_error);
      };
      const PipelineRun got = run_pipeline(guarded, net, m.recompute, m.split, offload);
      EXPECT_EQ(guarded.live_ranges(), 0u) << describe(net, m);
      EXPECT_EQ(got.loss, want.loss) << describe(net, m);
      EXPECT_EQ(got.dboundary, want.dboundary) << describe(net, m);
      EXPECT_EQ(got.grads_first, want.grads_first) << describe(net, m);
      EXPECT_EQ(got.grads_last, want.grads_last) << describe(net, m);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Guarded memory

TEST(DecoderOps, GuardedMemoryGivesTheCpuBitsAndIsOnlyTouchedByOps) {
  for (const model::Network& net : {odd_gpt(), odd_llama(), odd_qwen3()}) {
    for (const Mode& m : kModes) {
      const PipelineRun want = run_pipeline(exec::cpu_decoder_ops(), net, m.recompute, m.split);
      const GuardedOps guarded;
      const PipelineRun got = run_pipeline(guarded, net, m.recompute, m.split);
      EXPECT_EQ(guarded.live_ranges(), 0u) << describe(net, m) << ": arrays outlived their chunks";
      EXPECT_EQ(got.loss, want.loss) << describe(net, m);
      EXPECT_EQ(got.boundary, want.boundary) << describe(net, m);
      EXPECT_EQ(got.dboundary, want.dboundary) << describe(net, m);
      EXPECT_EQ(got.grads_first, want.grads_first) << describe(net, m);
      EXPECT_EQ(got.grads_last, want.grads_last) << describe(net, m);
      EXPECT_GT(want.loss, 0.0) << describe(net, m);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA

// |got - want| <= rtol |want| + atol max|want|, as tests/kernels/transformer_cuda_test.cpp.
// Within rtol of each value plus atol of the largest (defaults: fp32 sums through two blocks
// of another device's kernels).
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  double rtol = 2e-3, double atol = 2e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (const float w : want) largest = std::max(largest, std::fabs(static_cast<double>(w)));
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= rtol * std::fabs(static_cast<double>(want[i])) + atol * largest)) {
      if (bad++ == 0) ADD_FAILURE() << what << ": first difference at " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << " (of " << want.size() << ")";
}

TEST(DecoderOps, CudaMatchesTheCpuReference) {
  if (!kernels::cuda_built()) GTEST_SKIP() << "CUDA kernels not built: " << kernels::cuda_status();
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "skipped, needs a GPU: " << kernels::cuda_status();
  const exec::CudaDecoderOps cuda(0, nullptr);
  for (const model::Network& net : {odd_gpt(), odd_llama(), odd_qwen3()}) {
    for (const Mode& m : kModes) {
      const PipelineRun want = run_pipeline(exec::cpu_decoder_ops(), net, m.recompute, m.split);
      const PipelineRun got = run_pipeline(cuda, net, m.recompute, m.split);
      const PipelineRun again = run_pipeline(cuda, net, m.recompute, m.split);
      const std::string what = describe(net, m);
      EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::fabs(want.loss)) << what;
      expect_close(what + " boundary", got.boundary, want.boundary);
      expect_close(what + " boundary gradient", got.dboundary, want.dboundary);
      expect_close(what + " first chunk's gradients", got.grads_first, want.grads_first);
      expect_close(what + " last chunk's gradients", got.grads_last, want.grads_last);
      EXPECT_EQ(again.loss, got.loss) << what << ": not repeatable";
      EXPECT_EQ(again.grads_first, got.grads_first) << what << ": not repeatable";
      EXPECT_EQ(again.grads_last, got.grads_last) << what << ": not repeatable";
    }
  }
}

// Each ops counts the bytes of its arrays alive and the most at once; copies of a handle
// share the array, and the count falls when the last one goes.
TEST(DecoderOps, MemoryCountsEveryArrayUntilItsLastHandleGoes) {
  const exec::CpuDecoderOps ops;
  exec::OpsMemory& memory = ops.memory();
  EXPECT_EQ(memory.live_bytes(), 0u);
  {
    OpsFloats a = ops.floats(100);
    const OpsFloats b = ops.zeros(50);
    const int host[3] = {1, 2, 3};
    const exec::OpsInts c = ops.ints(host, 3);
    EXPECT_EQ(memory.live_bytes(), 153 * 4u);
    const OpsFloats shared = a;
    a = OpsFloats();
    EXPECT_EQ(memory.live_bytes(), 153 * 4u);  // `shared` still holds it
  }
  EXPECT_EQ(memory.live_bytes(), 0u);
  EXPECT_EQ(memory.peak_bytes(), 153 * 4u);
  memory.reset_peak();
  EXPECT_EQ(memory.peak_bytes(), 0u);
  const OpsFloats d = ops.floats(10);
  EXPECT_EQ(memory.peak_bytes(), 40u);
  EXPECT_EQ(exec::CpuDecoderOps().memory().live_bytes(), 0u);  // another ops counts its own
}

TEST(DecoderOps, CudaOpsSayWhyTheyCannotRun) {
  if (kernels::cuda_built() && kernels::cuda_device_count() > 0) {
    GTEST_SKIP() << "a GPU is visible: the no-device answer is not checkable here";
  }
  const exec::CudaDecoderOps cuda(0, nullptr);
  try {
    cuda.floats(16);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string want = kernels::cuda_built() ? "no CUDA device visible" : "no CUDA kernels";
    EXPECT_NE(std::string(e.what()).find("cudaMallocAsync on cuda:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_TRUE(cuda.floats(0).empty());  // nothing to allocate: no device needed
}

// Two tensor-parallel ranks' all-reduces through host memory: each rank downloads its floats,
// both meet, each gets the sum (or maximum) taken in rank order, as the CPU back end's.
class Rendezvous {
 public:
  std::vector<float> meet(int rank, std::vector<float> mine, bool max) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !closing_; });  // the previous round has been read by both
    parts_[rank] = std::move(mine);
    if (++arrived_ == 2) {
      result_ = parts_[0];
      for (size_t i = 0; i < result_.size(); ++i) {
        result_[i] = max ? std::max(result_[i], parts_[1][i]) : result_[i] + parts_[1][i];
      }
      closing_ = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return closing_; });
    }
    std::vector<float> result = result_;
    if (++left_ == 2) {
      arrived_ = left_ = 0;
      closing_ = false;
      cv_.notify_all();
    }
    return result;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<float> parts_[2], result_;
  int arrived_ = 0, left_ = 0;
  bool closing_ = false;
};

// What a rank's group was asked to move: each call's kind and floats, in order.
struct Call {
  enum Kind { all_reduce, all_gather, reduce_scatter } kind;
  size_t floats;
};

class HostGroup final : public exec::TensorParallelGroup {
 public:
  HostGroup(Rendezvous& rendezvous, int rank, const exec::DecoderOps& ops)
      : rendezvous_(rendezvous), rank_(rank), ops_(ops) {}
  std::vector<Call> calls;
  void all_reduce(std::span<float> data, bool max) override {
    calls.push_back({Call::all_reduce, data.size()});
    std::vector<float> mine(data.size());
    ops_.download(mine.data(), data.data(), data.size());
    const std::vector<float> sum = rendezvous_.meet(rank_, std::move(mine), max);
    ops_.upload(data.data(), sum.data(), sum.size());
  }
  // Each rank's part, zeros elsewhere, summed: every part exactly its rank's.
  void all_gather(std::span<float> data, std::span<const size_t> parts) override {
    calls.push_back({Call::all_gather, data.size()});
    std::vector<float> mine(data.size(), 0.0f);
    const size_t begin = parts[static_cast<size_t>(rank_)], end = parts[static_cast<size_t>(rank_) + 1];
    ops_.download(mine.data() + begin, data.data() + begin, end - begin);
    const std::vector<float> whole = rendezvous_.meet(rank_, std::move(mine), false);
    ops_.upload(data.data(), whole.data(), whole.size());
  }
  // Every part summed, then the other ranks' parts spoiled with NaN: their values are
  // unspecified, so the decoder must not read them.
  void reduce_scatter(std::span<float> data, std::span<const size_t> parts) override {
    all_reduce(data, false);
    calls.back().kind = Call::reduce_scatter;
    for (size_t r = 0; r + 1 < parts.size(); ++r) {
      if (r == static_cast<size_t>(rank_)) continue;
      const std::vector<float> nan(parts[r + 1] - parts[r], std::numeric_limits<float>::quiet_NaN());
      ops_.upload(data.data() + parts[r], nan.data(), nan.size());
    }
  }

 private:
  Rendezvous& rendezvous_;
  int rank_;
  const exec::DecoderOps& ops_;
};

// Runs `rank_main(rank, ops)` for both ranks, rank 1 on a thread of its own; the ranks' losses
// (which rank_main leaves in `losses`) must agree. Returns the loss.
template <class RankMain>
double on_two_ranks(const exec::DecoderOps& rank0, const exec::DecoderOps& rank1, const double (&losses)[2],
                    const RankMain& rank_main) {
  std::thread other([&] { rank_main(1, rank1); });
  rank_main(0, rank0);
  other.join();
  EXPECT_EQ(losses[0], losses[1]) << "the ranks' losses differ";
  return losses[0];
}

// The whole model split two ways (Megatron), each rank on its own thread and ops: the loss
// and each rank's gradients.
struct TensorParallelRun {
  double loss = 0;
  std::vector<float> grads[2];
  size_t stash_floats[2] = {};  // each rank's, after its forward
};

TensorParallelRun run_tensor_parallel(const exec::DecoderOps& rank0, const exec::DecoderOps& rank1,
                                      const model::Network& net, Recompute recompute, bool sequence_parallel = false,
                                      int samples = 2) {
  const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
  const int layers = static_cast<int>(net.layers.size());
  const size_t tokens_n = static_cast<size_t>(samples * shape.S);
  const std::vector<int> tokens = token_pattern(tokens_n, 37, 5, shape.V), targets = token_pattern(tokens_n, 53, 2, shape.V);
  Rendezvous rendezvous;
  TensorParallelRun run;
  double losses[2] = {};
  const auto rank_main = [&](int rank, const exec::DecoderOps& ops) {
    const exec::DecoderChunk chunk(shape, 0, layers, recompute, rank, 2, ops, sequence_parallel);
    std::vector<float> host(chunk.params().count);
    exec::init_params(chunk.params(), shape, 3, host.data());
    const OpsFloats w = upload(ops, host), g = ops.zeros(host.size());
    HostGroup group(rendezvous, rank, ops);
    exec::DecoderChunk::Input in;
    in.samples = samples;
    in.tokens = tokens.data();
    in.targets = targets.data();
    in.loss_scale = 1.0f / static_cast<float>(tokens_n);
    in.group = &group;
    auto stash = chunk.forward(w.data(), in, losses[rank]);
    run.stash_floats[rank] = exec::DecoderChunk::stash_floats(*stash);
    chunk.backward(*stash, w.data(), g.data(), nullptr, nullptr, false, false, &group, true);
    run.grads[rank] = download(ops, g);
  };
  run.loss = on_two_ranks(rank0, rank1, losses, rank_main);
  return run;
}

// The harness itself on the CPU: two ranks' losses add up to the one-device loss.
TEST(DecoderOps, TensorParallelRanksOnAHostGroupGiveTheOneDeviceLoss) {
  const model::Network net =
      model::network_from_spec("llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                               model::Precision::fp32);
  const TensorParallelRun split = run_tensor_parallel(exec::cpu_decoder_ops(), exec::cpu_decoder_ops(), net,
                                                      Recompute::none);
  const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
  const exec::DecoderChunk whole(shape, 0, static_cast<int>(net.layers.size()), Recompute::none);
  std::vector<float> w(whole.params().count);
  exec::init_params(whole.params(), shape, 3, w.data());
  const size_t tokens_n = static_cast<size_t>(2 * shape.S);
  const std::vector<int> tokens = token_pattern(tokens_n, 37, 5, shape.V), targets = token_pattern(tokens_n, 53, 2, shape.V);
  exec::DecoderChunk::Input in;
  in.samples = 2;
  in.tokens = tokens.data();
  in.targets = targets.data();
  in.loss_scale = 1.0f / static_cast<float>(tokens.size());
  double loss = 0;
  whole.forward(w.data(), in, loss);
  EXPECT_NEAR(split.loss, loss, 1e-5 * loss);
}

// Sequence parallelism changes where the norms run, not what they compute: the loss is the
// tensor-parallel one (the same rows, the same sums), the gradients too but for the norm
// gains, whose rows are added in two parts (one per rank) and then together. What the stash
// keeps of the residual stream (each block's x, its norms' outputs and statistics, x2; the
// head's input and norm) shrinks to the rank's rows. 11 tokens: ranks of 5 and 6 rows.
TEST(DecoderOps, SequenceParallelRanksComputeTheTensorParallelStepOnTheirRows) {
  for (const model::Network& net :
       {model::network_from_spec("gpt:layers=2,hidden=36,heads=4,seq=11,vocab=97", model::Precision::fp32),
        model::network_from_spec("llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                                 model::Precision::fp32)}) {
    const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
    for (const Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full}) {
      const std::string what = net.name + ", recompute " + std::string(partition::to_string(recompute));
      const auto& cpu = exec::cpu_decoder_ops();
      const TensorParallelRun tp = run_tensor_parallel(cpu, cpu, net, recompute, false, 1);
      const TensorParallelRun sp = run_tensor_parallel(cpu, cpu, net, recompute, true, 1);
      EXPECT_EQ(sp.loss, tp.loss) << what;
      expect_close(what + ": rank 0's gradients", sp.grads[0], tp.grads[0], 1e-5, 1e-6);
      expect_close(what + ": rank 1's gradients", sp.grads[1], tp.grads[1], 1e-5, 1e-6);
      if (recompute != Recompute::none) continue;
      const bool gpt = shape.family == exec::DecoderFamily::gpt2;
      const size_t stats = gpt ? 2 : 1;  // per row and norm: mean and rstd, or rstd
      const size_t per_row = static_cast<size_t>(shape.layers) * (4 * static_cast<size_t>(shape.C) + 2 * stats) +
                             2 * static_cast<size_t>(shape.C) + stats;
      const size_t rows[2] = {5, 6};  // of 11
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(tp.stash_floats[r] - sp.stash_floats[r], (11 - rows[r]) * per_row) << what << ", rank " << r;
      }
    }
  }
}

// Two ranks (each on its own ops) run the model as a pipeline of chunks (`cut`: layers per
// chunk) on one micro-batch of one sample, each boundary as the plan leaves it: the
// forward's partial sums all-reduced (under sequence parallelism reduce-scattered into the
// ranks' rows), as the plan's collective after F does; the input gradient written by the
// backward itself, whole (the rank's rows under sequence parallelism). What comes back: the
// loss, each chunk's gradients on each rank, and rank 0's group calls of each chunk's passes
// (the boundary's reduction counted with the forward).
struct ChunkCalls {
  std::vector<Call> forward, backward;
};
struct ChunkedRun {
  double loss = 0;
  std::vector<ChunkCalls> calls;            // per chunk
  std::vector<std::vector<float>> grads[2];  // per rank, per chunk
};

ChunkedRun run_tensor_parallel_chunks(const exec::DecoderOps& rank0, const exec::DecoderOps& rank1,
                                      const model::Network& net, const std::vector<int>& cut, Recompute recompute,
                                      bool sequence_parallel) {
  const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
  const size_t chunks = cut.size(), N = static_cast<size_t>(shape.S), C = static_cast<size_t>(shape.C);
  const std::vector<int> tokens = token_pattern(N, 37, 5, shape.V), targets = token_pattern(N, 53, 2, shape.V);
  const std::vector<size_t> parts{0, N / 2 * C, N * C};  // the boundaries' rows
  ChunkedRun out;
  if (sequence_parallel && chunks > 1 && N % 2 != 0) {
    ADD_FAILURE() << "sequence-parallel boundaries need an even sequence, not " << N;
    return out;
  }
  Rendezvous rendezvous;
  out.calls.resize(chunks);
  double losses[2] = {};
  const auto rank_main = [&](int rank, const exec::DecoderOps& ops) {
    HostGroup group(rendezvous, rank, ops);
    const size_t boundary = sequence_parallel ? N / 2 * C : N * C, mine = sequence_parallel ? parts[static_cast<size_t>(rank)] : 0;
    std::vector<std::unique_ptr<exec::DecoderChunk>> math;
    std::vector<OpsFloats> w, g;
    std::vector<exec::DecoderChunk::StashPtr> stash(chunks);
    int begin = 0;
    for (const int layers : cut) {
      math.push_back(std::make_unique<exec::DecoderChunk>(shape, begin, begin + layers, recompute, rank, 2, ops,
                                                          sequence_parallel));
      std::vector<float> host(math.back()->params().count);
      exec::init_params(math.back()->params(), shape, 3, host.data());
      w.push_back(upload(ops, host));
      g.push_back(ops.zeros(host.size()));
      begin += layers;
    }
    const auto take = [&](std::vector<Call>& into, size_t from) {
      if (rank == 0) into.assign(group.calls.begin() + static_cast<long>(from), group.calls.end());
    };
    OpsFloats x;
    for (size_t k = 0; k < chunks; ++k) {
      const size_t from = group.calls.size();
      const bool last = k + 1 == chunks;
      exec::DecoderChunk::Input in;
      in.samples = 1;
      in.tokens = tokens.data();
      in.targets = targets.data();
      in.loss_scale = 1.0f / static_cast<float>(N);
      in.input = x.data();
      in.group = &group;
      OpsFloats partial = last ? OpsFloats() : ops.floats(N * C);
      in.output = partial.data();
      in.output_partial = !last;
      stash[k] = math[k]->forward(w[k].data(), in, losses[rank]);  // (the last chunk's counts)
      if (!last) {
        const std::span<float> data(partial.data(), N * C);
        sequence_parallel ? group.reduce_scatter(data, parts) : group.all_reduce(data, false);
        x = ops.floats(boundary);
        ops.copy(x.data(), partial.data() + mine, boundary);
      }
      take(out.calls[k].forward, from);
    }
    OpsFloats dout;
    for (size_t k = chunks; k-- > 0;) {
      const size_t from = group.calls.size();
      OpsFloats dinput = k == 0 ? OpsFloats() : ops.floats(boundary);
      math[k]->backward(*stash[k], w[k].data(), g[k].data(), dout.data(), dinput.data(), false, false, &group, true);
      dout = std::move(dinput);
      take(out.calls[k].backward, from);
    }
    for (size_t k = 0; k < chunks; ++k) out.grads[rank].push_back(download(ops, g[k]));
  };
  out.loss = on_two_ranks(rank0, rank1, losses, rank_main);
  return out;
}

// The plan is the contract: per chunk and pass, its tensor-parallel collectives carry what
// the real math's ranks move. Each of a whole activation's size (rows x hidden) is one of the
// plan's messages (the vocabulary-parallel loss's per-row maximum and sums, and the norm gains
// summed once a step, are not activations, and the plan leaves them out). The whole model in
// one chunk (11 tokens: the ranks' rows unequal inside the task), and pipelines whose chunks
// hold the embedding alone, the LM head alone (whose forward moves nothing and whose backward
// all-reduces, or under sequence parallelism gathers and reduce-scatters, its input
// gradient), and blocks between; forward and backward, with and without sequence parallelism
// and full recomputation, GPT and LLaMA. The plan's all-gathers of a boundary's 1/t slices
// (Megatron's scatter/gather between stages) carry the boundary, not a pass's traffic, and
// are counted apart: one per boundary and pass.
TEST(DecoderOps, ThePlansTensorParallelCollectivesCarryWhatEachChunkMoves) {
  struct Case {
    const char* spec;
    std::vector<int> cut;  // layers per chunk
  };
  for (const Case& c : {Case{"gpt:layers=2,hidden=36,heads=4,seq=11,vocab=97", {4}},
                        Case{"llama:layers=3,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101", {5}},
                        Case{"gpt:layers=2,hidden=36,heads=4,seq=12,vocab=97", {1, 2, 1}},
                        Case{"llama:layers=3,hidden=48,heads=6,kv_heads=2,ffn=100,seq=10,vocab=101", {2, 1, 2}},
                        Case{"llama:layers=3,hidden=48,heads=6,kv_heads=2,ffn=100,seq=10,vocab=101", {2, 2, 1}}}) {
    const model::Network net = model::network_from_spec(c.spec, model::Precision::fp32);
    const exec::DecoderShape shape = exec::decoder_shape(*net.architecture);
    const size_t activation = static_cast<size_t>(shape.S) * static_cast<size_t>(shape.C);
    for (const bool sequence : {false, true}) {
      for (const Recompute recompute : {Recompute::none, Recompute::full}) {
        std::string what = std::string(c.spec) + ", chunks of";
        for (const int layers : c.cut) what += " " + std::to_string(layers);
        what += std::string(sequence ? ", sequence parallel" : "") + ", recompute " +
                std::string(partition::to_string(recompute));
        const auto& cpu = exec::cpu_decoder_ops();
        const ChunkedRun chunked = run_tensor_parallel_chunks(cpu, cpu, net, c.cut, recompute, sequence);
        const std::vector<ChunkCalls>& run = chunked.calls;
        // (The boundaries as the plan leaves them compute the whole model's loss.)
        const double whole = run_tensor_parallel(cpu, cpu, net, recompute, sequence, 1).loss;
        EXPECT_NEAR(chunked.loss, whole, 1e-6 * whole) << what;
        partition::PlanOptions o;
        o.tensor = 2;
        o.sequence_parallel = sequence;
        o.pipeline = static_cast<int>(c.cut.size());
        o.stage_layers = c.cut;
        o.data = 1;
        o.microbatches = 1;
        o.recompute = recompute;
        o.precision = model::Precision::fp32;
        const partition::Plan plan = test_support::planned(model::cpu_cluster(2 * static_cast<int>(c.cut.size())), net, o);
        // (stage, kind, forward?) -> messages and floats, on each stage's rank 0.
        std::map<std::tuple<int, Call::Kind, bool>, std::pair<int, double>> planned, moved;
        int boundary_gathers = 0;
        for (const partition::Collective& col : plan.collectives) {
          if (col.purpose != partition::Purpose::tensor_parallel && col.purpose != partition::Purpose::sequence_parallel) {
            continue;
          }
          if (col.purpose == partition::Purpose::tensor_parallel && col.kind == partition::CollectiveKind::all_gather) {
            // A boundary rebuilt from its slices reads them and writes the whole boundary;
            // any other all-gather would be a pass's traffic and is counted below.
            const int task = col.tasks.front();
            if (plan.reads(task).size() == 1 && plan.writes(task).size() == 1) {
              EXPECT_EQ(col.bytes, static_cast<double>(activation * sizeof(float))) << what << ": a boundary's slices";
              ++boundary_gathers;
              continue;
            }
          }
          ASSERT_TRUE(col.in_task()) << what << ": a pass's collectives run inside it";
          const partition::Task& first = plan.task(col.tasks.front());  // the rank 0's pass
          const bool forward = first.kind == partition::TaskKind::forward;
          const Call::Kind kind = col.kind == partition::CollectiveKind::all_reduce   ? Call::all_reduce
                                  : col.kind == partition::CollectiveKind::all_gather ? Call::all_gather
                                                                                      : Call::reduce_scatter;
          auto& [messages, floats] = planned[{first.stage, kind, forward}];
          messages += col.messages;
          floats += col.bytes / sizeof(float);
        }
        for (size_t k = 0; k < run.size(); ++k) {
          for (const bool forward : {true, false}) {
            for (const Call& call : forward ? run[k].forward : run[k].backward) {
              // Every exchange: a pass's activation-sized ones, the vocab-parallel loss's
              // all-reduces (each token's maximum; its sum of exponentials and target logit),
              // and in the last backward the once-a-step sum of the gains.
              auto& [messages, floats] = moved[{static_cast<int>(k), call.kind, forward}];
              ++messages;
              floats += static_cast<double>(call.floats);
            }
          }
        }
        EXPECT_EQ(planned, moved) << what;
        // (Without sequence parallelism each boundary arrives in slices, once per pass.)
        EXPECT_EQ(boundary_gathers, sequence ? 0 : 2 * (static_cast<int>(c.cut.size()) - 1)) << what;
        // (Where the head is a chunk alone, its input gradient is the only thing it moves.)
        EXPECT_TRUE(moved.count({static_cast<int>(c.cut.size()) - 1, sequence ? Call::reduce_scatter : Call::all_reduce,
                                 false}))
            << what << ": the last chunk's backward moves its input gradient";
      }
    }
  }
}

TEST(DecoderOps, CudaTensorParallelMatchesTheCpuReference) {
  if (!kernels::cuda_built()) GTEST_SKIP() << "CUDA kernels not built: " << kernels::cuda_status();
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "skipped, needs a GPU: " << kernels::cuda_status();
  // Both ranks on GPU 0; their all-reduces go through the host.
  const exec::CudaDecoderOps cuda(0, nullptr);
  for (const model::Network& net :
       {model::network_from_spec("gpt:layers=2,hidden=36,heads=4,seq=13,vocab=97", model::Precision::fp32),
        model::network_from_spec("llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                                 model::Precision::fp32),
        odd_qwen3()}) {
    for (const auto& [recompute, sequence] :
         {std::pair{Recompute::none, false}, std::pair{Recompute::full, false}, std::pair{Recompute::none, true}}) {
      const std::string what = net.name + " tensor parallel 2" + (sequence ? " + sequence parallel" : "") +
                               ", recompute " + std::string(partition::to_string(recompute));
      const TensorParallelRun want =
          run_tensor_parallel(exec::cpu_decoder_ops(), exec::cpu_decoder_ops(), net, recompute, sequence, 1);
      const TensorParallelRun got = run_tensor_parallel(cuda, cuda, net, recompute, sequence, 1);
      EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::fabs(want.loss)) << what;
      expect_close(what + " rank 0's gradients", got.grads[0], want.grads[0]);
      expect_close(what + " rank 1's gradients", got.grads[1], want.grads[1]);
    }
  }
  // Chunks of the embedding alone, blocks and the head alone: the boundaries as the plan
  // leaves them (the ranks' rows under sequence parallelism), on the CUDA ops.
  const model::Network net = model::network_from_spec("gpt:layers=2,hidden=36,heads=4,seq=12,vocab=97", model::Precision::fp32);
  for (const bool sequence : {false, true}) {
    const std::string what = std::string("chunks 1, 2, 1") + (sequence ? ", sequence parallel" : "");
    const ChunkedRun want =
        run_tensor_parallel_chunks(exec::cpu_decoder_ops(), exec::cpu_decoder_ops(), net, {1, 2, 1}, Recompute::none, sequence);
    const ChunkedRun got = run_tensor_parallel_chunks(cuda, cuda, net, {1, 2, 1}, Recompute::none, sequence);
    EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::fabs(want.loss)) << what;
    for (int r = 0; r < 2; ++r) {
      for (size_t k = 0; k < 3; ++k) {
        expect_close(what + ": rank " + std::to_string(r) + "'s gradients of chunk " + std::to_string(k),
                     got.grads[r][k], want.grads[r][k]);
      }
    }
  }
}

}  // namespace
}  // namespace hetflow
