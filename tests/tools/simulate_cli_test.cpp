// hetflow simulate as a user runs it: the summary, the files it writes, faults, bad options.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;

namespace {
const char* kSmall = "--cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8";
}

TEST(SimulateCli, JsonSummaryAndTraceFiles) {
  const auto dir = scratch_dir();
  const std::string csv = (dir / "t.csv").string(), chrome = (dir / "t.json").string();
  const auto r = run_hetflow(std::string("simulate ") + kSmall + " --json --trace " + csv + " --chrome " + chrome);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["completed"].get<bool>());
  EXPECT_EQ(j["iterations"], 3);  // the default: a warm-up and two measured iterations
  EXPECT_GT(j["iteration_time_s"].get<double>(), 0);
  EXPECT_GE(j["iteration_time_s"].get<double>(), j["analytic_iteration_time_s"].get<double>() * 0.999);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LT(j["mfu"].get<double>(), 1);
  EXPECT_EQ(j["devices"].size(), 16u);
  EXPECT_NE(slurp(csv).find("task,device,stream,kind"), std::string::npos);
  const auto trace = nlohmann::json::parse(slurp(chrome));
  EXPECT_FALSE(trace["traceEvents"].empty());
}

TEST(SimulateCli, FailedDeviceExits4WithAStallReport) {
  const auto r = run_hetflow(std::string("simulate ") + kSmall + " --fail-device titanv/gpu2@1ms");
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.out.find("THE RUN DID NOT COMPLETE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device titanv/gpu2 failed at"), std::string::npos) << r.out;
}

TEST(SimulateCli, BadFaultAndStragglerOptionsExit2) {
  for (const char* option : {"--straggler titanv/gpu0:0.5@0", "--straggler nosuch:2@0", "--straggler titanv/gpu0@1s",
                             "--fail-device titanv/gpu9@1s", "--fail-link nic:nowhere@1s", "--fail-device titanv/gpu0"}) {
    const auto r = run_hetflow(std::string("simulate ") + kSmall + " " + option);
    EXPECT_EQ(r.status, 2) << option << ": " << r.err;
    EXPECT_NE(r.err.find("hetflow: <command line>"), std::string::npos) << option << ": " << r.err;
  }
}

// What-if: the run on changed hardware beside the baseline, the baseline being the plain run.
TEST(SimulateCli, WhatIfReportsTheChangedRunBesideTheBaseline) {
  const auto plain = run_hetflow(std::string("simulate ") + kSmall + " --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const double baseline_s = nlohmann::json::parse(plain.out)["iteration_time_s"].get<double>();
  struct Case {
    const char* options;
    int sign;  // of the change: faster GPUs help, slower links do not
  };
  for (const Case& c : {Case{"--scale-gpu titan-v:4 --scale-gpu Quadro-P4000:4", -1},
                        Case{"--link pcie:bandwidth=1GB/s,latency=50us", +1},
                        Case{"--link nic:latency=1ms --scale-gpu titanv/gpu0:0.5", +1}}) {
    const auto r = run_hetflow(std::string("simulate ") + kSmall + " " + c.options + " --json");
    ASSERT_EQ(r.status, 0) << c.options << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("what_if")) << c.options;
    EXPECT_EQ(j["what_if"]["baseline"]["iteration_time_s"].get<double>(), baseline_s) << c.options;
    EXPECT_EQ(j["what_if"]["what_if"]["iteration_time_s"].get<double>(), j["iteration_time_s"].get<double>()) << c.options;
    EXPECT_GT(c.sign * (j["iteration_time_s"].get<double>() - baseline_s), 0) << c.options;
  }
  const auto text = run_hetflow(std::string("simulate ") + kSmall + " --scale-gpu TITAN-V:2");
  ASSERT_EQ(text.status, 0) << text.err;
  for (const char* says : {"what if --scale-gpu TITAN-V:2:", "iteration time", "bubble fraction", "exposed comm", "slowest device"}) {
    EXPECT_NE(text.out.find(says), std::string::npos) << says << "\n" << text.out;
  }
}

TEST(SimulateCli, BadWhatIfOptionsExit2NamingTheOption) {
  struct Bad {
    const char* option;
    const char* says;
  };
  for (const Bad& b : {Bad{"--scale-gpu K80:2", "--scale-gpu: no GPU type or device 'K80'"},
                       Bad{"--scale-gpu TITAN-V:0", "--scale-gpu: expected a factor between"},
                       Bad{"--scale-gpu TITAN-V", "--scale-gpu: expected TYPE:FACTOR"},
                       Bad{"--link nvlink:bandwidth=1GB/s", "--link: the cluster 'hetpipe-testbed' has no nvlink link"},
                       Bad{"--link ether:bandwidth=1GB/s", "--link: expected a link class"},
                       Bad{"--link pcie:speed=1GB/s", "--link: expected bandwidth=B or latency=L"},
                       Bad{"--link pcie:bandwidth=0", "--link: expected a bandwidth > 0"},
                       Bad{"--link pcie", "--link: expected CLASS:bandwidth=B,latency=L"},
                       Bad{"--link fabric:bandwidth=1GB/s", "--link: a fabric's bandwidth is its NICs'"}}) {
    const auto r = run_hetflow(std::string("simulate ") + kSmall + " " + b.option);
    EXPECT_EQ(r.status, 2) << b.option << ": " << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.option << ": " << r.err;
  }
}

TEST(SimulateCli, ExportedPlatformIsSimGridXml) {
  const std::string path = (scratch_dir() / "platform.xml").string();
  const auto r = run_hetflow(std::string("simulate ") + kSmall + " --export-platform " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string xml = slurp(path);
  EXPECT_NE(xml.find("<platform version=\"4.1\">"), std::string::npos);
  EXPECT_NE(xml.find("nic:titanv"), std::string::npos);
}

// Regression: a plan file used to lose the network's tokens per sample, so tokens/s equalled
// samples/s. A plan stands alone: simulating the file gives what simulating the options gives.
TEST(SimulateCli, APlanFileSimulatesAsItsOptionsDo) {
  const std::string path = (scratch_dir() / "gpt2.json").string();
  const std::string options = "--model gpt2-124m --cluster dgx-a100-x4 --pipeline 2 --microbatches 4 --iterations 3";
  ASSERT_EQ(run_hetflow("plan " + options + " --out " + path).status, 0);
  const auto from_file = run_hetflow("simulate --plan " + path + " --json");
  // (--no-fold: `plan` plans every replica, where simulate would fold them by default.)
  const auto from_options = run_hetflow("simulate " + options + " --no-fold --json");
  ASSERT_EQ(from_file.status, 0) << from_file.err;
  ASSERT_EQ(from_options.status, 0) << from_options.err;
  const auto a = nlohmann::json::parse(from_file.out), b = nlohmann::json::parse(from_options.out);
  EXPECT_DOUBLE_EQ(a["throughput_tokens_per_s"].get<double>(), a["throughput_samples_per_s"].get<double>() * 1024);
  EXPECT_EQ(a["throughput_tokens_per_s"], b["throughput_tokens_per_s"]);
  EXPECT_EQ(a["fingerprint"], b["fingerprint"]);
  // The trace names the plan it came from.
  const std::string csv = (scratch_dir() / "gpt2.csv").string();
  ASSERT_EQ(run_hetflow("simulate --plan " + path + " --trace " + csv).status, 0);
  EXPECT_NE(slurp(csv).find("# fingerprint: " + a["fingerprint"].get<std::string>()), std::string::npos);
}

TEST(SimulateCli, APlanFileFixesClusterModelAndLayout) {
  const std::string path = (scratch_dir() / "fixed.json").string();
  ASSERT_EQ(run_hetflow(std::string("plan ") + kSmall + " --out " + path).status, 0);
  for (const char* clash : {"--cluster dgx-a100-x4", "--model vgg19", "--pipeline 8", "--policy balanced"}) {
    const auto r = run_hetflow("simulate --plan " + path + " " + clash);
    EXPECT_EQ(r.status, 2) << clash;
    EXPECT_NE(r.err.find("a plan file fixes its cluster, network and layout"), std::string::npos) << r.err;
  }
  const auto longer = run_hetflow("simulate --plan " + path + " --iterations 4 --json");
  ASSERT_EQ(longer.status, 0) << longer.err;
  EXPECT_EQ(nlohmann::json::parse(longer.out)["iterations"], 4);
}

// The breakdown of a simulated decoder under operation costs: its parts add up to the
// iteration time, and with every GEMM at one flat efficiency (no launch cost) the GEMMs'
// times stand as their FLOPs do: QKV 3h^2, output projection h^2, MLP up and down 4h^2 each
// per token (multi-head attention, ffn 4h), whatever the pass.
TEST(SimulateCli, BreakdownAddsUpAndGemmsStandAsTheirFlops) {
  const auto dir = scratch_dir();
  const std::string cal = (dir / "ops.yaml").string();
  {
    std::ofstream f(cal);
    f << "gpus:\n  A100-80: {overhead: 0 us, ops: {gemm: {max_efficiency: 0.7}, memory: {max_efficiency: 0.9}}}\n";
  }
  const auto r = run_hetflow("simulate --cluster dgx-a100-x4 --model gpt:layers=4,hidden=1024,heads=16,seq=512,vocab=8000 "
                             "--tensor 2 --pipeline 2 --data 2 --micro-batch 2 --global-batch 16 --recompute full "
                             "--precision bf16 --breakdown --json --calibration " + cal);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto b = nlohmann::json::parse(r.out)["breakdown"];
  const double total = b["compute_s"].get<double>() + b["exposed_comm_s"].get<double>() + b["idle_s"].get<double>();
  EXPECT_NEAR(total, b["iteration_time_s"].get<double>(), 1e-9 * total);
  EXPECT_NEAR(b["iteration_time_s"].get<double>(), nlohmann::json::parse(r.out)["iteration_time_s"].get<double>(), 1e-9);
  double ops = 0;
  for (const auto& [name, s] : b["compute_by_operation_s"].items()) ops += s.get<double>();
  EXPECT_NEAR(ops, b["compute_s"].get<double>(), 1e-9 * ops);
  const auto& op = b["compute_by_operation_s"];
  const double proj = op["attention projection"].get<double>();
  EXPECT_NEAR(op["qkv"].get<double>() / proj, 3.0, 1e-6);
  EXPECT_NEAR(op["mlp up"].get<double>() / proj, 4.0, 1e-6);
  EXPECT_NEAR(op["mlp down"].get<double>() / proj, 4.0, 1e-6);
  EXPECT_GT(b["exposed_comm_by_purpose_s"]["tensor_parallel"].get<double>(), 0);
  EXPECT_GT(b["idle_s"].get<double>(), 0);  // a pipeline of 2 stages has a bubble
}
