// --axis-order: the placement order of the layout's axes, as a user gives it. The plan says
// where each rank went (devices dealt with pipeline innermost: a worker's ranks are
// neighbours), the plan file validates and simulates, real training on CPU threads gives the
// losses of Megatron's placement bit for bit (where a rank sits does not change the math),
// and a bad order or a policy that places its own devices is refused naming the option.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/scratch.hpp"
#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {
const std::string kGpt = "--model gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000";
}

TEST(AxisOrderCli, PlanPlacesPipelineInnermostAndTheFileSimulates) {
  const std::string plan = (hetflow::test_support::scratch_dir() / "placed.json").string();
  const auto r = run_hetflow("plan --cluster " + std::string(HETFLOW_SOURCE_DIR) + "/tools/examples/a100x8.yaml " + kGpt +
                             " --pipeline 2 --data 4 --axis-order pipeline,data,tensor --out " + plan);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("4 virtual workers, placed pipeline,data,tensor,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  virtual worker 1: 2 ranks, 4 micro-batches\n"
                       "    layers   0-2    on a100/gpu2\n"
                       "    layers   3-5    on a100/gpu3\n"),
            std::string::npos)
      << r.out;
  const auto valid = run_hetflow("validate " + plan);
  EXPECT_EQ(valid.status, 0) << valid.out << valid.err;
  const auto sim = run_hetflow("simulate --plan " + plan + " --json");
  ASSERT_EQ(sim.status, 0) << sim.err;
  EXPECT_GT(nlohmann::json::parse(sim.out).at("iteration_time_s").get<double>(), 0);
}

TEST(AxisOrderCli, RealTrainingLossesDoNotDependOnThePlacement) {
  const std::string run = "run --cluster cpu-4 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --precision fp32 "
                          "--tensor 2 --data 2 --microbatches 2 --steps 2 --json";
  const auto megatron = run_hetflow(run);
  const auto spread = run_hetflow(run + " --axis-order data,tensor,pipeline");
  ASSERT_EQ(megatron.status, 0) << megatron.err;
  ASSERT_EQ(spread.status, 0) << spread.err;
  const auto a = nlohmann::json::parse(megatron.out), b = nlohmann::json::parse(spread.out);
  ASSERT_EQ(a.at("steps").size(), b.at("steps").size());
  for (size_t i = 0; i < a.at("steps").size(); ++i) EXPECT_EQ(a.at("steps")[i].at("loss"), b.at("steps")[i].at("loss"));
}

TEST(AxisOrderCli, ABadOrderOrAPolicyThatPlacesItselfIsRefused) {
  const std::string cluster = "--cluster " + std::string(HETFLOW_SOURCE_DIR) + "/tools/examples/a100x8.yaml " + kGpt;
  const auto twice = run_hetflow("plan " + cluster + " --axis-order tensor,tensor,data");
  EXPECT_EQ(twice.status, 2);
  EXPECT_NE(twice.err.find("--axis-order: expected each axis once, found 'tensor' twice in 'tensor,tensor,data'"),
            std::string::npos)
      << twice.err;
  const auto hetpipe = run_hetflow("plan " + cluster + " --policy hetpipe-np --axis-order pipeline,data,tensor");
  EXPECT_EQ(hetpipe.status, 2);
  EXPECT_NE(hetpipe.err.find("--axis-order: policy hetpipe-np places its devices its own way"), std::string::npos)
      << hetpipe.err;
}
