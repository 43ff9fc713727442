// hetflow simulate as a user runs it: the summary, the files it writes, faults, bad options.
#include <gtest/gtest.h>

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

TEST(SimulateCli, ExportedPlatformIsSimGridXml) {
  const std::string path = (scratch_dir() / "platform.xml").string();
  const auto r = run_hetflow(std::string("simulate ") + kSmall + " --export-platform " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string xml = slurp(path);
  EXPECT_NE(xml.find("<platform version=\"4.1\">"), std::string::npos);
  EXPECT_NE(xml.find("nic:titanv"), std::string::npos);
}
