// Policies as a user runs them: layouts users bring (--layout FILE), uneven cuts
// (--stage-layers), ps and wsp with every policy.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::write_file;

namespace {

const std::string kData = std::string(HETFLOW_SOURCE_DIR) + "/tests/tools/data/";
// 3 nodes of 4 V100-16 + 1 node of 4 T4; a 24-block GPT (26 layers).
const std::string kMixed = "--cluster " + kData + "mixed_v100_t4.yaml --model gpt:layers=24,hidden=1024,heads=16,seq=1024";

}  // namespace

TEST(LayoutCli, SimulatesTheUsersLayoutOnAMixedCluster) {
  // Worker i: GPU i of every node in node order, cut 0-6, 7-13, 14-19, 20-25.
  const auto r = run_hetflow("simulate --layout " + kData + "mixed_v100_t4_layout.yaml " + kMixed);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("policy layout-file"), std::string::npos) << r.out;
  for (const char* gpu : {"gpu0", "gpu1", "gpu2", "gpu3"}) {
    const std::string s(gpu);
    for (const std::string& line : {"layers   0-6    on v100-0/" + s, "layers   7-13   on v100-1/" + s,
                                    "layers  14-19   on v100-2/" + s, "layers  20-25   on t4/" + s}) {
      EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
    }
  }
  EXPECT_NE(r.out.find("simulated gpt:layers=24"), std::string::npos) << r.out;
}

TEST(LayoutCli, TensorParallelStagesTakeTheRestOfTheGlobalBatch) {
  // The README's example: worker 0 gives 8 micro-batches, worker 1 gets the other 24 - 8.
  const auto r = run_hetflow("plan --layout " + kData + "tensor_parallel_layout.yaml " + kMixed + " --global-batch 24 --sync wsp");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tensor 2, 2 virtual workers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("virtual worker 0: 3 ranks, 8 micro-batches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("virtual worker 1: 2 ranks, 16 micro-batches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers  18-25   on t4/gpu0,t4/gpu1"), std::string::npos) << r.out;
}

TEST(LayoutCli, BadLayoutFileExits2AtFileLineAndField) {
  const std::string path = write_file("bad-layout.yaml", R"(workers:
  - stages:
      - {devices: [v100-0/gpu0], layers: 0-12}
      - {devices: [v100-0/gpu7], layers: 13-25}
)");
  const auto r = run_hetflow("plan --layout " + path + " " + kMixed);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("bad-layout.yaml:4: workers[0].stages[1].devices[0]: unknown device 'v100-0/gpu7'; nearest known: "),
            std::string::npos)
      << r.err;
}

TEST(LayoutCli, OptionsTheLayoutReplacesAreRefused) {
  const std::string layout = "--layout " + kData + "mixed_v100_t4_layout.yaml " + kMixed;
  for (const char* option : {"--policy", "--pipeline", "--data", "--tensor", "--stage-layers"}) {
    const std::string name = option;
    const std::string value = name == "--policy" ? " balanced" : name == "--stage-layers" ? " 13,13" : " 2";
    const auto r = run_hetflow("plan " + layout + " " + option + value);
    EXPECT_EQ(r.status, 2) << option;
    EXPECT_NE(r.err.find(std::string(option) + ": cannot be combined with --layout"), std::string::npos) << r.err;
  }
}

TEST(StageLayersCli, UniformTakesUnevenCuts) {
  const auto r = run_hetflow("plan " + kMixed + " --pipeline 4 --data 1 --stage-layers 4,8,8,6");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"layers   0-3    on ", "layers   4-11   on ", "layers  12-19   on ", "layers  20-25   on "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const auto bad = run_hetflow("plan " + kMixed + " --pipeline 4 --stage-layers 4,8,8");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--stage-layers: expected 4 layer counts"), std::string::npos) << bad.err;
}

TEST(SyncCli, PsAndWspSimulateWithUniformAndBalanced) {
  for (const char* policy : {"uniform", "balanced"}) {
    for (const char* sync : {"ps", "wsp"}) {
      const auto r = run_hetflow(std::string("simulate --cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 2 "
                                             "--microbatches 4 --micro-batch 8 --json --policy ") +
                                 policy + " --sync " + sync);
      ASSERT_EQ(r.status, 0) << policy << " " << sync << ": " << r.err;
      EXPECT_TRUE(nlohmann::json::parse(r.out)["completed"].get<bool>()) << policy << " " << sync;
    }
  }
}
