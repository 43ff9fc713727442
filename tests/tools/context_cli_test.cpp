// --context-parallel as a user meets it: a long sequence's activations overflow the GPUs of
// one node, split over a context group they halve (`plan --json`, against the plan without);
// the summary says how the sequence is split; export-launch writes each framework's flag;
// the CPU back end trains such a plan as without (by all-gather or by a ring), and the CUDA
// back end refuses it naming the axis.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {

const std::string kLong =
    " --cluster " HETFLOW_SOURCE_DIR "/tools/examples/a100x8.yaml --model llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,"
    "seq=32768 --precision bf16 --tensor 4 --global-batch 2 --use-flash-attn --sequence-parallel";
const std::string kSmall =
    " --cluster cpu-2 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32 --precision fp32";

// The losses of a run's report, step by step ("step   1    3.4 ms  loss 5.577165").
std::vector<double> losses(const std::string& out) {
  std::vector<double> found;
  for (size_t at = out.find("  loss "); at != std::string::npos; at = out.find("  loss ", at + 1)) {
    found.push_back(std::stod(out.substr(at + 7)));
  }
  return found;
}

double activations(const std::string& out) {
  return nlohmann::json::parse(out).at("devices").at(0).at("memory").at("activations_bytes").get<double>();
}

}  // namespace

TEST(ContextCli, ALongSequenceSplitOverAContextGroupHalvesEachDevicesActivations) {
  const auto whole = run_hetflow("plan" + kLong + " --zero-stage 3");
  EXPECT_EQ(whole.status, 3) << whole.err;  // 45 GiB of activations per A100-40
  const auto text = run_hetflow("plan" + kLong + " --zero-stage 3 --context-parallel 2");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("context parallel 2 (each worker 1/2 of every sequence, keys and values all-gathered)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("placed tensor,context,data,pipeline"), std::string::npos) << text.out;
  // Under full recomputation both fit: each device keeps its 16,384 tokens' stash, half the
  // sequence's, and a backward's gathered keys and values of one layer with their gradients
  // (2 x 2 x 32,768 tokens x 2 KV heads of 128 x 2 B).
  const double kv = 2 * 2.0 * 32768 * 2 * 128 * 2;
  const auto single = run_hetflow("plan" + kLong + " --zero-stage 3 --recompute full --json");
  ASSERT_EQ(single.status, 0) << single.err;
  const auto split = run_hetflow("plan" + kLong + " --zero-stage 3 --recompute full --context-parallel 2 --json");
  ASSERT_EQ(split.status, 0) << split.err;
  EXPECT_NEAR((activations(split.out) - kv) / activations(single.out), 0.5, 1e-6);
}

// One replica of 4 GPUs leaves 4 idle: the advice splits the sequence over them (with the
// optimizer on the host, as one replica has nothing to shard over).
TEST(ContextCli, TheAdviceSplitsTheSequence) {
  const auto r = run_hetflow("plan" + kLong + " --data 1");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("  --context-parallel 2 --offload-optimizer "), std::string::npos) << r.err;
}

TEST(ContextCli, ExportLaunchWritesEachFrameworksContextParallelism) {
  const std::string plan = " --model llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=8192 "
                           "--cluster " HETFLOW_SOURCE_DIR "/tools/examples/a100x8.yaml --precision bf16 --tensor 2 --context-parallel 2";
  const auto megatron = run_hetflow("export-launch --framework megatron" + plan);
  ASSERT_EQ(megatron.status, 0) << megatron.err;
  EXPECT_NE(megatron.out.find("--context-parallel-size 2 --cp-comm-type all_gather"), std::string::npos) << megatron.out;
  EXPECT_EQ(megatron.out.find("devices placed"), std::string::npos) << megatron.out;  // Megatron's own order
  const auto titan = run_hetflow("export-launch --framework torchtitan --sequence-parallel" + plan);
  ASSERT_EQ(titan.status, 0) << titan.err;
  EXPECT_NE(titan.out.find("context_parallel_degree = 2"), std::string::npos) << titan.out;
  EXPECT_NE(titan.out.find("data_parallel_replicate_degree = 2"), std::string::npos) << titan.out;
  const auto ds = run_hetflow("export-launch --framework deepspeed" + plan);
  ASSERT_EQ(ds.status, 0) << ds.err;
  EXPECT_NE(ds.out.find("context parallelism (2-way"), std::string::npos) << ds.out;
}

// The CPU back end trains a context group's plan for real: two workers splitting each
// sequence print the losses of two data-parallel workers on the same batch, digit for digit
// as printed. The CUDA back end refuses it, naming the axis.
TEST(ContextCli, TheCpuBackEndTrainsASplitSequenceAsWithoutAndCudaRefusesIt) {
  const auto split = run_hetflow("run" + kSmall + " --context-parallel 2 --steps 3 --global-batch 4");
  ASSERT_EQ(split.status, 0) << split.err;
  EXPECT_NE(split.out.find("compute real"), std::string::npos) << split.out;
  const auto data = run_hetflow("run" + kSmall + " --steps 3 --global-batch 4");
  ASSERT_EQ(data.status, 0) << data.err;
  EXPECT_NE(hetflow::test_support::loss_lines(split.out), "");
  EXPECT_EQ(hetflow::test_support::loss_lines(split.out), hetflow::test_support::loss_lines(data.out));
  const auto cuda = run_hetflow("run --backend cuda" + kSmall + " --context-parallel 2 --steps 1");
  EXPECT_NE(cuda.status, 0);
  EXPECT_NE(cuda.err.find("layout.axes: context 2"), std::string::npos) << cuda.err;
}

// The search tries context groups for a long sequence (32,768 tokens: 2 and 4, each GPU
// keeping 8,192 tokens or more), by all-gather and by a ring, and keeps one where it is the
// fastest that fits: the best splits the sequence in 4 over 2 tensor-parallel pairs and
// passes keys and values around a ring (18 s simulated, 18.2 s by all-gather, against 23 s
// for the best without); its layout file plans back to the same context groups and ring.
TEST(ContextCli, TheSearchSplitsALongSequenceAndItsLayoutFilePlansBack) {
  const std::string model =
      " --cluster " HETFLOW_SOURCE_DIR "/tools/examples/a100x8.yaml --model llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,"
      "vocab=128256,seq=32768 --precision bf16 --use-flash-attn";
  const std::string layout = ::testing::TempDir() + "context_search.yaml";
  const auto r = run_hetflow("search" + model + " --global-batch 8 --policies uniform --top 3 --json --out-layout " + layout);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto best = nlohmann::json::parse(r.out).at("best");
  const std::string summary = best.at("plan").get<std::string>();
  EXPECT_NE(summary.find(" c4 "), std::string::npos) << summary;
  EXPECT_EQ(best.at("context").get<int>(), 4);
  const auto without = run_hetflow("search" + model + " --global-batch 8 --policies uniform --top 3 --json --context-parallel 1");
  ASSERT_EQ(without.status, 0) << without.err;
  const auto other = nlohmann::json::parse(without.out).at("best");
  EXPECT_EQ(other.at("plan").get<std::string>().find(" c"), std::string::npos) << other;
  EXPECT_FALSE(other.contains("context"));
  EXPECT_LT(best.at("iteration_time_s").get<double>(), other.at("iteration_time_s").get<double>());
  const auto back = run_hetflow("plan" + model + " --layout " + layout);
  ASSERT_EQ(back.status, 0) << back.err;
  EXPECT_NE(back.out.find("context parallel 4"), std::string::npos) << back.out;
  EXPECT_NE(summary.find(" c4 ring "), std::string::npos) << summary;
  EXPECT_NE(back.out.find("passed around a ring"), std::string::npos) << back.out;
  EXPECT_EQ(best.at("context_comm").get<std::string>(), "ring");
}

// A plan with context groups goes out as Chakra execution traces and comes back as a plan
// whose communicators have no roles: each in-task collective's members still perform its
// communicator's messages in one order, and it simulates as the plan does.
TEST(ContextCli, AChakraRoundTripSimulatesAsThePlan) {
  const std::string plan = ::testing::TempDir() + "context_chakra.json", dir = ::testing::TempDir() + "context_chakra";
  const std::string options = " --cluster cpu-4 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,"
                              "seq=32 --precision fp32";
  ASSERT_EQ(run_hetflow("plan" + options + " --context-parallel 2 --tensor 2 --out " + plan).status, 0);
  const auto exported = run_hetflow("export-chakra " + plan + " -o " + dir);
  ASSERT_EQ(exported.status, 0) << exported.err;
  const auto original = run_hetflow("simulate --plan " + plan + " --json");
  ASSERT_EQ(original.status, 0) << original.err;
  const auto back = run_hetflow("simulate --cluster cpu-4 --model chakra:" + dir + " --json");
  ASSERT_EQ(back.status, 0) << back.err;
  const double a = nlohmann::json::parse(original.out).at("iteration_time_s").get<double>();
  const double b = nlohmann::json::parse(back.out).at("iteration_time_s").get<double>();
  EXPECT_NEAR(b / a, 1.0, 0.01);
}

// --cp-comm ring as a user meets it: the summary says so; without context groups it is
// refused naming the option; the launch files carry each framework's ring; the CPU back
// end trains it to the gather's losses; the CUDA back end and Chakra export refuse it
// naming what to plan instead.
TEST(ContextCli, ARingIsPlannedExportedAndRunWhereItCanBe) {
  const auto text = run_hetflow("plan" + kSmall + " --context-parallel 2 --cp-comm ring");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("keys and values passed around a ring, overlapped with the attention"), std::string::npos)
      << text.out;
  const auto alone = run_hetflow("plan" + kSmall + " --cp-comm ring");
  EXPECT_EQ(alone.status, 2) << alone.err;
  EXPECT_NE(alone.err.find("--cp-comm"), std::string::npos) << alone.err;
  const std::string plan = " --model llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=8192 "
                           "--cluster " HETFLOW_SOURCE_DIR "/tools/examples/a100x8.yaml --precision bf16 --tensor 2 "
                           "--context-parallel 2 --cp-comm ring";
  const auto megatron = run_hetflow("export-launch --framework megatron" + plan);
  ASSERT_EQ(megatron.status, 0) << megatron.err;
  EXPECT_NE(megatron.out.find("--context-parallel-size 2 --cp-comm-type p2p"), std::string::npos) << megatron.out;
  const auto titan = run_hetflow("export-launch --framework torchtitan --sequence-parallel" + plan);
  ASSERT_EQ(titan.status, 0) << titan.err;
  EXPECT_NE(titan.out.find("context_parallel_rotate_method = \"alltoall\""), std::string::npos) << titan.out;
  // The CPU back end trains it as the gather does: the same losses, step by step.
  const auto gather = run_hetflow("run" + kSmall + " --context-parallel 2 --steps 2");
  const auto ring = run_hetflow("run" + kSmall + " --context-parallel 2 --cp-comm ring --steps 2");
  ASSERT_EQ(gather.status, 0) << gather.err;
  ASSERT_EQ(ring.status, 0) << ring.err;
  EXPECT_NE(ring.out.find("compute real"), std::string::npos) << ring.out;
  const std::vector<double> gathered = losses(gather.out), ringed = losses(ring.out);
  ASSERT_EQ(gathered.size(), 3u) << gather.out;
  ASSERT_EQ(ringed.size(), 3u) << ring.out;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(ringed[i], gathered[i], 1e-5) << "step " << i;
  const auto cuda = run_hetflow("run --backend cuda --compute proxy" + kSmall + " --context-parallel 2 --cp-comm ring --steps 1");
  EXPECT_NE(cuda.status, 0);
  EXPECT_NE(cuda.err.find("--cp-comm allgather"), std::string::npos) << cuda.err;
  const std::string file = ::testing::TempDir() + "ring.json";
  ASSERT_EQ(run_hetflow("plan" + kSmall + " --context-parallel 2 --cp-comm ring --out " + file).status, 0);
  const auto chakra = run_hetflow("export-chakra " + file + " -o " + ::testing::TempDir() + "ring_chakra");
  EXPECT_NE(chakra.status, 0);
  EXPECT_NE(chakra.err.find("--cp-comm allgather"), std::string::npos) << chakra.err;
}
