// hetflow plan and hetflow validate as a user runs them.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;

TEST(PlanCli, JsonSummaryNamesFieldsWithUnits) {
  const auto r = run_hetflow("plan --cluster dgx-a100-x4 --model gpt3-1.3b --pipeline 4 --microbatches 8 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["iteration_time_s"].get<double>(), 0);
  EXPECT_GT(j["bubble_fraction"].get<double>(), 0);
  EXPECT_LT(j["bubble_fraction"].get<double>(), 1);
  EXPECT_GT(j["throughput_samples_per_s"].get<double>(), 0);
  ASSERT_EQ(j["devices"].size(), 32u);
  EXPECT_GT(j["devices"][0]["busy_s"].get<double>(), 0);
  EXPECT_GT(j["devices"][0]["peak_memory_bytes"].get<double>(), 0);
}

TEST(PlanCli, GridPrintsOneLinePerDeviceInProgramOrder) {
  const auto r = run_hetflow("plan --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --microbatches 4 "
                             "--schedule 1f1b --grid");
  ASSERT_EQ(r.status, 0) << r.err;
  // Rank 0 of 4 with 4 micro-batches: 3 warm-up forwards, then 1F1B, then cool-down.
  EXPECT_NE(r.out.find("titanv/gpu0: F0 F1 F2 F3 B0 B1 B2 B3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("titanv/gpu3: F0 B0 F1 B1 F2 B2 F3 B3"), std::string::npos) << r.out;
}

TEST(PlanCli, WrittenPlanValidatesAndEstimatesTheSame) {
  const std::string path = (scratch_dir() / "plan.json").string();
  const auto planned = run_hetflow("plan --cluster hetpipe-testbed --model resnet152 --policy hetpipe-ed "
                                   "--iterations 3 --staleness 1 --json --out " + path);
  ASSERT_EQ(planned.status, 0) << planned.err;
  const auto validated = run_hetflow("validate --plan " + path + " --json");
  ASSERT_EQ(validated.status, 0) << validated.err;
  const auto a = nlohmann::json::parse(planned.out), b = nlohmann::json::parse(validated.out);
  EXPECT_EQ(b["valid"], true);
  EXPECT_DOUBLE_EQ(a["iteration_time_s"].get<double>(), b["iteration_time_s"].get<double>());
  // WSP workers run a step ahead, but only into pushes, which the cuda back end's real math
  // keeps per instance on the host: safe for its one device copy per tensor.
  EXPECT_EQ(b["copy_reuse_hazards"], 0);
  EXPECT_TRUE(b["copy_reuse_examples"].empty());
}

TEST(PlanCli, PlanThatDoesNotFitExits3NamingTheDevice) {
  const auto r = run_hetflow("plan --cluster hetpipe-testbed --model gpt3-6.7b --pipeline 4 --data 1");
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("plan cannot run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("over by"), std::string::npos) << r.err;
}

TEST(PlanCli, BadOptionsExit2) {
  for (const char* args : {"plan --schedule zigzag", "plan --policy greedy", "plan --pipeline 99",
                           "plan --recompute some", "plan --sync gossip", "plan --schedule interleaved --pipeline 4",
                           "plan --virtual-stages 2", "plan --bucket-size lots", "validate --plan /nonexistent.json",
                           "plan --policy hetpipe-ed --tensor 2", "plan --tensor 3 --sequence-parallel --pipeline 0"}) {
    const auto r = run_hetflow(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("hetflow: "), std::string::npos) << args;
  }
}

TEST(PlanCli, ValidateReportsABrokenPlanFile) {
  const std::string path = hetflow::test_support::write_file("broken.json", "{\"format\": \"hetflow-plan\", \"version\": 1,");
  const auto r = run_hetflow("validate --plan " + path);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("broken.json:1: json: not valid JSON"), std::string::npos) << r.err;
}

TEST(PlanCli, ValidateTakesThePlanAsItsArgumentAndHelpAlwaysWorks) {
  const std::string path = (scratch_dir() / "positional.json").string();
  ASSERT_EQ(run_hetflow("plan --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --out " + path).status, 0);
  const auto r = run_hetflow("validate " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(": valid, plan xxh3:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one device copy per tensor (the cuda back end's real math): safe"), std::string::npos) << r.out;
  for (const char* command : {"validate --help", "plan --help", "simulate --help", "describe --help", "list --help"}) {
    const auto help = run_hetflow(command);
    EXPECT_EQ(help.status, 0) << command << ": " << help.err;
    EXPECT_NE(help.out.find("usage: hetflow"), std::string::npos) << command;
  }
}

// The library names the plan options' members; the command line names its options.
TEST(PlanCli, OptionErrorsNameTheOptionAndItsNeighbours) {
  const auto r = run_hetflow("plan --global-batch 8 --microbatches 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("<command line>: --microbatches: give either --global-batch or --microbatches, not both"),
            std::string::npos)
      << r.err;
  const auto s = run_hetflow("plan --pipeline 2 --stage-layers 1,2");
  EXPECT_EQ(s.status, 2);
  EXPECT_NE(s.err.find("--stage-layers:"), std::string::npos) << s.err;
  EXPECT_EQ(s.err.find("stage_layers"), std::string::npos) << s.err;
}

// The default model does not fit the default cluster without options: the error says what
// would, and each suggestion, given back to `hetflow plan`, makes a plan that validates.
TEST(PlanCli, WhatDoesNotFitSaysWhatWould) {
  for (const char* command : {"plan", "simulate"}) {
    const auto r = run_hetflow(command);
    ASSERT_EQ(r.status, 3) << r.err;
    EXPECT_NE(r.err.find("needs"), std::string::npos) << r.err;
    const size_t advice = r.err.find("what would fit");
    ASSERT_NE(advice, std::string::npos) << r.err;
    std::istringstream lines(r.err.substr(advice));
    std::string line;
    std::getline(lines, line);
    int suggestions = 0;
    while (std::getline(lines, line)) {
      const size_t end = line.find("  ", 2);
      ASSERT_EQ(line.rfind("  --", 0), 0u) << line;
      const std::string options = line.substr(2, end - 2);
      EXPECT_NE(line.find("per iteration"), std::string::npos) << line;
      const auto fixed = run_hetflow("plan " + options);
      EXPECT_EQ(fixed.status, 0) << options << ": " << fixed.err;
      ++suggestions;
    }
    EXPECT_GE(suggestions, 1) << r.err;
  }
  // A model far beyond the cluster gets no false hope.
  const auto hopeless = run_hetflow("plan --cluster hetpipe-testbed --model gpt3-175b");
  EXPECT_EQ(hopeless.status, 3);
  EXPECT_NE(hopeless.err.find("nothing nearby fits"), std::string::npos) << hopeless.err;
}

// Megatron's kernel flags reach the plan, its summary and, with operation costs, its time.
TEST(PlanCli, KernelOptionsAreThePlansAndChangeItsCostedTime) {
  const std::string base = "plan --cluster dgx-a100-x4 --model gpt:layers=4,hidden=1024,heads=16,seq=2048 --pipeline 2 "
                           "--data 1 --microbatches 4 --calibration published:a100";
  const auto fused = run_hetflow(base + " --json");
  const auto flash = run_hetflow(base + " --use-flash-attn --json");
  const auto unfused = run_hetflow(base + " --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion --json");
  ASSERT_EQ(fused.status, 0) << fused.err;
  ASSERT_EQ(flash.status, 0) << flash.err;
  ASSERT_EQ(unfused.status, 0) << unfused.err;
  const auto time = [](const std::string& out) { return nlohmann::json::parse(out)["iteration_time_s"].get<double>(); };
  EXPECT_LT(time(flash.out), time(fused.out));    // the s x s scores never reach memory
  EXPECT_GT(time(unfused.out), time(fused.out));  // each unfused kernel moves its bytes again
  const auto text = run_hetflow(base + " --use-flash-attn --no-bias-gelu-fusion");
  EXPECT_NE(text.out.find("recompute none, flash attention, unfused bias-GeLU, sync"), std::string::npos) << text.out;
  // PyTorch's AdamW op by op instead of one fused kernel: the optimizer's step moves more bytes.
  const auto adam = run_hetflow(base + " --no-fused-adam --json");
  ASSERT_EQ(adam.status, 0) << adam.err;
  EXPECT_GT(time(adam.out), time(fused.out));
  EXPECT_NE(run_hetflow(base + " --no-fused-adam").out.find("unfused Adam"), std::string::npos);
}
