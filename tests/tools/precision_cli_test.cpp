// A precision the hardware lacks is refused by every command alike.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;

namespace {

// 2 x 4 V100 (no BF16 units) and 8 RTX 3090.
const char* kMixed =
    "name: mixed\n"
    "nodes:\n"
    "  - {name: v100, count: 2, gpu: V100-32, gpus: 4, nic: {count: 1, bandwidth: 25 Gb/s}}\n"
    "  - {name: r3090, count: 1, gpu: RTX-3090, gpus: 8, nic: {count: 1, bandwidth: 25 Gb/s}}\n";

}  // namespace

// A precision the hardware lacks is refused, by every command alike, naming the parts and
// the precisions that run: bf16 on V100s (no BF16 units) once ran silently at their FP32 peak
// and showed a higher MFU than fp16.
TEST(Precision, Bf16OnPartsWithoutItIsRefusedByEveryCommand) {
  const auto dir = scratch_dir();
  const std::string cluster = (dir / "mixed.yaml").string();
  std::ofstream(cluster) << kMixed;
  const std::string model = " --cluster " + cluster + " --model gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024 --precision bf16";
  const std::string want =
      "hetflow: <command line>: --precision: bf16 needs bf16 arithmetic, which V100-32 (8 devices) of cluster mixed has not "
      "(bf16 came with Ampere); give --precision fp16 (mixed precision with loss scaling) or fp32\n";
  for (const std::string command : {"plan", "simulate", "search --global-batch 16", "run --compute proxy --steps 1"}) {
    const auto r = run_hetflow(command + model);
    EXPECT_EQ(r.status, 2) << command << ": " << r.err;
    EXPECT_EQ(r.err, want) << command;
  }
  // The 3090s alone have it.
  std::ofstream(cluster) << "name: ampere\nnodes:\n  - {name: r3090, gpu: RTX-3090, gpus: 2}\n";
  EXPECT_EQ(run_hetflow("plan" + model).status, 0);
}

// A plan file that says bf16 on V100s (written for fp16, then edited) is refused by
// validation, as every command that reads a plan validates it.
TEST(Precision, APlanFileOfBf16OnPartsWithoutItIsInvalid) {
  const auto dir = scratch_dir();
  const std::string cluster = (dir / "mixed.yaml").string(), plan = (dir / "p.json").string();
  std::ofstream(cluster) << kMixed;
  ASSERT_EQ(run_hetflow("plan --cluster " + cluster + " --model gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024 "
                        "--precision fp16 --out " + plan)
                .status,
            0);
  nlohmann::json j = nlohmann::json::parse(slurp(plan));
  ASSERT_EQ(j["layout"]["precision"], "fp16");
  j["layout"]["precision"] = "bf16";
  j.erase("fingerprint");
  std::ofstream(plan) << j.dump();
  for (const std::string command : {"validate ", "simulate --plan "}) {
    const auto r = run_hetflow(command + plan);
    EXPECT_EQ(r.status, 3) << command << r.err;
    EXPECT_NE(r.err.find("  - layout.precision: bf16 needs bf16 arithmetic, which V100-32 (8 devices) of cluster mixed has not"),
              std::string::npos)
        << command << r.err;
  }
}
