// --offload-optimizer as a user meets it: GPT-2 XL's data parallelism over 8 V100-16 does not
// fit, and the advice names offload with the ZeRO stages; offloaded, it plans, and `plan
// --json` moves Adam's 12 bytes a parameter off the device (oracle: 6 times the fp16
// weights) into host memory with the two 2-byte staging buffers (8 times them); the CPU back
// end trains an offloaded plan to the unoffloaded losses; the CUDA back end refuses it,
// blaming the plan; export-launch writes each framework's offload. --offload-activations
// likewise, and the search offloads what overflows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::loss_lines;
using hetflow::test_support::run_hetflow;

namespace {

// A small GPT run on the CPU back end with `layout` and then with `offload` too, three steps
// each: the two runs' report of the second.
hetflow::test_support::RunResult run_as_without(const std::string& layout, const std::string& offload) {
  const std::string run = "run --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --precision fp32 " +
                          layout + " --steps 3";
  const auto plain = run_hetflow(run);
  EXPECT_EQ(plain.status, 0) << plain.err;
  EXPECT_NE(loss_lines(plain.out), "") << plain.out;
  const auto offloaded = run_hetflow(run + " " + offload);
  EXPECT_EQ(offloaded.status, 0) << offloaded.err;
  EXPECT_EQ(loss_lines(offloaded.out), loss_lines(plain.out)) << offload;
  return offloaded;
}

}  // namespace

TEST(OffloadCli, GptXlFitsTheV100sWithItsOptimizerOnTheHost) {
  const auto plain = run_hetflow("plan --model gpt2-xl --data 8");
  EXPECT_EQ(plain.status, 3);
  EXPECT_NE(plain.err.find("--offload-optimizer"), std::string::npos) << plain.err;
  const auto offloaded = run_hetflow("plan --model gpt2-xl --data 8 --offload-optimizer --json");
  ASSERT_EQ(offloaded.status, 0) << offloaded.err;
  const auto m = nlohmann::json::parse(offloaded.out).at("devices").at(0).at("memory");
  const double weights = m.at("weights_bytes").get<double>();
  EXPECT_EQ(m.at("optimizer_bytes").get<double>(), 0);
  EXPECT_NEAR(m.at("host_bytes").get<double>() / weights, (12.0 + 2 + 2) / 2, 1e-9);
  const auto text = run_hetflow("plan --model gpt2-xl --data 8 --offload-optimizer");
  EXPECT_NE(text.out.find(", optimizer offloaded to host memory,"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("  host of v100-0: "), std::string::npos) << text.out;
}

TEST(OffloadCli, TheCpuBackEndTrainsAnOffloadedPlanAsWithout) { run_as_without("--data 2", "--offload-optimizer"); }

// Offloaded stashes really leave the chunk's arrays on the CPU back end and come back before
// their backward: a pipeline of two stages trains as without, loss for loss.
TEST(OffloadCli, TheCpuBackEndTrainsAPlanWithOffloadedStashesAsWithout) {
  const auto offloaded = run_as_without("--pipeline 2 --microbatches 4", "--offload-activations");
  EXPECT_NE(offloaded.out.find("stashes offloaded"), std::string::npos) << offloaded.out;
}

// GPT-2 XL in a pipeline of 4 at micro-batch 2 on the default cluster overflows the first
// stage with its stashes. Without ZeRO, the optimizer offloaded is not enough: the search
// offloads the stashes too; with ZeRO it keeps stage 2 with the stashes offloaded, the
// advice's fastest. Each plan it keeps builds and fits.
TEST(OffloadCli, TheSearchOffloadsStashesWhereTheyOverflow) {
  const std::string where = "--model gpt2-xl --global-batch 80 --micro-batch 2 --recompute none";
  const std::string space = " --policies uniform --tensor 1 --pipeline 4 --schedules 1f1b --sync allreduce --top 1";
  EXPECT_EQ(run_hetflow("plan " + where + " --pipeline 4").status, 3);
  const auto best_of = [](const std::string& out) {
    const size_t at = out.find("\nbest: ");
    return at == std::string::npos ? std::string() : out.substr(at + 7, out.find('\n', at + 1) - at - 7);
  };
  const auto no_zero = run_hetflow("search " + where + space + " --no-zero");
  ASSERT_EQ(no_zero.status, 0) << no_zero.err;
  EXPECT_NE(best_of(no_zero.out).find("p4 d5, mb 2, 1f1b, recompute none, allreduce, optimizer offloaded, stashes offloaded"),
            std::string::npos)
      << no_zero.out;
  EXPECT_EQ(run_hetflow("plan " + where + " --pipeline 4 --offload-optimizer --offload-activations").status, 0);
  const auto zero = run_hetflow("search " + where + space);
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_NE(best_of(zero.out).find("allreduce, zero 2, stashes offloaded"), std::string::npos) << zero.out;
  EXPECT_EQ(run_hetflow("plan " + where + " --pipeline 4 --zero-stage 2 --offload-activations").status, 0);
  // Never offloading, nothing fits.
  EXPECT_NE(run_hetflow("search " + where + space + " --no-offload").status, 0);
}

TEST(OffloadCli, TheCudaBackEndRefusesAnOffloadedPlanBlamingThePlan) {
  const auto r = run_hetflow("run --backend cuda --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 "
                             "--precision fp32 --data 2 --steps 1 --offload-optimizer");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("layout.offload.optimizer"), std::string::npos) << r.err;
  const auto acts = run_hetflow("run --backend cuda --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 "
                                "--precision fp32 --pipeline 2 --microbatches 4 --steps 1 --offload-activations");
  EXPECT_NE(acts.status, 0);
  EXPECT_NE(acts.err.find("layout.offload.activations"), std::string::npos) << acts.err;
}

TEST(OffloadCli, ExportLaunchWritesEachFrameworksOffload) {
  const auto ds = run_hetflow("export-launch --framework deepspeed --model gpt2-xl --data 8 --zero-stage 1 "
                              "--offload-optimizer");
  ASSERT_EQ(ds.status, 0) << ds.err;
  EXPECT_NE(ds.out.find("\"offload_optimizer\": {"), std::string::npos) << ds.out;
  const auto megatron = run_hetflow("export-launch --framework megatron --model gpt2-xl --data 8 --zero-stage 1 "
                                    "--offload-optimizer");
  ASSERT_EQ(megatron.status, 0) << megatron.err;
  EXPECT_NE(megatron.out.find("--optimizer-cpu-offload --optimizer-offload-fraction 1.0"), std::string::npos)
      << megatron.out;
  // Stashes: DeepSpeed offloads full recomputation's checkpoints; otherwise each says it cannot.
  const std::string acts = " --model gpt2-xl --pipeline 4 --microbatches 8 --offload-activations";
  const auto ds_full = run_hetflow("export-launch --framework deepspeed --recompute full" + acts);
  ASSERT_EQ(ds_full.status, 0) << ds_full.err;
  EXPECT_NE(ds_full.out.find("\"cpu_checkpointing\": true"), std::string::npos) << ds_full.out;
  const auto ds_kept = run_hetflow("export-launch --framework deepspeed" + acts);
  ASSERT_EQ(ds_kept.status, 0) << ds_kept.err;
  EXPECT_EQ(ds_kept.out.find("\"cpu_checkpointing\": true"), std::string::npos) << ds_kept.out;
  EXPECT_NE(ds_kept.out.find("activation offload without full recomputation"), std::string::npos) << ds_kept.out;
  const auto mg = run_hetflow("export-launch --framework megatron" + acts);
  ASSERT_EQ(mg.status, 0) << mg.err;
  EXPECT_NE(mg.out.find("activation offload (Megatron-Core"), std::string::npos) << mg.out;
}

// The search offloads what does not fit, and says which of offload and ZeRO is faster: GPT-2
// XL's data parallelism over the default cluster overflows the V100s (plan exits 3); without
// ZeRO the search keeps it with its optimizer offloaded, which `plan --offload-optimizer`
// builds; with both it keeps the placement its layout estimate finds faster (ZeRO-3 kept
// gathered), which simulates faster than offload's too.
TEST(OffloadCli, TheSearchOffloadsWhatDoesNotFitAndKeepsTheFaster) {
  const std::string where = "--model gpt2-xl --global-batch 40 --micro-batch 2 --recompute selective";
  EXPECT_EQ(run_hetflow("plan " + where).status, 3);
  const std::string space = " --policies uniform --tensor 1 --pipeline 1 --schedules 1f1b --sync allreduce --top 1";
  const auto simulated_s = [](const std::string& out, const std::string& plan) {
    const size_t at = out.find("     1 " + plan);
    if (at == std::string::npos) return -1.0;
    // the columns after the plan: estimate, then simulated, each "<number> s"
    std::istringstream row(out.substr(at + 7 + plan.size()));
    double estimate = 0, simulated = 0;
    std::string unit;
    row >> estimate >> unit >> simulated;
    return simulated;
  };
  const std::string offloaded = "uniform t1 p1 d20, mb 2, 1f1b, recompute selective, allreduce, optimizer offloaded";
  const auto no_zero = run_hetflow("search " + where + space + " --no-zero");
  ASSERT_EQ(no_zero.status, 0) << no_zero.err;
  const double offload_s = simulated_s(no_zero.out, offloaded);
  ASSERT_GT(offload_s, 0) << no_zero.out;
  EXPECT_EQ(run_hetflow("plan " + where + " --offload-optimizer").status, 0);
  const auto both = run_hetflow("search " + where + space);
  ASSERT_EQ(both.status, 0) << both.err;
  const size_t at = both.out.find("     1 uniform t1 p1 d20");
  ASSERT_NE(at, std::string::npos) << both.out;
  const std::string best = both.out.substr(at + 7, both.out.find("  ", at + 7) - at - 7);
  const double best_s = simulated_s(both.out, best);
  ASSERT_GT(best_s, 0) << both.out;
  EXPECT_LE(best_s, offload_s) << both.out;
}

// A node whose host cannot hold what its devices offload: the plan is refused naming the
// node (exit 3), and the advice, which only adds memory-saving changes, finds nothing.
TEST(OffloadCli, AHostTooSmallIsNamed) {
  const std::string path = hetflow::test_support::write_file(
      "small-host.yaml", "name: small-host\nnodes:\n  - {name: n, gpu: A100-80, gpus: 8, host: {memory: 8 GiB}}\n");
  const auto r = run_hetflow("plan --cluster " + path +
                             " --model gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=50257 --data 8 --offload-optimizer");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("node n's host memory holds 8 GiB but its 8 devices offload"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing nearby fits"), std::string::npos) << r.err;
}
