// Mixture-of-Experts decoders as a user meets them today: a plan of one saved, validated and
// simulated (its layers' experts in the plan file's network); describe's counts; the
// Megatron flags export-launch writes; and run, which trains them as FLOP-matched proxies
// and refuses real math naming the architecture's moe.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;

namespace {

const std::string kSmallMoe =
    " --cluster cpu-2 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32,experts=4,"
    "experts_per_token=2,expert_ffn=48,shared_experts=1 --precision fp32";

}  // namespace

TEST(MoeCli, APlanOfAMixtureOfExpertsSavesValidatesAndSimulates) {
  const std::string plan = (scratch_dir() / "moe_plan.json").string();
  const auto made = run_hetflow("plan" + kSmallMoe + " --pipeline 2 --out " + plan);
  ASSERT_EQ(made.status, 0) << made.err;
  const nlohmann::json file = nlohmann::json::parse(run_hetflow("validate " + plan + " --json").out);
  EXPECT_TRUE(file.at("valid").get<bool>()) << file.dump();
  const auto simulated = run_hetflow("simulate --plan " + plan);
  EXPECT_EQ(simulated.status, 0) << simulated.err;
  // The network inside the plan keeps its experts: the architecture's and each layer's.
  std::ifstream in(plan);
  const std::string network = nlohmann::json::parse(in).at("network").at("yaml").get<std::string>();
  EXPECT_NE(network.find("moe: {experts: 4, experts_per_token: 2, expert_ffn: 48, shared_experts: 1"), std::string::npos)
      << network;
  EXPECT_NE(network.find("experts_per_token: 2\n    expert_params: 9216"), std::string::npos) << network;  // 3 x 64 x 48
  // describe counts a released MoE's total and active parameters.
  const auto described = run_hetflow("describe --model mixtral-8x7b --json");
  ASSERT_EQ(described.status, 0) << described.err;
  const nlohmann::json net = nlohmann::json::parse(described.out).at("network");
  EXPECT_DOUBLE_EQ(net.at("params").get<double>(), 46702792704);
  EXPECT_DOUBLE_EQ(net.at("active_params").get<double>(), 46702792704 - 32 * 6 * (3.0 * 4096 * 14336));
  EXPECT_EQ(net.at("moe").at("experts").get<int>(), 8);
}

TEST(MoeCli, ExportLaunchWritesMegatronsMoeAndLatentAttentionFlags) {
  const auto v3 = run_hetflow("export-launch --framework megatron --cluster dgx-a100-x4 --model deepseek-v3 --precision bf16 "
                              "--tensor 8 --pipeline 4 --global-batch 32");
  ASSERT_EQ(v3.status, 0) << v3.err;
  for (const char* flag : {"--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048",
                           "--moe-layer-freq \"[0,0,0,1,1", "--moe-shared-expert-intermediate-size 2048",
                           "--moe-router-score-function sigmoid --moe-router-enable-expert-bias",
                           "--moe-router-topk-scaling-factor 2.5", "--multi-latent-attention --kv-lora-rank 512",
                           "--q-lora-rank 1536", "--mtp-num-layers 1"}) {
    EXPECT_NE(v3.out.find(flag), std::string::npos) << flag << "\n" << v3.out;
  }
  EXPECT_EQ(v3.out.find("multi-token prediction module off"), std::string::npos) << v3.out;
  // Its module on a stage of its own, apart from the head: not Megatron-Core's placement.
  const auto apart = run_hetflow("export-launch --framework megatron --cluster dgx-a100-x4 --model deepseek-v3 "
                                 "--precision bf16 --tensor 8 --pipeline 4 --global-batch 32 --stage-layers 16,16,31,1");
  ASSERT_EQ(apart.status, 0) << apart.err;
  EXPECT_NE(apart.out.find("a multi-token prediction module off the head's pipeline stage"), std::string::npos)
      << apart.out;
  const auto titan = run_hetflow("export-launch --framework torchtitan --cluster dgx-a100-x4 --model deepseek-v3 "
                                 "--precision bf16 --tensor 8 --pipeline 4 --global-batch 32");
  ASSERT_EQ(titan.status, 0) << titan.err;
  EXPECT_NE(titan.out.find("multi-token prediction (mtp_layers 1): torchtitan's config has no module for it"),
            std::string::npos)
      << titan.out;
  const auto qwen = run_hetflow("export-launch --framework megatron --cluster dgx-a100-x4 --model qwen1.5-moe-a2.7b "
                                "--precision bf16 --tensor 2 --global-batch 32");
  ASSERT_EQ(qwen.status, 0) << qwen.err;
  EXPECT_NE(qwen.out.find("--moe-router-pre-softmax"), std::string::npos) << qwen.out;  // top-k weights not renormalised
  EXPECT_EQ(qwen.out.find("--moe-layer-freq"), std::string::npos) << qwen.out;          // every layer
}

// Expert parallelism on the command line: Megatron's and torchtitan's sizes written, a
// placement Megatron cannot take listed as not expressed, a bad size refused naming the option.
TEST(MoeCli, ExpertParallelismIsWrittenForTheFrameworksOrRefused) {
  const std::string plan = " --cluster dgx-a100-x4 --model mixtral-8x7b --precision bf16 --pipeline 4 --expert-parallel 8 "
                           "--micro-batch 1 --global-batch 64";
  const auto megatron = run_hetflow("export-launch --framework megatron" + plan);
  ASSERT_EQ(megatron.status, 0) << megatron.err;
  EXPECT_NE(megatron.out.find("--expert-model-parallel-size 8"), std::string::npos) << megatron.out;
  const auto titan = run_hetflow("export-launch --framework torchtitan" + plan);
  ASSERT_EQ(titan.status, 0) << titan.err;
  EXPECT_NE(titan.out.find("expert_parallel_degree = 8"), std::string::npos) << titan.out;
  const auto placed = run_hetflow("export-launch --framework megatron" + plan + " --expert-placement 7,6,5,4,3,2,1,0");
  ASSERT_EQ(placed.status, 0) << placed.err;
  EXPECT_NE(placed.out.find("an expert placement other than contiguous"), std::string::npos) << placed.out;
  const auto odd = run_hetflow("plan" + plan.substr(0, plan.find(" --expert-parallel")) + " --expert-parallel 3");
  EXPECT_NE(odd.status, 0);
  EXPECT_NE(odd.err.find("--expert-parallel: expected a divisor of the data axis (8 replicas"), std::string::npos) << odd.err;
}

// The search's JSON rows say each candidate's expert-parallel size and placement.
TEST(MoeCli, SearchRowsNameTheirExpertGroups) {
  const auto dir = scratch_dir();
  std::filesystem::create_directories(dir);
  const auto file = dir / "mixed.yaml";
  std::ofstream(file) << "name: mixed\nnodes:\n  - {name: a, count: 1, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, "
                         "bandwidth: 300 GB/s}, nic: {count: 1, bandwidth: 200 Gb/s}}\n  - {name: t, count: 1, gpu: T4, "
                         "gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, nic: {count: 1, bandwidth: 100 Gb/s}}\n";
  const auto r = run_hetflow("search --cluster " + file.string() +
                             " --model llama:layers=2,hidden=2048,heads=16,kv_heads=8,ffn=4096,vocab=1000,seq=2048,"
                             "experts=8,experts_per_token=2,expert_ffn=4096 --precision fp16 --global-batch 8 "
                             "--policies uniform --tensor 1 --pipeline 1 --micro-batch 1 --schedules 1f1b --recompute none "
                             "--sync allreduce --expert-parallel 4 --top 2 --sim-iterations 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json best = nlohmann::json::parse(r.out).at("ranked").at(0);
  EXPECT_EQ(best.at("expert_parallel").get<int>(), 4) << best;
  EXPECT_EQ(best.at("expert_placement").get<std::string>(), "speed") << best;
}

// Real math trains a mixture of experts, and under expert parallelism each worker holds its
// expert rank's experts and trades the copies by all-to-alls: the same losses as with every
// expert on every worker, with ZeRO stages 1 to 3 too.
TEST(MoeCli, RunTrainsRealMathWithAndWithoutExpertParallelism) {
  const auto whole = run_hetflow("run" + kSmallMoe + " --workspace 0 --steps 2 --json");
  ASSERT_EQ(whole.status, 0) << whole.err;
  const auto parallel = run_hetflow("run" + kSmallMoe + " --workspace 0 --steps 2 --expert-parallel 2 --json");
  ASSERT_EQ(parallel.status, 0) << parallel.err;
  const auto a = nlohmann::json::parse(whole.out), b = nlohmann::json::parse(parallel.out);
  EXPECT_EQ(b.at("compute").get<std::string>(), "real");
  for (size_t i = 0; i < 3; ++i) {
    const double want = a.at("steps")[i].at("loss").get<double>(), got = b.at("steps")[i].at("loss").get<double>();
    EXPECT_NEAR(got, want, 1e-6 * want) << "step " << i;
  }
  const auto text = run_hetflow("run" + kSmallMoe + " --workspace 0 --steps 1");
  EXPECT_NE(text.out.find("replaced by 4 experts (top 2 renormalised, 48 wide) and a shared one 48 wide"), std::string::npos)
      << text.out;
  // ZeRO under expert parallelism, the same losses: each replica steps its shard (its experts
  // whole here, one replica holding them); stage 2 reduce-scatters each pass's gradients; stage
  // 3 gathers each pass's dense part (the experts one replica holds alone are its own).
  for (const int stage : {1, 2, 3}) {
    const auto sharded = run_hetflow("run" + kSmallMoe + " --workspace 0 --steps 2 --expert-parallel 2 --zero-stage " +
                                     std::to_string(stage) + " --json");
    ASSERT_EQ(sharded.status, 0) << sharded.err;
    const auto z = nlohmann::json::parse(sharded.out);
    EXPECT_EQ(z.at("compute").get<std::string>(), "real");
    for (size_t i = 0; i < 3; ++i) {
      const double want = a.at("steps")[i].at("loss").get<double>(), got = z.at("steps")[i].at("loss").get<double>();
      EXPECT_NEAR(got, want, 1e-6 * want) << "stage " << stage << ", step " << i;
    }
  }
}
