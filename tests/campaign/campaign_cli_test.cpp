// hetflow campaign as a user runs it: Daly's intervals from --json, the checkpoint sized from
// the plan's memory, a cluster file's reliability section, and bad input refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

namespace hetflow {
namespace {

using test_support::run_hetflow;

// A small plan whose iteration simulates in well under a second.
const std::string kPlan = "--cluster dgx-a100-x4 --model gpt:layers=4,hidden=1024,heads=16,seq=1024 --tensor 8 --fold";

nlohmann::json campaign_json(const std::string& args) {
  const auto r = run_hetflow("campaign " + kPlan + " --json " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(CampaignCli, DalyIntervalsFromJson) {
  const struct {
    const char* mtbf;
    double mtbf_s;
    double minutes;
  } cases[] = {{"24h", 86400, 117}, {"6h", 21600, 57}, {"15min", 900, 9.1}};
  for (const auto& c : cases) {
    const auto j = campaign_json(std::string("--steps 100 --seeds 1 --checkpoint-write-time 5min --job-mtbf ") + c.mtbf);
    EXPECT_NEAR(j["job_mtbf_s"].get<double>(), c.mtbf_s, 1e-6 * c.mtbf_s);
    EXPECT_NEAR(j["checkpoint_write_s"].get<double>(), 300, 1e-9);
    EXPECT_NEAR(j["checkpoint_interval_s"].get<double>() / 60, c.minutes, c.minutes > 10 ? 0.5 : 0.05) << c.mtbf;
  }
}

TEST(CampaignCli, CheckpointIsThePlansWeightsAndOptimizerState) {
  const auto j = campaign_json("--steps 100 --seeds 1");
  // 4 layers of 12 h^2 + embedding and head (vocabulary 50,257 x 1,024 each, untied), plus
  // biases and norms: weights fp16 (2 B) + fp32 master and Adam moments (12 B) per parameter.
  const double h = 1024, layer = 12 * h * h + 13 * h, embed = 50257 * h + 1024 * h;
  const double params_low = 4 * layer + embed, params_high = params_low + 50257 * h + 4 * h;
  const double bytes = j["checkpoint_bytes"].get<double>();
  EXPECT_GE(bytes, 14 * params_low * 0.999);
  EXPECT_LE(bytes, 14 * params_high * 1.001);
  EXPECT_EQ(j["gpus"], 32);
  EXPECT_EQ(j["replicas"], 4);
  // Write: every node its share at 100 GB/s, or the file system's 2 TB/s for the whole.
  EXPECT_NEAR(j["checkpoint_write_s"].get<double>(), std::max(bytes / 2e12, bytes / 4 / 100e9), 1e-9);
}

// A checkpoint holds the model once, however the plan shards or offloads it: ZeRO 3 (each
// replica a quarter of the weights and state), ZeRO 1 with the state in host memory, and
// parameter servers (the state on the servers) write what the plain plan writes.
TEST(CampaignCli, TheCheckpointIsTheWholeModelHoweverSharded) {
  const double plain = campaign_json("--steps 100 --seeds 1")["checkpoint_bytes"].get<double>();
  EXPECT_NEAR(campaign_json("--steps 100 --seeds 1 --zero-stage 3")["checkpoint_bytes"].get<double>() / plain, 1.0, 1e-9);
  // (Offload and servers do not fold: the same plan unfolded.)
  const std::string unfolded = "campaign " + kPlan.substr(0, kPlan.find(" --fold")) + " --json --steps 100 --seeds 1 ";
  for (const char* options : {"--zero-stage 1 --offload-optimizer", "--sync ps"}) {
    const auto r = run_hetflow(unfolded + options);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NEAR(nlohmann::json::parse(r.out)["checkpoint_bytes"].get<double>() / plain, 1.0, 1e-9) << options;
  }
}

// Offloading the optimizer moves its state to host memory, not out of the checkpoint: a GPU
// snapshots and loads back the same shard with and without it.
TEST(CampaignCli, AnOffloadedShardIsSnapshottedAndLoadedAsAGpuHeldOne) {
  const std::string unfolded = "campaign " + kPlan.substr(0, kPlan.find(" --fold")) + " --json --steps 100 --seeds 1 ";
  const auto held = run_hetflow(unfolded + "--zero-stage 1");
  const auto offloaded = run_hetflow(unfolded + "--zero-stage 1 --offload-optimizer");
  ASSERT_EQ(held.status, 0) << held.err;
  ASSERT_EQ(offloaded.status, 0) << offloaded.err;
  const auto h = nlohmann::json::parse(held.out), o = nlohmann::json::parse(offloaded.out);
  EXPECT_GT(h["checkpoint_snapshot_s"].get<double>(), 0);
  for (const char* field : {"checkpoint_load_s", "checkpoint_snapshot_s"}) {
    EXPECT_NEAR(o[field].get<double>() / h[field].get<double>(), 1.0, 1e-9) << field;
  }
}

// Under context parallelism a replica is a context group: 4 nodes of 8 GPUs at tensor 4 x
// context 2 are 4 replicas of 2 workers, and dropping a replica drops a whole group (a lone
// worker of one would leave a group the plan refuses).
TEST(CampaignCli, AReplicaIsAContextGroup) {
  const auto r = run_hetflow("campaign --cluster dgx-a100-x4 --model llama:layers=4,hidden=1024,heads=16,kv_heads=4,"
                             "ffn=2816,vocab=32000,seq=4096 --tensor 4 --context-parallel 2 --steps 100 --seeds 1 "
                             "--fault-tolerance drop-replica --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gpus"], 32);
  EXPECT_EQ(j["replicas"], 4);
}

// Under expert parallelism a replica is an expert group (a member's experts cannot leave
// alone), and the checkpoint holds the group's experts once each and the dense part once: the
// same bytes as the plan without expert parallelism. 32 GPUs at pipeline 4 are 8 workers, in
// groups of 4: 2 replicas.
TEST(CampaignCli, AReplicaIsAnExpertGroupAndTheCheckpointTheWholeModel) {
  const std::string model =
      "campaign --cluster dgx-a100-x4 --model llama:layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=1024,"
      "experts=8,experts_per_token=2,expert_ffn=1024 --pipeline 4 --steps 100 --seeds 1 --json";
  const auto grouped = run_hetflow(model + " --expert-parallel 4 --fault-tolerance drop-replica");
  const auto whole = run_hetflow(model);
  ASSERT_EQ(grouped.status, 0) << grouped.err;
  ASSERT_EQ(whole.status, 0) << whole.err;
  const auto g = nlohmann::json::parse(grouped.out), w = nlohmann::json::parse(whole.out);
  EXPECT_EQ(g["replicas"], 2);
  EXPECT_EQ(w["replicas"], 8);
  EXPECT_NEAR(g["checkpoint_bytes"].get<double>() / w["checkpoint_bytes"].get<double>(), 1.0, 1e-6);
}

TEST(CampaignCli, ReadsTheClustersReliabilitySection) {
  const auto dir = test_support::scratch_dir();
  std::filesystem::create_directories(dir);
  const auto file = dir / "rel.yaml";
  std::ofstream(file) << "name: two\nnodes:\n  - {name: n, count: 2, gpu: A100-80, gpus: 8, intra: {kind: nvswitch, "
                         "bandwidth: 300 GB/s}, nic: {count: 8, bandwidth: 200 Gb/s}}\n"
                         "reliability:\n  mtbf: {gpu: 160 h, host: 1e12 h, nic: 1e12 h, switch: 1e12 h, software: 1e12 h}\n";
  const auto r = run_hetflow("campaign --cluster " + file.string() +
                             " --model gpt:layers=4,hidden=1024,heads=16,seq=1024 --tensor 8 --steps 10 --seeds 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  // 16 GPUs at 160 h each: the job fails every 10 h.
  EXPECT_NEAR(nlohmann::json::parse(r.out)["job_mtbf_s"].get<double>(), 36000, 1e-3);
}

TEST(CampaignCli, RefusesBadInput) {
  auto r = run_hetflow("campaign " + kPlan + " --seeds 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
  r = run_hetflow("campaign " + kPlan + " --steps 10 --fault-tolerance sometimes");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("expected restart or drop-replica, found 'sometimes'"), std::string::npos) << r.err;
  r = run_hetflow("campaign " + kPlan + " --steps 10 --checkpoint-interval soon");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--checkpoint-interval"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hetflow
