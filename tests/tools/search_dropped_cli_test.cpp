// The candidates `hetflow search` dropped, each with its reason: grouped in the text (the
// first few of each reason and a count of the rest), every one in --json with its layout.
// The oracles: the divisibility of the global batch (closed form) for the refusals, `hetflow
// plan` of the same options for the over-memory ones, the best simulated for the rest.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/units.hpp"
#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
namespace u = hetflow::model::units;

namespace {

// Two nodes of two V100-16 and one of two T4: six devices.
std::string mixed_cluster() {
  const auto path = scratch_dir() / "dropped-mixed6.yaml";
  std::ofstream(path) << "name: mixed-6\nnodes:\n"
                         "  - {name: v100, count: 2, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                         "  - {name: t4, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                         "nic: {count: 1, bandwidth: 25 Gb/s}}\n";
  return path.string();
}

const char* kModel = "gpt:layers=24,hidden=3072,heads=24,seq=1024,vocab=8000";

std::string search_args() {
  return std::string("search --cluster ") + mixed_cluster() + " --model " + kModel +
         " --policies uniform --tensor 1 --pipeline 1,2,3,6 --micro-batch 1,2 --schedules 1f1b --recompute none"
         " --sync allreduce --global-batch 4 --top 1 --no-zero --no-offload";
}

std::string summary(int pipeline, int workers, int micro_batch) {
  return "uniform t1 p" + std::to_string(pipeline) + (workers > 0 ? " d" + std::to_string(workers) : "") + ", mb " +
         std::to_string(micro_batch) + ", 1f1b, recompute none, allreduce";
}

}  // namespace

// Uniform t1 pP on six devices has d = 6 / P replicas, and a global batch of 4 splits into
// micro-batches of m only where m x d divides 4: P 1 (d 6) and P 2 (d 3) never do. Those four
// are refused on --global-batch, each saying the multiple it needed; the text shows the first
// three, different refusals first, and a count; --dropped 0 leaves the counts alone.
TEST(SearchDropped, EachDroppedCandidateIsListedWithItsReason) {
  const auto j = run_hetflow(search_args() + " --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto r = nlohmann::json::parse(j.out);
  const auto& dropped = r["dropped_candidates"];
  // Every candidate but the simulated ones is listed, as many of each reason as counted.
  EXPECT_EQ(dropped.size(), r["candidates"].get<size_t>() - r["dropped"]["simulated"].get<size_t>());
  std::map<std::string, int> by_reason;
  for (const auto& c : dropped) ++by_reason[c["reason"].get<std::string>()];
  for (const auto& [reason, n] : by_reason) EXPECT_EQ(n, r["dropped"][reason].get<int>()) << reason;

  // The refusals: exactly the (P, m) whose m x 6 / P does not divide 4, in the space's order.
  std::vector<std::string> refused_text;
  size_t k = 0;
  std::vector<nlohmann::json> refused;
  for (const auto& c : dropped) {
    if (c["reason"] == "refused") refused.push_back(c);
  }
  for (const int p : {1, 2, 3, 6}) {
    for (const int m : {1, 2}) {
      const int multiple = m * 6 / p;
      if (4 % multiple == 0) continue;
      ASSERT_LT(k, refused.size());
      const auto& c = refused[k++];
      EXPECT_EQ(c["pipeline"], p);
      EXPECT_EQ(c["micro_batch"], m);
      EXPECT_EQ(c["tensor"], 1);
      EXPECT_EQ(c["schedule"], "1f1b");
      EXPECT_EQ(c["option"], "--global-batch");
      const std::string why = "expected a multiple of micro-batch x data-parallel size = " + std::to_string(multiple) + ", found 4";
      EXPECT_EQ(c["why"], why);
      EXPECT_EQ(c["plan"], summary(p, 0, m));
      refused_text.push_back("    " + summary(p, 0, m) + ": " + why + "\n");
    }
  }
  EXPECT_EQ(k, refused.size());
  ASSERT_EQ(refused_text.size(), 4u);

  // Over memory: `hetflow plan` of the same options refuses it (exit 3), naming the device.
  std::vector<nlohmann::json> over;
  for (const auto& c : dropped) {
    if (c["reason"] == "over_memory") over.push_back(c);
  }
  ASSERT_FALSE(over.empty());
  for (const auto& c : over) {
    const auto plan = run_hetflow("plan --cluster " + mixed_cluster() + " --model " + kModel + " --pipeline " +
                                  std::to_string(c["pipeline"].get<int>()) + " --micro-batch " +
                                  std::to_string(c["micro_batch"].get<int>()) + " --global-batch 4");
    EXPECT_EQ(plan.status, 3) << c.dump();
    EXPECT_NE(plan.err.find("  - " + c["device"].get<std::string>() + " needs "), std::string::npos) << plan.err;
    EXPECT_GT(c["over_bytes"].get<double>(), 0);
  }
  // The rest: estimated slower than the best simulated.
  const double best = r["finalists"]["best"].get<double>();
  std::string slower_text;
  for (const auto& c : dropped) {
    if (c["reason"] != "estimate_above_best") continue;
    EXPECT_GT(c["estimated_iteration_time_s"].get<double>(), best) << c.dump();
    slower_text += "    " + c["plan"].get<std::string>() + ": estimate " +
                   u::human_time_s(c["estimated_iteration_time_s"].get<double>()) + "\n";
  }
  ASSERT_FALSE(slower_text.empty());

  // The text: the counts' line, then each reason's first three and a count of the rest.
  std::string over_text;
  for (size_t i = 0; i < over.size() && i < 3; ++i) {
    over_text += "    " + over[i]["plan"].get<std::string>() + ": estimate " +
                 u::human_time_s(over[i]["estimated_iteration_time_s"].get<double>()) + "; " +
                 over[i]["device"].get<std::string>() + " over by " + u::human_bytes(over[i]["over_bytes"].get<double>()) +
                 " (the layout's bound)\n";
    if (i > 0) {
      EXPECT_LE(over[i - 1]["estimated_iteration_time_s"].get<double>(), over[i]["estimated_iteration_time_s"].get<double>());
    }
  }
  const auto t = run_hetflow(search_args());
  ASSERT_EQ(t.status, 0) << t.err;
  const std::string n_over = std::to_string(over.size());
  const std::string n_slower = std::to_string(by_reason["estimate_above_best"]);
  const std::string expected =
      "\ndropped: 4 refused by the policies or the builder, " + n_over + " over memory (" + n_over +
      " by their layout's bound), " + n_slower + " estimated slower than the best simulated\n"
      "dropped candidates by reason (3 of each; --dropped N shows N, --json lists every one):\n"
      "  4 refused on --global-batch:\n" +
      refused_text[0] + refused_text[1] + refused_text[2] + "    and 1 more\n" + "  " + n_over +
      " over memory, the fastest estimates first:\n" + over_text + "  " + n_slower +
      " estimated slower than the best simulated:\n" + slower_text + "\n  rank plan";
  EXPECT_NE(t.out.find(expected), std::string::npos) << "expected:\n" << expected << "\nfound:\n" << t.out;

  const auto counts_only = run_hetflow(search_args() + " --dropped 0");
  ASSERT_EQ(counts_only.status, 0) << counts_only.err;
  EXPECT_EQ(counts_only.out.find("dropped candidates by reason"), std::string::npos) << counts_only.out;
  const auto bad = run_hetflow(search_args() + " --dropped -1");
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "hetflow: <command line>: --dropped: expected 0 to 1000000, found -1\n");
}
