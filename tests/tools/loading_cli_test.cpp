// hetflow plan and simulate on a cluster whose loader is the bottleneck: they say so, by how
// much, and the simulated throughput is the loader's closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {
const std::string kNfs = "--cluster " HETFLOW_SOURCE_DIR
                         "/tools/examples/a100x32-nfs.yaml --model resnet50 --data 32 --micro-batch 64 --microbatches 2";
// The example's 1 GB/s over ImageNet's mean JPEG (147,897,477,120 bytes / 1,281,167 images).
const double kLoaderSamplesPerS = 1e9 / (147897477120.0 / 1281167.0);
}  // namespace

TEST(LoadingCli, SimulateSaysInputBoundAndRunsAtTheLoadersRate) {
  const auto r = run_hetflow("simulate " + kNfs + " --iterations 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& loader = j["loader"];
  EXPECT_TRUE(loader["input_bound"].get<bool>());
  EXPECT_EQ(loader["limit"], "shared file system");
  EXPECT_NEAR(loader["loader_samples_per_s"].get<double>() / kLoaderSamplesPerS, 1.0, 1e-12);
  EXPECT_NEAR(j["throughput_samples_per_s"].get<double>() / kLoaderSamplesPerS, 1.0, 0.01);
  EXPECT_NEAR(loader["slowdown"].get<double>(),
              loader["compute_samples_per_s"].get<double>() / kLoaderSamplesPerS, 1e-9);
  // The GPUs wait for the loader all of the iteration but their own work, which is the
  // analytic critical path with loads that take no time (compute and communication, 23 ms of
  // 473): the iteration's 32 x 2 x 64 samples at the GPUs' analytic rate.
  const double wait_s =
      j["iteration_time_s"].get<double>() - 32 * 2 * 64 / loader["compute_samples_per_s"].get<double>();
  // The analytic critical path itself times the loads: the loader's iteration.
  EXPECT_NEAR(j["analytic_iteration_time_s"].get<double>() * kLoaderSamplesPerS / (32 * 2 * 64), 1.0, 0.02);
  EXPECT_NEAR(j["analytic_iteration_time_s"].get<double>() / j["iteration_time_s"].get<double>(), 1.0, 0.03);
  EXPECT_NEAR(loader["input_wait_s"].get<double>(), wait_s, 0.02 * j["iteration_time_s"].get<double>());
  EXPECT_NEAR(j["devices"][0]["input_wait_s"].get<double>(), wait_s, 0.02 * j["iteration_time_s"].get<double>());
  const auto text = run_hetflow("simulate " + kNfs + " --iterations 4");
  ASSERT_EQ(text.status, 0) << text.err;
  const std::string line = "  input-bound: the loader gives " + std::to_string(std::lround(kLoaderSamplesPerS)) +
                           " samples/s (shared file system), the GPUs could take ";
  EXPECT_NE(text.out.find(line), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\n  input wait         "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" per iteration (idle, the next forward waiting for its load; mean over computing devices)\n"),
            std::string::npos)
      << text.out;
}

TEST(LoadingCli, PlanSaysItToo) {
  const auto r = run_hetflow("plan " + kNfs);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  input-bound: the loader gives " + std::to_string(std::lround(kLoaderSamplesPerS)) +
                       " samples/s (shared file system)"),
            std::string::npos)
      << r.out;
  // A cluster without an input section: no loader line, no `loader` in the JSON.
  const auto plain = run_hetflow("plan --cluster dgx-a100-x4 --model resnet50 --data 32 --micro-batch 64 --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("loader"));
}

// Load tasks survive a Chakra export (as MEM_LOAD_NODEs) and its import: the workload read
// back, on the same cluster, runs in the plan's time (the loader's, here: each node's 16
// workers at 2 ms a sample, 8,000 samples/s for the 512 an iteration).
TEST(LoadingCli, ChakraKeepsTheLoads) {
  const auto dir = hetflow::test_support::scratch_dir();
  const std::string plan = (dir / "p.json").string(), et = (dir / "et").string();
  const std::string cluster = HETFLOW_SOURCE_DIR "/tools/examples/a100x32-nfs.yaml";
  ASSERT_EQ(run_hetflow("plan --cluster " + cluster + " --model resnet50 --data 4 --micro-batch 64 --microbatches 2 -o " + plan).status, 0);
  ASSERT_EQ(run_hetflow("export-chakra " + plan + " -o " + et).status, 0);
  const auto original = run_hetflow("simulate --plan " + plan + " --iterations 12 --json");
  const auto imported = run_hetflow("simulate --cluster " + cluster + " --model chakra:" + et + " --iterations 12 --json");
  ASSERT_EQ(original.status, 0) << original.err;
  ASSERT_EQ(imported.status, 0) << imported.err;
  const double expected_s = 512 / 8000.0;
  EXPECT_NEAR(nlohmann::json::parse(original.out)["iteration_time_s"].get<double>() / expected_s, 1.0, 0.01);
  EXPECT_NEAR(nlohmann::json::parse(imported.out)["iteration_time_s"].get<double>() / expected_s, 1.0, 0.01);
}

namespace {
const std::string kCpuRun = "run --cluster " HETFLOW_SOURCE_DIR
                            "/tools/examples/cpu-2-input.yaml --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 "
                            "--data 2 --microbatches 4";

// The throttle of a run whose loader dominates by 5x on this build and host: 25 ms a sample
// (200 ms for the 8 samples an iteration, against a few ms of compute on an idle core), or
// more where an unthrottled run's iteration takes more than a fifth of that (a sanitizer, a
// loaded machine); printed to round-trip exactly.
std::string dominating_throttle() {
  const auto free = run_hetflow(kCpuRun + " --steps 2 --json");
  EXPECT_EQ(free.status, 0) << free.err;
  const double compute_s = free.status == 0 ? nlohmann::json::parse(free.out)["iteration_time_s"].get<double>() : 0;
  char text[64];
  std::snprintf(text, sizeof text, "%.17gs", std::max(0.025, 5 * compute_s / 8));
  return text;
}
}  // namespace

// hetflow run with a throttled loader: each node's loader spends T on a sample, so the one
// node of cpu-2-input delivers 1/T samples/s, against thousands the model's compute could
// take. The run says so, the simulator (given the throttle as the input path's preprocessing)
// predicts that rate, and the measured rate follows it (exec/loader_test.cpp's tolerance:
// the loader keeps its own clock, a busy host delays it little).
TEST(LoadingCli, RunWithAThrottledLoaderIsInputBound) {
  const std::string throttle = dominating_throttle();
  const double throttle_s = std::stod(throttle), rate = 1 / throttle_s;
  const auto r = run_hetflow(kCpuRun + " --steps 5 --loader-throttle " + throttle + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& loader = j["loader"];
  EXPECT_TRUE(loader["input_bound"].get<bool>());
  EXPECT_EQ(loader["limit"], "preprocessing");
  EXPECT_EQ(loader["throttle_s_per_sample"].get<double>(), throttle_s);
  EXPECT_NEAR(loader["loader_samples_per_s"].get<double>(), rate, 1e-9 * rate);
  EXPECT_NEAR(j["simulated_throughput_samples_per_s"].get<double>() / rate, 1.0, 0.01);
  const double ratio = loader["measured_over_loader"].get<double>();
  EXPECT_NEAR(ratio, j["throughput_samples_per_s"].get<double>() / rate, 1e-12);
  EXPECT_GE(ratio, 0.85);
  EXPECT_LE(ratio, 1.10);
  // The devices wait for their loads most of each iteration (their compute is at most about
  // a fifth of it).
  EXPECT_GT(loader["input_wait_s"].get<double>(), 0.5 * j["iteration_time_s"].get<double>());
  for (const auto& d : j["devices"]) EXPECT_GT(d["input_wait_s"].get<double>(), 0.5 * j["iteration_time_s"].get<double>());
  // The report's lines (their figures apart from the host's speed: 25 ms, the plan's 40 samples/s).
  const auto text = run_hetflow(kCpuRun + " --steps 1 --loader-throttle 25ms");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("  loader: a load task per micro-batch, throttled to 25 ms a sample on each node\n"
                          "  input-bound: the loader gives 40 samples/s (preprocessing), the GPUs could take "),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("  waiting for the loader: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" of each iteration's "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" (mean over the devices; apart from the bubble fraction, "), std::string::npos) << text.out;
  // Unthrottled, the loads read the micro-batches and limit nothing.
  const auto free = run_hetflow(kCpuRun + " --steps 1");
  ASSERT_EQ(free.status, 0) << free.err;
  EXPECT_NE(free.out.find("  loader: a load task per micro-batch, unthrottled (--loader-throttle slows it)\n"), std::string::npos)
      << free.out;
}

// Under mpirun each process runs one worker's loads on a clock of its own, each sample
// costing twice the throttle there (exec/loader_throttle.hpp): the node still delivers 1/T
// samples/s, and the losses are the threads' (each process's one loader thread loses its
// dispatch time between loads, 1-3 % here: within the same tolerance).
TEST(LoadingCli, AThrottledRunUnderMpirunKeepsTheNodesRate) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI: hetflow run's devices are threads only";
#else
  const std::string run = kCpuRun + " --steps 5 --loader-throttle " + dominating_throttle() + " --json";
  const auto t = run_hetflow(run);
  const auto m = run_hetflow(run, hetflow::test_support::under_mpirun(2));
  ASSERT_EQ(t.status, 0) << t.err;
  ASSERT_EQ(m.status, 0) << m.err;
  const auto jt = nlohmann::json::parse(t.out), jm = nlohmann::json::parse(m.out);
  EXPECT_EQ(jm["ranks"], 2);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(jm["steps"][i]["loss"], jt["steps"][i]["loss"]) << "step " << i;
  const double ratio = jm["loader"]["measured_over_loader"].get<double>();
  EXPECT_GE(ratio, 0.85);
  EXPECT_LE(ratio, 1.10);
#endif
}

TEST(LoadingCli, RunRefusesAThrottleWithNothingToSlow) {
  const std::string model = " --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --data 2 --steps 1";
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : {Bad{"--cluster cpu-2" + model + " --loader-throttle 25ms",
                           "hetflow: <command line>: --loader-throttle: the plan has no load tasks to slow: its cluster "
                           "needs an input: section (README, \"Data loading\")\n"},
                       Bad{"--cluster " HETFLOW_SOURCE_DIR "/tools/examples/cpu-2-input.yaml" + model +
                               " --loader-throttle 25ms --backend cuda",
                           "hetflow: <command line>: --loader-throttle: slows the cpu back end's loader only\n"},
                       Bad{"--cluster " HETFLOW_SOURCE_DIR "/tools/examples/cpu-2-input.yaml" + model + " --loader-throttle 7200s",
                           "hetflow: <command line>: --loader-throttle: expected a time from 0 to 3600 s a sample, found '7200s'\n"}}) {
    const auto r = run_hetflow("run " + b.args);
    EXPECT_EQ(r.status, 2) << b.args << "\n" << r.err << r.out;
    EXPECT_EQ(r.err, b.says) << b.args;
  }
}
