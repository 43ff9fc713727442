// hetflow calibrate --measured as a user runs it. The oracle: step times the simulator gave
// under a hidden calibration; from them alone the fit must give the hidden parameters back,
// and the file it writes must read back as the parameters it printed. The full check (the
// HetPipe testbed and v100-t4, 8 plans measured, 40 predicted) is tools/calibrate-check.sh.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/calibration.hpp"
#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;

namespace {

const std::string kCluster = HETFLOW_SOURCE_DIR "/tools/examples/v100-t4.yaml";
const std::string kModel = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024";

// Efficiencies far from the prior's 0.6, an overhead 3 x its 20 us.
const char* kHidden =
    "default_gpu: {overhead: 60 us}\n"
    "gpus:\n"
    "  V100-16: {max_efficiency: 0.45, overhead: 60 us}\n"
    "  T4: {max_efficiency: 0.3, overhead: 60 us}\n";

const std::vector<std::string> kLayouts = {
    "--pipeline 1 --microbatches 2",
    "--pipeline 4 --microbatches 4",
    "--pipeline 4 --micro-batch 4 --microbatches 8",
    "--pipeline 2 --micro-batch 2 --microbatches 4 --schedule gpipe",
    "--pipeline 1 --micro-batch 8 --microbatches 1",
};

double simulated_s(const std::string& layout, const std::string& calibration) {
  const auto s = run_hetflow("simulate --cluster " + kCluster + " --model " + kModel + " " + layout +
                             " --iterations 2 --calibration " + calibration + " --json");
  EXPECT_EQ(s.status, 0) << s.err;
  return nlohmann::json::parse(s.out)["iteration_time_s"].get<double>();
}

// The table of runs, CSV: the model's commas quoted.
std::string table(const std::vector<double>& step_s) {
  std::ostringstream t;
  t.precision(17);
  t << "# measured with our framework\ncluster,model,options,step_s\n";
  for (size_t i = 0; i < step_s.size(); ++i) t << kCluster << ",\"" << kModel << "\"," << kLayouts[i] << "," << step_s[i] << "\n";
  return t.str();
}

}  // namespace

TEST(CalibrateMeasuredCli, RecoversHiddenEfficienciesAndOverheadFromStepTimesAlone) {
  const auto dir = scratch_dir();
  const std::string hidden = (dir / "hidden.yaml").string(), runs = (dir / "runs.csv").string(),
                    fitted = (dir / "fitted.yaml").string();
  std::ofstream(hidden) << kHidden;
  std::vector<double> step_s;
  for (const std::string& l : kLayouts) step_s.push_back(simulated_s(l, hidden));
  std::ofstream(runs) << table(step_s);

  const auto c = run_hetflow("calibrate --measured " + runs + " --fit efficiency,overhead --folds 0 -o " + fitted + " --json");
  ASSERT_EQ(c.status, 0) << c.err << c.out;
  const auto j = nlohmann::json::parse(c.out);
  std::map<std::string, double> want = {{"V100-16.max_efficiency", 0.45}, {"T4.max_efficiency", 0.3}, {"overhead", 60e-6}};
  ASSERT_EQ(j["parameters"].size(), want.size()) << j.dump(1);
  for (const auto& p : j["parameters"]) {
    const std::string name = p["name"];
    ASSERT_EQ(want.count(name), 1u) << name;
    EXPECT_NEAR(p["value"].get<double>(), want[name], 0.05 * want[name]) << name;
    EXPECT_FALSE(p["at_bound"].get<bool>()) << name;
  }
  for (const auto& r : j["runs"]) EXPECT_NEAR(r["fitted_s"].get<double>(), r["measured_s"].get<double>(), 0.01 * r["measured_s"].get<double>());

  // The file is an ordinary calibration, holding what was printed, and writes back the same.
  const hetflow::model::Calibration got = hetflow::model::load_calibration(fitted);
  for (const auto& p : j["parameters"]) {
    const std::string name = p["name"];
    if (name == "overhead") {
      EXPECT_DOUBLE_EQ(got.gpu("T4").overhead_s, p["value"].get<double>());
      EXPECT_DOUBLE_EQ(got.default_gpu.overhead_s, p["value"].get<double>());
    } else {
      EXPECT_DOUBLE_EQ(got.gpu(name.substr(0, name.find('.'))).max_efficiency, p["value"].get<double>()) << name;
    }
  }
  EXPECT_EQ(hetflow::model::write_calibration(got), slurp(fitted));
  EXPECT_EQ(hetflow::model::parse_calibration(slurp(fitted), fitted), got);

  // Simulated with it, each run takes its measured time.
  for (size_t i = 0; i < kLayouts.size(); ++i) EXPECT_NEAR(simulated_s(kLayouts[i], fitted), step_s[i], 0.01 * step_s[i]);
}

// Runs faster than the data-sheet peak allows: the efficiency ends at its cap, and the report
// says so with the residual that remains. The estimate alone (fast).
TEST(CalibrateMeasuredCli, WarnsOfAnEfficiencyAtItsCap) {
  const auto dir = scratch_dir();
  const std::string runs = (dir / "runs.csv").string(), fitted = (dir / "fitted.yaml").string();
  std::ofstream(runs) << "options,step_s\n"
                         "\"--cluster " + kCluster + " --model " + kModel + " --pipeline 1\",1e-6\n"
                         "\"--cluster " + kCluster + " --model " + kModel + " --pipeline 4\",2e-6\n";
  const auto c = run_hetflow("calibrate --measured " + runs + " --estimate-only --fit efficiency -o " + fitted);
  ASSERT_EQ(c.status, 0) << c.err << c.out;
  EXPECT_NE(c.out.find("at its upper bound 1"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("the efficiency cap"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("at bound"), std::string::npos) << c.out;
}

TEST(CalibrateMeasuredCli, RefusesABadTableNamingItsLineAndField) {
  const auto dir = scratch_dir();
  const std::string runs = (dir / "runs.csv").string(), out = (dir / "out.yaml").string();
  std::ofstream(runs) << "cluster,model,step_s\n" << kCluster << ",\"" << kModel << "\",fast\n";
  auto r = run_hetflow("calibrate --measured " + runs + " -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find(runs + ":2: step_s: expected the measured seconds per iteration, found 'fast'"), std::string::npos) << r.err;
  std::ofstream(runs) << "cluster,seconds\n";
  r = run_hetflow("calibrate --measured " + runs + " -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find(runs + ":1: seconds: unknown column"), std::string::npos) << r.err;
  r = run_hetflow("calibrate --measured " + runs + " --trace x.csv -o " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--measured"), std::string::npos) << r.err;
}
