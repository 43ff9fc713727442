// --zero-stage as a user meets it: GPT-2 XL does not fit 8 V100-16 by data parallelism alone
// and the advice names ZeRO; sharded, it plans, and `plan --json` shows each term divided as
// the stage says (oracle: mixed-precision Adam keeps 12 bytes per parameter against the
// weights' 2, so stage 2's optimizer state is 12 / 2 / 8 of its whole weights, its gradients
// 1/8 of them, and stage 3's weights 1/8 of them too); bad values are refused naming the option; the executors refuse to
// run a sharded plan, blaming the plan.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {
nlohmann::json memory_of(const std::string& out, size_t device) {
  return nlohmann::json::parse(out).at("devices").at(device).at("memory");
}
}  // namespace

TEST(ZeroCli, GptXlFitsTheV100sOnlySharded) {
  const auto plain = run_hetflow("plan --model gpt2-xl --data 8");
  EXPECT_EQ(plain.status, 3);
  EXPECT_NE(plain.err.find("v100-0/gpu0 needs 32.8 GiB but has 16 GiB"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("--zero-stage "), std::string::npos) << plain.err;
  const auto first = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 2 --json");
  const auto third = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 3 --json");
  ASSERT_EQ(first.status, 0) << first.err;
  ASSERT_EQ(third.status, 0) << third.err;
  const auto a = memory_of(first.out, 0), b = memory_of(third.out, 0);
  const double weights = a.at("weights_bytes").get<double>();
  EXPECT_NEAR(a.at("optimizer_bytes").get<double>() / weights, 12.0 / 2 / 8, 1e-6);
  EXPECT_NEAR(a.at("gradients_bytes").get<double>() / weights, 1.0 / 8, 1e-6);
  EXPECT_NEAR(b.at("weights_bytes").get<double>() / weights, 1.0 / 8, 1e-6);
  EXPECT_NEAR(b.at("gradients_bytes").get<double>() / weights, 1.0 / 8, 1e-6);
  EXPECT_GT(b.at("gathered_bytes").get<double>(), 0);
  const auto text = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 3");
  EXPECT_NE(text.out.find(", ZeRO stage 3 (resharded after each pass),"), std::string::npos) << text.out;
}

// Kept gathered, every layer's parameters and gradients are whole at once: 18 GiB of 16 on
// the V100s; freed after each pass (two layers whole), the plan fits, and the advice says so.
TEST(ZeroCli, TheAdviceOffersToReshardWhatIsKeptGathered) {
  const auto kept = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 3 --no-reshard-after-forward");
  EXPECT_EQ(kept.status, 3);
  EXPECT_NE(kept.err.find("\n  without --no-reshard-after-forward "), std::string::npos) << kept.err;
}

TEST(ZeroCli, BadValuesAreRefusedNamingTheOption) {
  const auto five = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 5");
  EXPECT_EQ(five.status, 2);
  EXPECT_NE(five.err.find("--zero-stage: expected 0, 1, 2 or 3, found 5"), std::string::npos) << five.err;
  const auto keep = run_hetflow("plan --model gpt2-xl --data 8 --zero-stage 2 --no-reshard-after-forward");
  EXPECT_EQ(keep.status, 2);
  EXPECT_NE(keep.err.find("--no-reshard-after-forward: applies to --zero-stage 3 only"), std::string::npos) << keep.err;
}

// The CPU back end runs a sharded plan, and its losses are those of the plan without
// sharding (to the printed digits: the sums are added in another order).
TEST(ZeroCli, TheCpuBackEndTrainsAShardedPlanAsTheUnshardedOne) {
  const std::string run = "run --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --precision fp32 "
                          "--data 2 --steps 3";
  const auto plain = run_hetflow(run);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto losses = [](const std::string& out) {
    std::string lines;
    for (size_t at = out.find("  loss "); at != std::string::npos; at = out.find("  loss ", at + 1)) {
      lines += out.substr(at, out.find('\n', at) - at) + "\n";
    }
    return lines;
  };
  ASSERT_NE(losses(plain.out), "") << plain.out;
  for (const char* zero : {" --zero-stage 1", " --zero-stage 3"}) {
    const auto sharded = run_hetflow(run + zero);
    ASSERT_EQ(sharded.status, 0) << zero << ": " << sharded.err;
    EXPECT_EQ(losses(sharded.out), losses(plain.out)) << zero;
  }
}

// The CUDA back end does not run sharded plans yet, and says so blaming the plan.
TEST(ZeroCli, TheCudaBackEndRefusesAShardedPlanBlamingThePlan) {
  const auto r = run_hetflow("run --backend cuda --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 "
                             "--precision fp32 --data 2 --steps 1 --zero-stage 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("layout.sync.zero.stage 1"), std::string::npos) << r.err;
}

// The search shards what does not fit: data parallelism of GPT-2 XL over the default
// cluster's 20 GPUs overflows the V100s unsharded (plan exits 3), so its data-parallel
// candidate is tried at the ZeRO stages and kept at one that fits, which `plan` of the same
// options builds (exit 0); with --no-zero and --no-offload nothing fits.
TEST(ZeroCli, TheSearchShardsDataParallelismThatOverflows) {
  const std::string where = "--model gpt2-xl --global-batch 40 --micro-batch 2 --recompute selective";
  EXPECT_EQ(run_hetflow("plan " + where).status, 3);
  const std::string space = " --policies uniform --tensor 1 --pipeline 1 --schedules 1f1b --sync allreduce --top 1";
  const auto r = run_hetflow("search " + where + space);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string line = "\n  data parallel: uniform t1 p1 d20, mb 2, 1f1b, recompute selective, allreduce, zero ";
  const size_t at = r.out.find(line);
  ASSERT_NE(at, std::string::npos) << r.out;
  const int stage = r.out[at + line.size()] - '0';
  ASSERT_GE(stage, 1) << r.out;
  const bool kept = r.out.compare(at + line.size() + 1, 15, " kept gathered ") == 0;
  const auto planned = run_hetflow("plan " + where + " --zero-stage " + std::to_string(stage) +
                                   (kept ? " --no-reshard-after-forward" : ""));
  EXPECT_EQ(planned.status, 0) << planned.err;
  const auto plain = run_hetflow("search " + where + space + " --no-zero --no-offload");
  EXPECT_EQ(plain.status, 3);
  EXPECT_NE(plain.err.find("none of the 1 candidates fits mixed-academic (0 refused by the policies or the builder, 1 over "
                           "device memory)"),
            std::string::npos)
      << plain.err;
}

// --zero-shares memory as a user meets it: GPT-2 XL at stage 1 over the default cluster's 20
// GPUs is 227 MiB over on each V100-16 with equal shares and fits by memory (16, 40 and 24 GB
// devices keep 16/480, 40/480 and 24/480 of the optimizer state); the plan says so, its file
// carries the parts, a layout file writes the option back, Megatron cannot be told it, and
// a bad value is refused naming the option.
TEST(ZeroCli, SharesByMemoryFitWhereEqualSharesDoNot) {
  const std::string plan = "plan --model gpt2-xl --data 20 --zero-stage 1";
  const auto equal = run_hetflow(plan);
  EXPECT_EQ(equal.status, 3);
  EXPECT_NE(equal.err.find("v100-0/gpu0 needs 16.2 GiB but has 16 GiB"), std::string::npos) << equal.err;
  const auto memory = run_hetflow(plan + " --zero-shares memory --json");
  ASSERT_EQ(memory.status, 0) << memory.err;
  const auto j = nlohmann::json::parse(memory.out);
  double whole = 0;
  for (const auto& d : j.at("devices")) whole += d.at("memory").at("optimizer_bytes").get<double>();
  const auto optimizer = [&](size_t d) { return j.at("devices").at(d).at("memory").at("optimizer_bytes").get<double>(); };
  EXPECT_NEAR(optimizer(0) / whole, 16.0 / 480, 1e-6);   // v100-0/gpu0
  EXPECT_NEAR(optimizer(8) / whole, 40.0 / 480, 1e-6);   // a100/gpu0
  EXPECT_NEAR(optimizer(12) / whole, 24.0 / 480, 1e-6);  // rtx3090/gpu0
  const auto text = run_hetflow(plan + " --zero-shares memory");
  EXPECT_NE(text.out.find("ZeRO stage 1, shards by device memory"), std::string::npos) << text.out;
  const auto launch = run_hetflow("export-launch --framework megatron --model gpt2-xl --data 20 --zero-stage 1 --zero-shares memory");
  ASSERT_EQ(launch.status, 0) << launch.err;
  EXPECT_NE(launch.out.find("ZeRO shards in proportion to device memory"), std::string::npos) << launch.out;
  const auto bad = run_hetflow(plan + " --zero-shares most");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--zero-shares: expected equal or memory, found 'most'"), std::string::npos) << bad.err;
  const auto unsharded = run_hetflow("plan --model gpt2-xl --data 20 --zero-shares memory");
  EXPECT_EQ(unsharded.status, 2);
  EXPECT_NE(unsharded.err.find("--zero-shares: divides ZeRO's shards: give --zero-stage 1, 2 or 3"), std::string::npos)
      << unsharded.err;
}
