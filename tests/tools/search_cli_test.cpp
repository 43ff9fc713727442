// hetflow search as a user runs it. The oracle: on a small mixed cluster, where simulating
// every candidate is affordable, the search (estimates, then the best 3 simulated) finds the
// plan an exhaustive simulation finds, or one as fast within 1 %; its plan and layout files
// run and plan as given.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/scratch.hpp"
#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
#ifdef HETFLOW_MPIEXEC
using hetflow::test_support::under_mpirun;
#endif

namespace {

// Writes a cluster file `name` into `dir`; returns its path.
std::string cluster_file(const std::filesystem::path& dir, const char* name, const std::string& yaml) {
  const std::string path = (dir / name).string();
  std::ofstream(path) << yaml;
  return path;
}

// Two nodes of two V100 and one of two T4, on 25 Gb/s NICs.
std::string mixed_cluster(const std::filesystem::path& dir) {
  return cluster_file(dir, "mixed.yaml", "name: mixed-6\nnodes:\n"
                         "  - {name: v100, count: 2, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                         "  - {name: t4, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}}\n");
}

const char* kModel = "--model gpt:layers=6,hidden=512,heads=8,seq=256,vocab=8000 --global-batch 24";
const char* kSpace = "--policies uniform,balanced,hetpipe-np,hetpipe-ed,grouped --recompute none --sync allreduce";

}  // namespace

TEST(SearchCli, FindsTheBestPlanAnExhaustiveSimulationFinds) {
  const auto dir = scratch_dir() / "exhaustive";
  std::filesystem::create_directories(dir);
  const std::string cluster = mixed_cluster(dir);
  const auto fast = run_hetflow("search --cluster " + cluster + " " + kModel + " " + kSpace + " --json");
  ASSERT_EQ(fast.status, 0) << fast.err;
  const auto all = run_hetflow("search --cluster " + cluster + " " + kModel + " " + kSpace + " --top 1000 --json");
  ASSERT_EQ(all.status, 0) << all.err;
  const auto f = nlohmann::json::parse(fast.out), a = nlohmann::json::parse(all.out);
  EXPECT_GT(a["ranked"].size(), 10u);  // every distinct fitting plan simulated
  for (const auto& r : a["ranked"]) EXPECT_TRUE(r["simulated"].get<bool>());
  // The exhaustive best, or a plan within 1 % of it (here two plans tie within 0.2 %: six
  // single-GPU stages, and three stages of two tensor-parallel GPUs).
  EXPECT_LE(f["best"]["iteration_time_s"].get<double>(), a["best"]["iteration_time_s"].get<double>() * 1.01)
      << "search: " << f["best"]["plan"] << ", exhaustive: " << a["best"]["plan"];
  EXPECT_GE(f["best"]["iteration_time_s"].get<double>(), a["best"]["iteration_time_s"].get<double>() * (1 - 1e-9));
  // No baseline beats the best, and the best's table row is the simulated one.
  for (const auto& b : f["baselines"]) {
    EXPECT_GE(b["iteration_time_s"].get<double>(), f["best"]["iteration_time_s"].get<double>() * (1 - 1e-9)) << b["name"];
  }
  EXPECT_GT(f["candidates_evaluated"].get<int>(), 0);
}

TEST(SearchCli, TheBestPlanSimulatesAsRankedAndItsLayoutFilePlans) {
  const auto dir = scratch_dir() / "files";
  std::filesystem::create_directories(dir);
  const std::string cluster = mixed_cluster(dir);
  const std::string plan = (dir / "best.json").string(), layout = (dir / "best.yaml").string();
  const auto r = run_hetflow("search --cluster " + cluster + " " + kModel + " " + kSpace +
                             " --out " + plan + " --out-layout " + layout + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto best = nlohmann::json::parse(r.out)["best"];
  const auto sim = run_hetflow("simulate --plan " + plan + " --iterations 3 --json");
  ASSERT_EQ(sim.status, 0) << sim.err;
  EXPECT_NEAR(nlohmann::json::parse(sim.out)["iteration_time_s"].get<double>(), best["iteration_time_s"].get<double>(),
              1e-6 * best["iteration_time_s"].get<double>());
  // The layout file alone (no --micro-batch, --schedule...) plans the best plan back: the
  // same plan file but for the policy's name and the fingerprint that covers it.
  const std::string again = (dir / "again.json").string();
  const auto planned = run_hetflow("plan --cluster " + cluster + " --model gpt:layers=6,hidden=512,heads=8,seq=256,vocab=8000"
                                   " --layout " + layout + " --out " + again);
  ASSERT_EQ(planned.status, 0) << planned.err << planned.out;
  auto searched_plan = nlohmann::json::parse(hetflow::test_support::slurp(plan));
  auto planned_plan = nlohmann::json::parse(hetflow::test_support::slurp(again));
  EXPECT_EQ(planned_plan["layout"]["policy"], "layout-file");
  for (auto* p : {&searched_plan, &planned_plan}) {
    p->erase("fingerprint");
    (*p)["layout"].erase("policy");
  }
  EXPECT_EQ(searched_plan, planned_plan);
}

// The report says how many plans were simulated and why the walk stopped, and where every
// candidate went (the counts add up to the candidates); a duration needs its unit.
TEST(SearchCli, SaysHowManyItSimulatedWhyItStoppedAndWhatItDropped) {
  const auto dir = scratch_dir() / "report";
  std::filesystem::create_directories(dir);
  const std::string args = "search --cluster " + mixed_cluster(dir) + " " + kModel + " " + kSpace;
  const auto j = run_hetflow(args + " --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto r = nlohmann::json::parse(j.out);
  const auto& d = r["dropped"];
  int sum = 0;
  for (const char* k : {"refused", "over_memory", "simulated", "not_completed", "same_plan", "estimate_above_best",
                        "over_budget", "estimate_only"}) {
    sum += d[k].get<int>();
  }
  EXPECT_EQ(sum, r["candidates"].get<int>());
  EXPECT_EQ(d["simulated"].get<size_t>(), r["ranked"].size());
  EXPECT_EQ(r["finalists"]["stop"], "estimate above the best simulated");
  EXPECT_GT(r["finalists"]["next_estimate"].get<double>(), r["finalists"]["best"].get<double>());
  const auto text = run_hetflow(args);
  ASSERT_EQ(text.status, 0) << text.err;
  const std::string simulated = std::to_string(r["finalists"]["simulated"].get<int>()) +
                                " plans simulated (3 iterations) in estimate order, at least the best 3: stopped at the "
                                "next estimate, ";
  EXPECT_NE(text.out.find(simulated), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("\ndropped: " + std::to_string(d["refused"].get<int>()) + " refused by the policies or the builder, "),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find(std::to_string(d["estimate_above_best"].get<int>()) + " estimated slower than the best simulated"),
            std::string::npos)
      << text.out;
  const auto bare = run_hetflow(args + " --search-time 30");
  EXPECT_EQ(bare.status, 2);
  EXPECT_NE(bare.err.find("--search-time"), std::string::npos) << bare.err;
}

TEST(SearchCli, BadOptionsNameTheOption) {
  const auto missing = run_hetflow("search --cluster hetpipe-testbed --model vgg19");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("global-batch"), std::string::npos) << missing.err;
  const auto policy = run_hetflow("search --model vgg19 --global-batch 8 --policies uniform,fastest");
  EXPECT_NE(policy.status, 0);
  EXPECT_NE(policy.err.find("--policies"), std::string::npos) << policy.err;
  EXPECT_NE(policy.err.find("fastest"), std::string::npos) << policy.err;
  const auto tensor = run_hetflow("search --model vgg19 --global-batch 8 --tensor 2,x");
  EXPECT_NE(tensor.status, 0);
  EXPECT_NE(tensor.err.find("--tensor"), std::string::npos) << tensor.err;
  const auto staleness = run_hetflow("search --model vgg19 --global-batch 8 --staleness -1");
  EXPECT_EQ(staleness.status, 2);
  EXPECT_NE(staleness.err.find("--staleness"), std::string::npos) << staleness.err;
  const auto grouping = run_hetflow("search --cluster hetpipe-testbed --model vgg19 --global-batch 8 --groupings '*x4 V100-16'");
  EXPECT_EQ(grouping.status, 2);
  EXPECT_NE(grouping.err.find("--groupings: hetpipe-testbed: group 1"), std::string::npos) << grouping.err;
  const auto recompute = run_hetflow("search --model vgg19 --global-batch 8 --recompute sometimes");
  EXPECT_NE(recompute.status, 0);
  EXPECT_NE(recompute.err.find("--recompute"), std::string::npos) << recompute.err;
  // A micro-batch that cannot split the batch is a mistake in the options, not a plan that
  // does not fit (it was exit 3, "none of the candidates fits").
  const auto split = run_hetflow("search --model vgg19 --global-batch 7 --micro-batch 1,2");
  EXPECT_EQ(split.status, 2);
  EXPECT_NE(split.err.find("--micro-batch: expected sizes that divide --global-batch 7, found 2"), std::string::npos)
      << split.err;
}

// --top 0 simulates nothing: the table says so instead of an MFU of 0.
TEST(SearchCli, TopZeroRanksByTheEstimateAlone) {
  const auto r = run_hetflow("search --cluster cpu-4 --model gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512 "
                             "--global-batch 8 --top 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("none simulated (--top 0): ranked by the estimate alone"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0.0%"), std::string::npos) << r.out;
}

namespace {
// The mixed cluster at rental prices, and eight A100 at theirs.
std::string priced_cluster(const std::filesystem::path& dir) {
  return cluster_file(dir, "priced.yaml", "name: priced-6\nnodes:\n"
                         "  - {name: v100, count: 2, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}, price: 2.48 USD/h}\n"
                         "  - {name: t4, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}, price: 0.35 USD/h}\n");
}
std::string a100_cluster(const std::filesystem::path& dir) {
  return cluster_file(dir, "a100.yaml", "name: a100-4\nnodes:\n"
                         "  - {name: a100, gpu: A100-40, gpus: 4, intra: {kind: nvswitch, bandwidth: 300 GB/s}, "
                         "nic: {count: 4, bandwidth: 200 Gb/s}, price: 3.67 USD/h}\n");
}
}  // namespace

// By cost, the best is what an exhaustive simulation finds cheapest per sample, and every
// plan's price is that of the GPUs it uses.
TEST(SearchCli, ByCostFindsTheCheapestPlanAnExhaustiveSimulationFinds) {
  const auto dir = scratch_dir() / "by-cost";
  std::filesystem::create_directories(dir);
  const std::string cluster = priced_cluster(dir);
  const std::string common = "search --cluster " + cluster + " " + kModel + " " + kSpace + " --objective cost --json";
  const auto fast = run_hetflow(common);
  ASSERT_EQ(fast.status, 0) << fast.err;
  const auto all = run_hetflow(common + " --top 1000");
  ASSERT_EQ(all.status, 0) << all.err;
  const auto f = nlohmann::json::parse(fast.out), a = nlohmann::json::parse(all.out);
  const auto usd = [](const nlohmann::json& r) {
    return r["iteration_time_s"].get<double>() * r["price_usd_per_hour"].get<double>() / 3600;
  };
  double cheapest = 1e300;
  for (const auto& r : a["ranked"]) {
    EXPECT_GT(r["price_usd_per_hour"].get<double>(), 0);
    EXPECT_LE(r["price_usd_per_hour"].get<double>(), 4 * 2.48 + 2 * 0.35 + 1e-9);
    cheapest = std::min(cheapest, usd(r));
  }
  EXPECT_DOUBLE_EQ(usd(a["best"]), cheapest);
  EXPECT_LE(usd(f["best"]), cheapest * 1.01) << "search: " << f["best"]["plan"] << ", exhaustive: " << a["best"]["plan"];
  // Without prices there is no cost to rank by.
  const auto unpriced = run_hetflow("search --cluster " + mixed_cluster(dir) + " " + kModel + " --objective cost");
  EXPECT_NE(unpriced.status, 0);
  EXPECT_NE(unpriced.err.find("price"), std::string::npos) << unpriced.err;
}

// Several clusters: each one's best is the one its own search finds, and the clusters are
// ranked by train time = tokens / tokens per second, and cost = time x price.
TEST(SearchCli, ComparesClustersByTheTimeAndCostOfTrainingTokens) {
  const auto dir = scratch_dir() / "clusters";
  std::filesystem::create_directories(dir);
  const std::string mixed = priced_cluster(dir), a100 = a100_cluster(dir);
  const std::string tail = std::string(" ") + kModel + " " + kSpace + " --json";
  const auto r = run_hetflow("search --clusters " + mixed + "," + a100 + " --tokens 2e9" + tail);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["clusters"].size(), 2u);
  double previous = 0;
  for (const auto& c : j["clusters"]) {
    const double tokens_per_s = c["tokens_per_s"].get<double>();
    EXPECT_NEAR(tokens_per_s, 24.0 * 256 / c["best"]["iteration_time_s"].get<double>(), tokens_per_s * 1e-9);
    EXPECT_NEAR(c["train_time_s"].get<double>(), 2e9 / tokens_per_s, 1e-6 * c["train_time_s"].get<double>());
    EXPECT_NEAR(c["train_cost_usd"].get<double>(), c["train_time_s"].get<double>() / 3600 * c["price_usd_per_hour"].get<double>(),
                1e-6 * c["train_cost_usd"].get<double>());
    EXPECT_GE(c["train_time_s"].get<double>(), previous);  // listed by time
    previous = c["train_time_s"].get<double>();
    // The same best as searching that cluster alone.
    const auto alone = run_hetflow("search --cluster " + (c["cluster"] == "a100-4" ? a100 : mixed) + tail);
    ASSERT_EQ(alone.status, 0) << alone.err;
    EXPECT_EQ(nlohmann::json::parse(alone.out)["best"]["plan"], c["best"]["plan"]);
  }
  ASSERT_EQ(j["by_cost"].size(), 2u);
  const auto cost_of = [&](const nlohmann::json& name) {
    for (const auto& c : j["clusters"]) {
      if (c["cluster"] == name) return c["train_cost_usd"].get<double>();
    }
    return -1.0;
  };
  EXPECT_LE(cost_of(j["by_cost"][0]), cost_of(j["by_cost"][1]));
  const auto one = run_hetflow("search --clusters " + mixed + tail);
  EXPECT_NE(one.status, 0);
  EXPECT_NE(one.err.find("--clusters"), std::string::npos) << one.err;
}

// `mpirun -np 2 hetflow search` shares the candidates and the simulations out and reports,
// from rank 0 alone, exactly what one process finds.
TEST(SearchCli, MpiRanksFindWhatOneProcessFinds) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI: the search runs in one process only";
#else
  const auto dir = scratch_dir() / "mpi";
  std::filesystem::create_directories(dir);
  const std::string search = "search --cluster " + mixed_cluster(dir) + " " + kModel + " " + kSpace + " --json";
  const auto one = run_hetflow(search);
  ASSERT_EQ(one.status, 0) << one.err;
  const auto two = run_hetflow(search, under_mpirun(2));
  ASSERT_EQ(two.status, 0) << two.err;
  auto a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(two.out);  // one report: rank 0's
  for (auto* j : {&a, &b}) {
    j->erase("wall_s");
    j->erase("search_wall_s");
  }
  EXPECT_EQ(a, b);
#endif
}

// On a terminal the search says how far it is, how fast and how long is left; redirected,
// it says nothing on stderr. (`script` gives the command a terminal.)
TEST(SearchCli, ShowsProgressOnATerminalOnly) {
  if (std::system("script -qec true /dev/null >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no terminal to give the search here (`script` missing, or no pseudo-terminals: /dev/pts)";
  }
  // Long enough (7 s of scoring on one thread here) for the line, which waits a second, to
  // show; a tenth of it under the sanitizers, which run it about 30 times slower (ASan).
#ifdef HETFLOW_SANITIZED
  const std::string choices = "--policies uniform,hetpipe-ed --sync allreduce,ps", candidates = " of 1296 candidates (";
#else
  const std::string choices = "--policies uniform,balanced,hetpipe-np,hetpipe-ed,hetpipe-hd --sync allreduce,ps",
                    candidates = " of 2700 candidates (";
#endif
  const std::string args =
      "search --cluster hetpipe-testbed --model resnet152 --global-batch 128 --top 0 --threads 1 " + choices;
  const std::string search = std::string(HETFLOW_BIN) + " " + args;
  std::string shown;
  if (FILE* p = popen(("script -qec '" + search + " >/dev/null' /dev/null").c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof buffer, p)) > 0;) shown.append(buffer, n);
    EXPECT_EQ(pclose(p), 0) << shown;
  }
  EXPECT_NE(shown.find("searching: "), std::string::npos) << shown;
  EXPECT_NE(shown.find(candidates), std::string::npos) << shown;
  EXPECT_NE(shown.find("/s), "), std::string::npos) << shown;
  EXPECT_NE(shown.find(" s left"), std::string::npos) << shown;
  const auto quiet = run_hetflow(args);
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

// The testbed claim, on the simulator: the search's best VGG-19 plan on HetPipe's
// cluster is faster than Megatron's uniform layout and every HetPipe policy's best.
TEST(SearchCli, BeatsTheUniformLayoutAndEveryHetPipePolicyOnTheHetPipeTestbed) {
  const auto r = run_hetflow("search --cluster hetpipe-testbed --model vgg19 --global-batch 128 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double best = j["best"]["iteration_time_s"].get<double>();
  std::set<std::string> names;
  for (const auto& b : j["baselines"]) {
    names.insert(b["name"].get<std::string>());
    EXPECT_LT(best, 0.99 * b["iteration_time_s"].get<double>()) << b["name"] << ": " << b["plan"] << "; best " << j["best"]["plan"];
  }
  for (const char* name : {"uniform (Megatron)", "hetpipe-np", "hetpipe-ed", "hetpipe-hd"}) EXPECT_TRUE(names.count(name)) << name;
}

// WSP on request, at the staleness the user accepts: its candidates are estimated and
// simulated over their steady state (2 D + 4 iterations), and the plan written says so.
TEST(SearchCli, WspCandidatesRunAtTheGivenStalenessOverTheirSteadyState) {
  const auto dir = scratch_dir() / "wsp";
  std::filesystem::create_directories(dir);
  const std::string cluster = mixed_cluster(dir), plan = (dir / "best.json").string();
  const auto r = run_hetflow("search --cluster " + cluster + " " + kModel +
                             " --policies hetpipe-np,grouped --sync wsp --staleness 2 --recompute none --out " + plan + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["best"]["sync"], "wsp");
  EXPECT_EQ(j["best"]["staleness"], 2);
  const auto sim = run_hetflow("simulate --plan " + plan + " --json");
  ASSERT_EQ(sim.status, 0) << sim.err;
  const auto s = nlohmann::json::parse(sim.out);
  EXPECT_EQ(s["iterations"], 8);
  EXPECT_NEAR(s["iteration_time_s"].get<double>(), j["best"]["iteration_time_s"].get<double>(),
              1e-6 * j["best"]["iteration_time_s"].get<double>());
}

// On a cluster whose loader is slower than any layout's GPUs (the NFS example: 1 GB/s shared
// by all, 8,663 ImageNet samples/s), every layout whose loads spread over the nodes is held to
// the file system's closed form, 4096 samples / 8,663 samples/s, and ties there; those are
// ranked by what their GPUs alone would do (each uses all 32 GPUs and has no price), which is
// the same search on the same cluster without its input section. Deeper pipelines put their
// workers' loads on fewer nodes, whose loader workers bound them lower: apart, and after.
TEST(SearchCli, InputBoundCandidatesRankByWhatTheirGpusAloneWouldDo) {
  const std::string nfs = HETFLOW_SOURCE_DIR "/tools/examples/a100x32-nfs.yaml";
  const auto dir = scratch_dir();
  const std::string plain = (dir / "a100x32.yaml").string();
  {
    std::ifstream in(nfs);
    std::ofstream out(plain);
    for (std::string line; std::getline(in, line) && line.rfind("input:", 0) != 0;) out << line << "\n";
  }
  const std::string space = " --model resnet50 --global-batch 4096 --policies uniform --tensor 1 --pipeline 1,2,4 "
                            "--micro-batch 32,64 --schedules 1f1b --recompute none --sync allreduce";
  const auto bound = run_hetflow("search --cluster " + nfs + space + " --top 0 --json");
  const auto free = run_hetflow("search --cluster " + plain + space + " --top 0 --json");
  ASSERT_EQ(bound.status, 0) << bound.err;
  ASSERT_EQ(free.status, 0) << free.err;
  // Every candidate's estimate, in the search's order (--top 0: the dropped list holds them all).
  const auto order = [](const std::string& out) {
    std::vector<std::pair<std::string, double>> rows;
    const auto j = nlohmann::json::parse(out);
    for (const auto& d : j["dropped_candidates"]) {
      rows.emplace_back(d["plan"].get<std::string>(), d["estimated_iteration_time_s"].get<double>());
    }
    return rows;
  };
  const auto held = order(bound.out), gpus = order(free.out);
  ASSERT_EQ(held.size(), 6u);
  ASSERT_EQ(gpus.size(), held.size());
  std::map<std::string, double> gpus_s(gpus.begin(), gpus.end());
  const double loader_s = 4096 / (1e9 / (147897477120.0 / 1281167.0));
  int at_floor = 0;
  for (const auto& [plan, s] : held) {
    EXPECT_GT(s, gpus_s.at(plan)) << plan << ": input-bound";
    if (std::abs(s / loader_s - 1) < 1e-9) ++at_floor;
  }
  EXPECT_EQ(at_floor, 4);  // p1 and p2, both micro-batch sizes
  // The expected order: by the loader's floor (to 1e-9), then by the GPUs' own estimate.
  std::vector<std::pair<std::string, double>> expected = held;
  std::stable_sort(expected.begin(), expected.end(), [&](const auto& a, const auto& b) {
    if (std::abs(a.second / b.second - 1) > 1e-9) return a.second < b.second;
    return gpus_s.at(a.first) < gpus_s.at(b.first);
  });
  EXPECT_EQ(held, expected);
  // The report says so, with the GPUs' own time.
  const auto j = nlohmann::json::parse(bound.out);
  EXPECT_TRUE(j["ranked"][0]["input_bound"].get<bool>());
  EXPECT_DOUBLE_EQ(j["ranked"][0]["compute_iteration_time_s"].get<double>(), gpus_s.at(j["ranked"][0]["plan"]));
  EXPECT_FALSE(nlohmann::json::parse(free.out)["ranked"][0]["input_bound"].get<bool>());
  const auto text = run_hetflow("search --cluster " + nfs + space + " --top 0");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("  input-bound (GPUs alone 22.7 ms)\n"), std::string::npos) << text.out;
  // Simulated, the plans the loader holds run at its rate to the last digits, and the same
  // rule orders them: the best is the one whose GPUs alone are fastest.
  const auto simulated = run_hetflow("search --cluster " + nfs + space + " --top 2 --json");
  ASSERT_EQ(simulated.status, 0) << simulated.err;
  const auto s = nlohmann::json::parse(simulated.out);
  ASSERT_GE(s["ranked"].size(), 2u);
  std::vector<std::string> plans, by_gpus;
  for (const auto& r : s["ranked"]) {
    EXPECT_TRUE(r["simulated"].get<bool>());
    EXPECT_NEAR(r["iteration_time_s"].get<double>() / loader_s, 1.0, 1e-9);
    plans.push_back(r["plan"]);
  }
  by_gpus = plans;
  std::stable_sort(by_gpus.begin(), by_gpus.end(), [&](const std::string& a, const std::string& b) { return gpus_s.at(a) < gpus_s.at(b); });
  EXPECT_EQ(plans, by_gpus);
  EXPECT_EQ(s["best"]["plan"], held.front().first);
}
