// Large plans: --max-tasks bounds the plan as built (a folded plan's one replica), and a plan
// over memory on many devices is refused with its worst few devices and a count.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {

const char* kReplicated =
    "plan --cluster selene-4 --model gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=51200 --tensor 2 --pipeline 2 "
    "--data 8 --micro-batch 1 --global-batch 64";

// The estimate the --max-tasks refusal gives ("about N tasks per iteration").
long long estimated_tasks(const std::string& command) {
  const auto r = run_hetflow(command + " --max-tasks 1");
  EXPECT_EQ(r.status, 2) << r.err;
  std::smatch m;
  if (!std::regex_search(r.err, m, std::regex("--max-tasks: the plan would hold about (\\d+) tasks per iteration"))) {
    ADD_FAILURE() << r.err;
    return 0;
  }
  return std::stoll(m[1].str());
}

}  // namespace

// Eight identical replicas fold into one: the bound counts one replica's tasks, an eighth of
// the unfolded plan's, so a bound the unfolded plan exceeds lets the folded one through.
TEST(LargePlans, MaxTasksCountsTheFoldedPlan) {
  const long long unfolded = estimated_tasks(kReplicated);
  const long long folded = estimated_tasks(std::string(kReplicated) + " --fold");
  ASSERT_GT(folded, 0);
  EXPECT_EQ(folded * 8, unfolded);
  const std::string bound = " --max-tasks " + std::to_string(2 * folded);
  EXPECT_EQ(run_hetflow(std::string(kReplicated) + bound).status, 2);
  const auto r = run_hetflow(std::string(kReplicated) + " --fold" + bound);
  EXPECT_EQ(r.status, 0) << r.err;
}

// 32 identical devices all over memory: the five worst (equal, so the first five) and a
// count of the rest, not 32 lines. The header counts what is real, the devices over their
// memory, out of the plan's devices, and says the lines are the worst of them; the count line
// is the rest (it once said "6 problems", the count line among them, then "32 problems").
TEST(LargePlans, OverMemoryOnManyDevicesListsTheWorstFewAndACount) {
  const auto r = run_hetflow("plan --cluster cpu-32 --model gpt3-13b --global-batch 32");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err.find("hetflow: plan cannot run: 32 of 32 devices are over their memory, the 5 worst:\n"), 0u) << r.err;
  size_t bullets = 0;
  for (size_t at = r.err.find("\n  - "); at != std::string::npos; at = r.err.find("\n  - ", at + 1)) ++bullets;
  EXPECT_EQ(bullets, 5u) << r.err;
  for (int d = 0; d < 5; ++d) {
    EXPECT_NE(r.err.find("\n  - host/gpu" + std::to_string(d) + " needs 237 GiB but has 16 GiB"), std::string::npos) << r.err;
  }
  EXPECT_EQ(r.err.find("host/gpu5 "), std::string::npos) << r.err;
  const size_t last = r.err.find("\n  - host/gpu4 ");
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(r.err.substr(r.err.find('\n', last + 1), 15), "\n  and 27 more\n") << r.err;
}

// A few devices over memory: each listed, and the header counts them out of the plan's
// devices (4 of the 6: on mixed-6 the T4s' stage fits with selective recomputation, the
// V100s' first two stages do not, by the memory terms the lines show).
TEST(LargePlans, OverMemoryOnAFewDevicesCountsThemOutOfTheDevices) {
  const std::string cluster = (hetflow::test_support::scratch_dir() / "mixed6.yaml").string();
  std::ofstream(cluster) << "name: mixed-6\nnodes:\n"
                            "  - {name: v100, count: 2, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                            "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                            "  - {name: t4, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                            "nic: {count: 1, bandwidth: 25 Gb/s}}\n";
  const auto r = run_hetflow("plan --cluster " + cluster +
                             " --model gpt:layers=24,hidden=3072,heads=24,seq=1024,vocab=8000 --pipeline 3 --micro-batch 1"
                             " --global-batch 4 --recompute selective");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err.find("hetflow: plan cannot run: 4 of 6 devices are over their memory:\n"), 0u) << r.err;
  size_t bullets = 0;
  for (size_t at = r.err.find("\n  - "); at != std::string::npos; at = r.err.find("\n  - ", at + 1)) ++bullets;
  EXPECT_EQ(bullets, 4u) << r.err;
  EXPECT_EQ(r.err.find(" more\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("t4-0/gpu"), std::string::npos) << r.err;
}

// simulate folds identical replicas by default where the cluster's symmetry allows (Selene: a
// NIC per GPU, a non-blocking fabric) and says so; the oracle is the unfolded simulation,
// --no-fold (equal here; within 1 % in Simulator.AFoldedPlan*).
TEST(LargePlans, SimulateFoldsExactReplicasByDefault) {
  const std::string sim =
      "simulate --cluster selene-2 --model gpt:layers=4,hidden=512,heads=8,seq=512,vocab=8192 --tensor 2 --pipeline 2 "
      "--data 4 --micro-batch 1 --global-batch 32";
  const auto folded = run_hetflow(sim + " --json");
  const auto unfolded = run_hetflow(sim + " --no-fold --json");
  ASSERT_EQ(folded.status, 0) << folded.err;
  ASSERT_EQ(unfolded.status, 0) << unfolded.err;
  const auto f = nlohmann::json::parse(folded.out), u = nlohmann::json::parse(unfolded.out);
  EXPECT_EQ(f["folded_replicas"], 4);
  EXPECT_EQ(u["folded_replicas"], 1);
  EXPECT_EQ(f["iteration_time_s"].get<double>(), u["iteration_time_s"].get<double>());
  const auto text = run_hetflow(sim);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("\nfolded: the 4 identical data-parallel replicas were simulated as one, as this cluster's "
                          "symmetric links allow (--no-fold simulates each)\n"),
            std::string::npos)
      << text.out;
  EXPECT_EQ(run_hetflow(sim + " --fold --no-fold").status, 2);
  // One NIC for four GPUs: replicas would share it, so nothing folds, and nothing is said.
  const auto shared = run_hetflow("simulate --cluster mixed-academic --model gpt2-124m --pipeline 5 --global-batch 16");
  ASSERT_EQ(shared.status, 0) << shared.err;
  EXPECT_EQ(shared.out.find("folded:"), std::string::npos) << shared.out;
}
