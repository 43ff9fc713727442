// hetflow export-chakra and --model chakra:DIR as a user runs them. The oracle the issue
// names: a plan exported and read back simulates to the same iteration time (within 1 %;
// the same work on the same streams gives the same time here); a tensor-parallel one, whose
// passes are written in parts with their in-task collectives between them and joined back,
// to the same time within rounding, as the same tasks and collectives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;

namespace {

// A folder of its own for each case (the scratch folder is one per test process).
std::filesystem::path case_dir(const std::string& name) {
  const auto dir = scratch_dir() / ("chakra-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

double iteration_time_s(const std::string& args) {
  const auto r = run_hetflow("simulate " + args + " --iterations 3 --json");
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out)["iteration_time_s"].get<double>() : -1;
}

// A plan file's collectives as comparable values: (members, kind, algorithm, purpose,
// messages, points, bytes), sorted.
std::vector<std::string> collectives_of(const std::string& plan_file) {
  const nlohmann::json plan = nlohmann::json::parse(slurp(plan_file));
  std::vector<std::string> out;
  for (const auto& c : plan["collectives"]) {
    const auto& members = plan["communicators"][c["communicator"].get<size_t>()]["devices"];
    out.push_back(members.dump() + " " + c["kind"].get<std::string>() + " " + c["algorithm"].get<std::string>() + " " +
                  c["purpose"].get<std::string>() + " x" + std::to_string(c.value("messages", 1)) + " at " +
                  c.value("at", nlohmann::json::array()).dump() + " " + std::to_string(std::llround(c["bytes"].get<double>())));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(ChakraCli, AnExportedPlanSimulatesToItsOwnIterationTime) {
  for (const std::string& layout : {std::string("--cluster cpu-4 --pipeline 2 --data 2 --microbatches 4"),
                                    std::string("--cluster mixed-academic --pipeline 4 --recompute selective"),
                                    std::string("--cluster cpu-4 --tensor 2 --pipeline 2 --sequence-parallel --microbatches 2"),
                                    std::string("--cluster cpu-4 --tensor 2 --data 2 --microbatches 2 --recompute full"),
                                    std::string("--cluster cpu-4 --pipeline 2 --data 2 --sync wsp --staleness 1")}) {
    SCOPED_TRACE(layout);
    static int n = 0;
    const auto dir = case_dir("roundtrip" + std::to_string(n++));
    const std::string plan = (dir / "p.json").string(), et = (dir / "et").string();
    const std::string model = layout.find("mixed") != std::string::npos ? " --model gpt2-124m"
                                                                        : " --model gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256";
    ASSERT_EQ(run_hetflow("plan " + layout + model + " --workspace 0 --out " + plan).status, 0);
    const auto e = run_hetflow("export-chakra " + plan + " -o " + et + " --json");
    ASSERT_EQ(e.status, 0) << e.err;
    const auto j = nlohmann::json::parse(e.out);
    for (int r = 0; r < j["ranks"].get<int>(); ++r) EXPECT_TRUE(std::filesystem::exists(et + "/hetflow." + std::to_string(r) + ".et"));
    EXPECT_TRUE(std::filesystem::exists(et + "/comm_group.json"));
    const std::string cluster = layout.substr(0, layout.find(" --", 2));
    const double original = iteration_time_s("--plan " + plan), back = iteration_time_s(cluster + " --model chakra:" + et);
    if (layout.find("--tensor") == std::string::npos) {
      EXPECT_NEAR(back, original, 0.01 * original);
      continue;
    }
    // Its passes' parts and in-task messages join back: the plan read back has the same tasks
    // and collectives (in-task ones at the same points) and simulates to the same time.
    EXPECT_NEAR(back, original, 1e-9 * original);
    const std::string back_plan = (dir / "back.json").string();
    ASSERT_EQ(run_hetflow("plan " + cluster + " --model chakra:" + et + " --out " + back_plan).status, 0);
    EXPECT_EQ(nlohmann::json::parse(slurp(back_plan))["tasks"].size(), nlohmann::json::parse(slurp(plan))["tasks"].size());
    const std::vector<std::string> collectives = collectives_of(plan);
    EXPECT_EQ(collectives_of(back_plan), collectives);
    EXPECT_NE(std::find_if(collectives.begin(), collectives.end(), [](const std::string& c) { return c.find(" at []") == std::string::npos; }),
              collectives.end());  // in-task ones among them
  }
}

TEST(ChakraCli, TheTextSaysWhatWasWrittenAndHowToReadItBack) {
  const auto dir = case_dir("text");
  const std::string plan = (dir / "p.json").string(), et = (dir / "et").string();
  ASSERT_EQ(run_hetflow("plan --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --pipeline 2 "
                        "--workspace 0 --out " + plan).status, 0);
  const auto e = run_hetflow("export-chakra --plan " + plan + " -o " + et + " --prefix gpt");
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.out.find("2 ranks"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("--workload-configuration=" + et + "/gpt"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("--model chakra:" + et), std::string::npos) << e.out;
  const auto s = run_hetflow("simulate --cluster cpu-2 --model chakra:" + et);
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_NE(s.out.find("a workload read from Chakra traces: 2 ranks"), std::string::npos) << s.out;
}

TEST(ChakraCli, BadInputExits2NamingWhatIsWrong) {
  const auto dir = case_dir("bad");
  const std::string plan = (dir / "p.json").string(), et = (dir / "et").string();
  ASSERT_EQ(run_hetflow("plan --cluster cpu-4 --model gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256 --pipeline 4 "
                        "--workspace 0 --out " + plan).status, 0);
  ASSERT_EQ(run_hetflow("export-chakra " + plan + " -o " + et).status, 0);
  // Layout options with a workload that fixes every task.
  auto r = run_hetflow("simulate --cluster cpu-4 --model chakra:" + et + " --pipeline 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--pipeline"), std::string::npos) << r.err;
  // Too few devices, a missing directory, a gap in the ranks, a network command.
  r = run_hetflow("simulate --cluster cpu-2 --model chakra:" + et);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("4 ranks, but the cluster"), std::string::npos) << r.err;
  r = run_hetflow("simulate --cluster cpu-4 --model chakra:" + (dir / "none").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find((dir / "none").string()), std::string::npos) << r.err;
  std::filesystem::remove(et + "/hetflow.2.et");
  r = run_hetflow("simulate --cluster cpu-4 --model chakra:" + et);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("hetflow.2.et: rank: missing"), std::string::npos) << r.err;
  r = run_hetflow("describe --model chakra:" + et);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not a network"), std::string::npos) << r.err;
  r = run_hetflow("export-chakra " + plan + " -o " + et + " --prefix ../x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--prefix"), std::string::npos) << r.err;
}
