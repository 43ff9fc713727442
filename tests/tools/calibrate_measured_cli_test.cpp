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

  // From the prior alone (--starts 1): these runs need no other start, and each start costs
  // a fit; the other starts are tested on a confounded case below.
  const auto c = run_hetflow("calibrate --measured " + runs + " --fit efficiency,overhead --folds 0 --starts 1 -o " + fitted +
                             " --json");
  ASSERT_EQ(c.status, 0) << c.err << c.out;
  const auto j = nlohmann::json::parse(c.out);
  EXPECT_EQ(j["starts"].get<int>(), 1);
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

namespace {

const std::string kCpuModel = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=256";
const std::string kSmall = "--cluster cpu-2 --model " + kCpuModel + " --workspace 0 --precision fp32 --micro-batch 1";
const std::string kLarge = "--cluster cpu-2 --model " + kCpuModel + " --workspace 0 --precision fp32 --micro-batch 8";

}  // namespace

// Three runs of one plan say one number: the efficiency and the overhead can trade against
// each other without end. Fits from every start follow the runs, and the report names the two
// as confounded (strongly correlated and poorly determined) and says how to separate them.
TEST(CalibrateMeasuredCli, NamesParametersTheRunsCannotTellApart) {
  const auto dir = scratch_dir();
  const std::string runs = (dir / "runs.csv").string(), fitted = (dir / "fitted.yaml").string();
  std::ofstream(runs) << "options,step_s\n\"" << kSmall << "\",0.004\n\"" << kSmall << "\",0.004\n\"" << kSmall << "\",0.004\n";
  const auto c = run_hetflow("calibrate --measured " + runs + " --estimate-only --fit efficiency,overhead --folds 0 -o " +
                             fitted + " --json");
  ASSERT_EQ(c.status, 0) << c.err << c.out;
  const auto j = nlohmann::json::parse(c.out);
  EXPECT_EQ(j["starts"].get<int>(), 3);  // the default
  ASSERT_EQ(j["parameters"].size(), 2u) << j.dump(1);
  for (const auto& r : j["runs"]) EXPECT_NEAR(r["fitted_s"].get<double>(), 0.004, 0.004 * 1e-3);
  ASSERT_EQ(j["confounded"].size(), 1u) << j.dump(1);
  EXPECT_EQ(j["confounded"][0], nlohmann::json::parse(R"(["CPU.max_efficiency", "overhead"])"));
  bool said = false;
  for (const auto& w : j["warnings"]) said = said || w.get<std::string>().find("CPU.max_efficiency and overhead trade against "
                                                                                 "each other") != std::string::npos;
  EXPECT_TRUE(said) << j["warnings"].dump(1);
}

// --design chooses the runs that determine the parameters: of two copies of one plan and a
// plan of larger tasks (where the overhead weighs less against the efficiency), the second
// pick is never the copy of the first, which adds no new direction. The chosen rows are
// written as a table to measure (step_s empty), which calibrate reads back once filled in.
TEST(CalibrateMeasuredCli, DesignChoosesRunsThatSeparateTheParameters) {
  const auto dir = scratch_dir();
  const std::string pool = (dir / "pool.csv").string(), chosen = (dir / "chosen.csv").string();
  std::ofstream(pool) << "options\n\"" << kSmall << "\"\n\"" << kSmall << "\"\n\"" << kLarge << "\"\n";
  const auto c = run_hetflow("calibrate --measured " + pool + " --estimate-only --fit efficiency,overhead --design 2 -o " +
                             chosen + " --json");
  ASSERT_EQ(c.status, 0) << c.err << c.out;
  const auto j = nlohmann::json::parse(c.out);
  ASSERT_EQ(j["chosen"].size(), 2u);
  std::vector<int> picked;
  for (const auto& r : j["chosen"]) picked.push_back(r["index"].get<int>());
  EXPECT_TRUE(picked[0] == 2 || picked[1] == 2) << j.dump(1);  // the large-task plan, and one copy of the other
  EXPECT_NE(picked[0], picked[1]);
  for (const auto& p : j["parameters"]) EXPECT_TRUE(p["relative_error"].is_number()) << p;  // both determined

  // The table written: the two rows, step_s to fill in; with them filled in it calibrates.
  std::istringstream written(slurp(chosen));
  std::vector<std::string> rows;
  for (std::string line; std::getline(written, line);) {
    if (!line.empty() && line[0] != '#') rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 3u) << slurp(chosen);
  EXPECT_EQ(rows[0], "plan,cluster,model,options,step_s");
  std::string filled = rows[0] + "\n";
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].back(), ',') << rows[i];
    filled += rows[i] + (i == 1 ? "0.004\n" : "0.02\n");
  }
  std::ofstream(chosen) << filled;
  const auto fit = run_hetflow("calibrate --measured " + chosen + " --estimate-only --fit efficiency,overhead --folds 0 -o " +
                               (dir / "fitted.yaml").string());
  EXPECT_EQ(fit.status, 0) << fit.err << fit.out;
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
