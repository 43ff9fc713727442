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

TEST(LayoutCli, StagesOfDifferentTensorDegreesPlanValidateAndSimulate) {
  // Worker 0: 1, 2, 4, then 2 devices per stage; worker 1: 2, then 1.
  const std::string layout = "--layout " + kData + "mixed_degree_layout.yaml " + kMixed + " --global-batch 24";
  const std::string plan = write_file("mixed-degree-plan.json", "");
  const auto made = run_hetflow("plan " + layout + " --out " + plan);
  ASSERT_EQ(made.status, 0) << made.err;
  EXPECT_NE(made.out.find("tensor 1-4 (per stage), 2 virtual workers"), std::string::npos) << made.out;
  EXPECT_NE(made.out.find("layers  14-19   on v100-1/gpu0,v100-1/gpu1,v100-1/gpu2,v100-1/gpu3"), std::string::npos)
      << made.out;
  const auto valid = run_hetflow("validate " + plan);
  EXPECT_EQ(valid.status, 0) << valid.err;
  EXPECT_NE(valid.out.find("valid"), std::string::npos) << valid.out;
  const auto simulated = run_hetflow("simulate --plan " + plan + " --json");
  ASSERT_EQ(simulated.status, 0) << simulated.err;
  EXPECT_TRUE(nlohmann::json::parse(simulated.out)["completed"].get<bool>());
  for (const char* sync : {"ps", "wsp"}) {
    const auto r = run_hetflow("simulate " + layout + " --json --sync " + sync);
    ASSERT_EQ(r.status, 0) << sync << ": " << r.err;
    EXPECT_TRUE(nlohmann::json::parse(r.out)["completed"].get<bool>()) << sync;
  }
}

TEST(LayoutCli, MixedDegreesAreRefusedWhereTheyCannotWork) {
  const auto sp = run_hetflow("plan --layout " + kData + "mixed_degree_layout.yaml " + kMixed + " --sequence-parallel");
  EXPECT_EQ(sp.status, 2);
  EXPECT_NE(sp.err.find("mixed_degree_layout.yaml:9: workers[0].stages[1].devices: 2 devices, but workers[0].stages[0] "
                        "has 1: sequence parallelism (`sequence_parallel`) needs the same tensor-parallel degree"),
            std::string::npos)
      << sp.err;
  // VGG-19's layers are not tensor parallel: replicated on both devices of a stage, they
  // cannot be all-reduced with a worker that holds them on one.
  const std::string path = write_file("vgg-mixed.yaml", R"(workers:
  - stages:
      - {devices: [titanv/gpu0], layers: 0-9}
      - {devices: [titanv/gpu1, titanv/gpu2], layers: 10-18}
  - stages:
      - {devices: [titanrtx/gpu0], layers: 0-9}
      - {devices: [titanrtx/gpu1], layers: 10-18}
)");
  const auto vgg = run_hetflow("plan --layout " + path + " --cluster hetpipe-testbed --model vgg19");
  EXPECT_EQ(vgg.status, 2);
  EXPECT_NE(vgg.err.find("vgg-mixed.yaml:7: workers[1].stages[1].devices: 1 device, but workers[0].stages[1] has 2: "),
            std::string::npos)
      << vgg.err;
}

TEST(LayoutCli, OneDegreeEverywherePlansAsBefore) {
  // Task counts and analytic iteration times of these plans before stages could differ in
  // degree (the plans were byte for byte the same, fingerprints included); the tensor-parallel
  // ones since their all-reduces pay each layer's latencies (Collective::messages: +3.04 ms);
  // those under all-reduce since each worker all-reduces its gradient norm (one task a device,
  // +138 us and +92 us); the tensor-parallel ones since a backward all-reduces the LM head's
  // input gradient and not the embedding's (Megatron's f and g), the last stage on T4s
  // (+288 us); the tensor-parallel ones since the LM head's vocab-parallel loss all-reduces
  // each token's maximum, sum and target logit in two collectives (+129 us); the tensor-
  // parallel ones since a rank holds, all-reduces and pushes its exact shard of Megatron's
  // split, norms and biases whole on every rank (+387 us under all-reduce, +14 us under WSP);
  // the tensor-parallel ones since those collectives run inside the passes (224 tasks fewer,
  // the same time); those under all-reduce since each device reads the gradients it steps for
  // the norm's sum of squares before that all-reduce (+546 us and +894 us).
  struct Case {
    std::string options;
    size_t tasks;
    double iteration_time_s;
  } cases[] = {
      {"--layout " + kData + "tensor_parallel_layout.yaml --global-batch 24", 704, 0.32244903782271989},
      {"--layout " + kData + "tensor_parallel_layout.yaml --global-batch 24 --sync wsp", 756, 0.22923612356494219},
      {"--layout " + kData + "mixed_v100_t4_layout.yaml", 808, 0.23444495268634261},
  };
  for (const Case& c : cases) {
    const auto r = run_hetflow("plan " + c.options + " " + kMixed + " --json");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tasks"].get<size_t>(), c.tasks) << c.options;
    EXPECT_NEAR(j["iteration_time_s"].get<double>(), c.iteration_time_s, 1e-12) << c.options;
  }
}

TEST(GroupedCli, PlansWorkersByTypeAndNamesTheIdleGpus) {
  const auto r = run_hetflow("plan " + kMixed + " --policy grouped --groups '*x4 V100-16, 1x(2 T4)' --global-batch 32 --micro-batch 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("policy grouped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 virtual workers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("virtual worker 3: 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("idle (in no virtual worker): t4/gpu2, t4/gpu3"), std::string::npos) << r.out;
  const auto bad = run_hetflow("plan " + kMixed + " --policy grouped --groups '*x4 V100-16, 1x(2 T5)'");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--groups: group 2 ('1x(2 T5)'): no GPU of type 'T5'"), std::string::npos) << bad.err;
  const auto other = run_hetflow("plan " + kMixed + " --policy balanced --groups '*x4 V100-16'");
  EXPECT_EQ(other.status, 2);
  EXPECT_NE(other.err.find("--groups: only --policy grouped takes --groups"), std::string::npos) << other.err;
}
