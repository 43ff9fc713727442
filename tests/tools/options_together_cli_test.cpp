// Options that belong together work together: a plan file with --breakdown, HetPipe's
// uneven split of a global batch its workers do not divide.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;

namespace {
const char* kSmall = "--cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8";

std::string breakdown_of(const std::string& out) {
  const size_t at = out.find("\niteration breakdown");
  return at == std::string::npos ? "" : out.substr(at);
}
}  // namespace

// The plan written by `plan --out` and simulated from the file breaks down as the same plan
// simulated from its options.
TEST(OptionsTogether, SimulatePlanFileWithBreakdown) {
  const std::string plan = (scratch_dir() / "small.json").string();
  ASSERT_EQ(run_hetflow(std::string("plan ") + kSmall + " --iterations 3 --out " + plan).status, 0);
  const auto from_options = run_hetflow(std::string("simulate ") + kSmall + " --breakdown");
  const auto from_file = run_hetflow("simulate --plan " + plan + " --breakdown");
  ASSERT_EQ(from_options.status, 0) << from_options.err;
  ASSERT_EQ(from_file.status, 0) << from_file.err;
  ASSERT_FALSE(breakdown_of(from_options.out).empty()) << from_options.out;
  EXPECT_EQ(breakdown_of(from_file.out), breakdown_of(from_options.out));
}

// Four HetPipe-NP workers take 18 or 17 samples between them (micro-batches split by speed):
// the plan trains exactly the global batch asked for. Fewer samples than workers cannot be split.
TEST(OptionsTogether, HetPipeSplitsAGlobalBatchItsWorkersDoNotDivide) {
  for (int batch : {18, 17, 16}) {
    const auto r = run_hetflow("plan --cluster hetpipe-testbed --model gpt2-124m --policy hetpipe-np --global-batch " +
                               std::to_string(batch) + " --json");
    ASSERT_EQ(r.status, 0) << batch << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["samples_per_iteration"], batch);
  }
  const auto r = run_hetflow("plan --cluster hetpipe-testbed --model gpt2-124m --policy hetpipe-np --global-batch 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: <command line>: --global-batch: expected a multiple of --micro-batch 1 of at least 4 (a "
                   "micro-batch for each of the 4 virtual workers), found 3\n");
}

// A baseline family with no plan is named with the reason, not left out of the table: pure
// data parallelism of GPT-3 1.3B overflows the V100s' 16 GB unsharded (the plan command, an
// independent check, refuses it as over memory; --no-zero and --no-offload keep the search
// from sharding or offloading it),
// and --policies can leave families out.
TEST(OptionsTogether, SearchNamesTheBaselinesItDropped) {
  const std::string where = "--cluster mixed-academic --model gpt3-1.3b --global-batch 40";
  EXPECT_EQ(run_hetflow("plan " + where + " --pipeline 1 --tensor 1").status, 3);
  const auto r = run_hetflow("search " + where + " --top 1 --policies uniform,balanced --no-zero --no-offload");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* says : {"\n  data parallel: none, no candidate of it fits: each was refused by its policy or the "
                           "builder, or overflows a device's memory\n",
                           "\n  hetpipe-np: none, not searched: --policies leaves out hetpipe-np\n",
                           "\n  hetpipe-hd: none, not searched: --policies leaves out hetpipe-hd\n"}) {
    EXPECT_NE(r.out.find(says), std::string::npos) << says << "\n" << r.out;
  }
}
