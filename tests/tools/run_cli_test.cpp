// hetflow run as a user runs it: the measured summary beside the estimate, the trace it
// writes, plan files, and bad options (exit 2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/safetensors.hpp"
#include "exec/token_data.hpp"
#include "kernels/matmul.hpp"
#include "tests/tools/run_hetflow.hpp"
#include "traces/trace_io.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
#ifdef HETFLOW_MPIEXEC
using hetflow::test_support::under_mpirun;
#endif
using hetflow::test_support::slurp;

namespace {
const char* kTiny = "--cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --pipeline 2 --microbatches 4 "
                    "--workspace 0";
}

TEST(RunCli, JsonSummaryTraceAndSteps) {
  const auto dir = scratch_dir();
  const std::string csv = (dir / "t.csv").string(), chrome = (dir / "t.json").string();
  const auto r = run_hetflow(std::string("run ") + kTiny + " --compute proxy --steps 2 --warmup 1 --json --trace " + csv + " --chrome " + chrome);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["completed"].get<bool>());
  EXPECT_EQ(j["compute"], "proxy");
  EXPECT_EQ(j["steps"].size(), 3u);
  EXPECT_TRUE(j["steps"][0]["warmup"].get<bool>());
  EXPECT_GT(j["iteration_time_s"].get<double>(), 0);
  EXPECT_GT(j["analytic_iteration_time_s"].get<double>(), 0);
  // The simulator's prediction of the same plan, beside the measurement.
  EXPECT_TRUE(j["simulated"].get<bool>());
  EXPECT_GT(j["simulated_iteration_time_s"].get<double>(), 0);
  EXPECT_GT(j["devices"][0]["simulated_utilization"].get<double>(), 0);
  EXPECT_GT(j["throughput_tokens_per_s"].get<double>(), 0);
  ASSERT_EQ(j["devices"].size(), 2u);
  EXPECT_GT(j["devices"][0]["peak_transient_bytes"].get<double>(), 0);
  const hetflow::traces::Trace trace = hetflow::traces::read_trace_csv(slurp(csv), csv);
  EXPECT_EQ(trace.source, "exec-cpu");
  EXPECT_EQ(trace.compute, "proxy");
  EXPECT_EQ(trace.fingerprint, j["fingerprint"]);
  EXPECT_EQ(static_cast<long long>(trace.events.size()), j["task_instances"].get<long long>());
  EXPECT_FALSE(nlohmann::json::parse(slurp(chrome))["traceEvents"].empty());
  // Utilisation is busy time over the iteration time, both after the same warm-up (none here).
  const auto cold = run_hetflow(std::string("run ") + kTiny + " --compute proxy --steps 2 --warmup 0 --json");
  ASSERT_EQ(cold.status, 0) << cold.err;
  const auto c = nlohmann::json::parse(cold.out);
  for (const auto& d : c["devices"]) {
    EXPECT_NEAR(d["utilization"].get<double>(), d["busy_s"].get<double>() / c["iteration_time_s"].get<double>(),
                1e-9 * d["utilization"].get<double>())
        << d["name"];
  }
}

TEST(RunCli, TextReportAndPlanFile) {
  const auto dir = scratch_dir();
  const std::string plan = (dir / "plan.json").string();
  ASSERT_EQ(run_hetflow(std::string("plan ") + kTiny + " --out " + plan).status, 0);
  const auto r = run_hetflow("run --plan " + plan + " --compute proxy --steps 1 --flop-scale 0.5");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* text : {"step   0", "(warm-up)", "iteration time", "estimate", "tokens/s", "compute proxy", "FLOPs x 0.5",
                           "peak tensors"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
}

// A proxy run at --flop-scale s does s of the model's FLOPs, and MFU counts those: the
// simulator's and the estimate's MFU, against the cost model's own peak, cannot pass 100 %
// (they read 18,000 % when MFU counted the whole model's FLOPs).
// The --metrics CSV counts them too: its per-iteration MFU, weighted by the iterations'
// times, is the report's (it counted the whole model's FLOPs, 500 times the report's here).
TEST(RunCli, MfuOfAScaledProxyRunCountsTheFlopsItRan) {
  const auto dir = scratch_dir();
  const std::string metrics = (dir / "metrics.csv").string();
  const auto r = run_hetflow("run --cluster cpu-2 --model gpt2-124m --pipeline 2 --microbatches 4 --compute proxy "
                             "--flop-scale 0.002 --steps 2 --json --metrics " + metrics);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["flop_scale"], 0.002);
  for (const char* field : {"analytic_mfu", "simulated_mfu"}) {
    EXPECT_GT(j[field].get<double>(), 0.05) << field;
    EXPECT_LE(j[field].get<double>(), 1.0) << field;
  }
  EXPECT_GT(j["mfu"].get<double>(), 0) << r.out;

  // iteration,start_s,end_s,time_s,samples_per_s,tokens_per_s,mfu,...: after the one warm-up step.
  std::istringstream csv(slurp(metrics));
  std::string line;
  double flop_time = 0, time = 0;
  int rows = 0;
  while (std::getline(csv, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("iteration,", 0) == 0) continue;
    std::vector<double> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) cells.push_back(std::stod(cell));
    ASSERT_GE(cells.size(), 7u) << line;
    if (rows++ < j["warmup"].get<int>()) continue;
    flop_time += cells[6] * cells[3];
    time += cells[3];
  }
  EXPECT_EQ(rows, 3) << slurp(metrics);
  ASSERT_GT(time, 0);
  EXPECT_NEAR(flop_time / time, j["mfu"].get<double>(), 0.01 * j["mfu"].get<double>()) << slurp(metrics);
}

TEST(RunCli, BadOptionsExit2) {
  struct Bad {
    const char* args;
    const char* says;
  } bad[] = {
      {"--backend tpu", "expected cpu or cuda"},
      {"--steps 0", "--steps"},
      {"--warmup -1", "--warmup"},
      {"--watchdog soon", "--watchdog"},
      {"--flop-scale -2", "--flop-scale"},
      {"--flop-scale 0", "--flop-scale: expected a factor above 0"},
      {"--flop-scale 0.5 --compute real", "--flop-scale: scales proxies' work, and this run trains for real"},
      {"--flop-scale 0.5", "--flop-scale: scales proxies' work"},
      {"--max-buffer 2TiB", "--max-buffer"},
      {"--iterations 4", "unrecognised option '--iterations' (hetflow run takes --steps and --warmup instead)"},
      {"--fold", "folded replicas are for simulation"},
      {"--iterations=2", "(hetflow run takes --steps and --warmup instead)"},
      {"--steps 100000 --max-tasks 1000", "--max-tasks"},
      {"--compute maybe", "--compute: expected auto, real or proxy"},
      {"--lr -1", "--lr"},
      {"--adam-eps 0", "--adam-eps"},
      {"--adam-beta2 1", "--adam-beta2"},
      {"--clip-grad nan", "--clip-grad"},
      {"--moe-router-bias-update-rate -0.001", "--moe-router-bias-update-rate: expected a number from 0 to 1"},
      {"--loss-scale 1000", "--loss-scale: expected a power of two"},
      {"--initial-loss-scale 4 --min-loss-scale 8", "--min-loss-scale: is above --initial-loss-scale"},
      {"--hysteresis 0", "--hysteresis"},
      {"--hysteresis 1.5", "--hysteresis: expected a whole number"},
      {"--initial-loss-scale 65536", "--initial-loss-scale: applies to dynamic loss scaling"},
      {"--compute proxy --init-weights w.safetensors", "--init-weights: needs --compute real"},
      {"--data-path /nonexistent/tokens.bin", "/nonexistent/tokens.bin"},
      {"--init-weights /nonexistent/w.safetensors", "/nonexistent/w.safetensors"},
      // Outputs are checked before the run, not after it.
      {"--save-weights /nonexistent/w.safetensors", "--save-weights: cannot be written: its folder /nonexistent does not exist"},
      {"--trace /nonexistent/t.csv", "--trace: cannot be written: its folder /nonexistent does not exist"},
      {"--chrome /", "--chrome: cannot be written: it is a folder"},
      {"--save-checkpoint /nonexistent/ckpt", "--save-checkpoint: cannot be written: its folder /nonexistent does not exist"},
      {"--compute proxy --save-checkpoint ckpt", "--save-checkpoint: needs --compute real"},
      {"--save-interval 2", "--save-interval: says how often to write --save-checkpoint's folder: give it too"},
      {"--save-interval 0 --save-checkpoint ckpt", "--save-interval"},
      {"--resume /nonexistent/ckpt", "is not a folder (a training checkpoint is one"},
      {"--resume / --init-weights w.safetensors", "--init-weights: a resumed run takes its checkpoint's weights"},
      {"--resume /", "holds no trainer_state.json: not a training checkpoint"},
  };
  for (const Bad& b : bad) {
    const auto r = run_hetflow(std::string("run ") + kTiny + " " + b.args);
    EXPECT_EQ(r.status, 2) << b.args << "\n" << r.err << r.out;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.args << "\n" << r.err;
    EXPECT_EQ(r.out.find("ran "), std::string::npos) << b.args << ": refused after running\n" << r.out;
  }
  // A token file too short for one step (4 samples of 32 tokens read 129): the input's fault.
  const auto dir = scratch_dir();
  const std::string tokens = (dir / "short.bin").string();
  {
    std::int32_t header[256] = {20240520, 1, 5};
    const std::uint16_t five[5] = {1, 2, 3, 4, 5};
    std::ofstream file(tokens, std::ios::binary);
    file.write(reinterpret_cast<const char*>(header), sizeof header);
    file.write(reinterpret_cast<const char*>(five), sizeof five);
  }
  const auto short_file = run_hetflow(std::string("run ") + kTiny + " --compute real --steps 1 --data-path " + tokens);
  EXPECT_EQ(short_file.status, 2) << short_file.err << short_file.out;
  EXPECT_NE(short_file.err.find("the file holds 5 tokens; a step of B = 4 samples of T = 32 tokens reads B*T + 1 = 129"),
            std::string::npos)
      << short_file.err;
  const auto r = run_hetflow("run --plan /nonexistent/plan.json");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("/nonexistent/plan.json"), std::string::npos) << r.err;
}

// A constant loss scale (a power of two) trains to the same losses as none, and says so.
TEST(RunCli, AConstantLossScaleIsReportedAndChangesNothing) {
  const auto plain = run_hetflow(std::string("run ") + kTiny + " --steps 2 --json");
  const auto scaled = run_hetflow(std::string("run ") + kTiny + " --steps 2 --json --loss-scale 1024");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(scaled.status, 0) << scaled.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(scaled.out);
  EXPECT_FALSE(a.contains("loss_scale"));
  EXPECT_EQ(b.at("loss_scale"), 1024.0);
  EXPECT_EQ(b.at("skipped_steps"), 0);
  ASSERT_EQ(a.at("steps").size(), b.at("steps").size());
  for (size_t i = 0; i < a.at("steps").size(); ++i) EXPECT_EQ(a.at("steps")[i].at("loss"), b.at("steps")[i].at("loss"));
}

// Where no GPU is visible, --backend cuda ends with a message saying so (exit 1), not a crash.
TEST(RunCli, CudaBackendWithoutAGpuSaysSo) {
  if (hetflow::kernels::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: this test is for machines without one";
  for (const char* compute : {"proxy", "real"}) {
    const auto r = run_hetflow(std::string("run ") + kTiny + " --backend cuda --steps 1 --compute " + compute);
    EXPECT_EQ(r.status, 1) << compute << "\n" << r.err << r.out;
    const bool says =
        r.err.find("no CUDA device visible") != std::string::npos || r.err.find("no CUDA back end") != std::string::npos;
    EXPECT_TRUE(says) << compute << "\n" << r.err;
  }
#ifdef HETFLOW_MPIEXEC
  // Under mpirun each process needs its own block's GPUs and says so.
  const auto m = run_hetflow(std::string("run ") + kTiny + " --backend cuda --steps 1", under_mpirun(2));
  EXPECT_NE(m.status, 0) << m.err << m.out;
  const bool each = m.err.find("this process's 1 device(s) need as many GPUs") != std::string::npos ||
                    m.err.find("no CUDA back end") != std::string::npos;
  EXPECT_TRUE(each) << m.err;
#endif
}

TEST(RunCli, AStalledRunExits4WithTheWatchdogsReportAndAPartialTrace) {
  const auto dir = scratch_dir();
  const std::string csv = (dir / "partial.csv").string();
  // Compute tasks of seconds each against a 100 ms watchdog: the first one trips it.
  const auto r = run_hetflow(std::string("run ") + kTiny + " --compute proxy --flop-scale 100000 --watchdog 100ms --trace " + csv);
  EXPECT_EQ(r.status, 4) << r.err << r.out;
  EXPECT_NE(r.out.find("THE RUN DID NOT COMPLETE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("watchdog"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device 0 (host/gpu0): forward #"), std::string::npos) << r.out;
  const hetflow::traces::Trace trace = hetflow::traces::read_trace_csv(slurp(csv), csv);
  EXPECT_EQ(trace.source, "exec-cpu");
  // Its summary counts no step that did not run whole: no time, no throughput.
  const auto j = run_hetflow(std::string("run ") + kTiny + " --compute proxy --flop-scale 100000 --watchdog 100ms --json");
  EXPECT_EQ(j.status, 4) << j.err;
  const auto summary = nlohmann::json::parse(j.out);
  EXPECT_TRUE(summary["steps"].empty()) << summary["steps"];
  EXPECT_EQ(summary["iteration_time_s"].get<double>(), 0);
  EXPECT_EQ(summary["mfu"].get<double>(), 0);
}

TEST(RunCli, APlanThatCannotRunExits3) {
  const auto dir = scratch_dir();
  const std::string plan = (dir / "plan.json").string(), broken = (dir / "broken.json").string();
  ASSERT_EQ(run_hetflow(std::string("plan ") + kTiny + " --out " + plan).status, 0);
  auto j = nlohmann::json::parse(slurp(plan));
  j.erase("fingerprint");  // a changed plan keeps no stale fingerprint (reading would refuse it)
  for (auto& device : j["programs"]) {  // drop the first receive from its program: its send is unmatched
    for (auto& stream : device) {
      auto& tasks = stream["tasks"];
      for (size_t k = 0; k < tasks.size(); ++k) {
        if (j["tasks"][tasks[k].get<size_t>()]["kind"] != "recv") continue;
        tasks.erase(k);
        std::ofstream(broken) << j.dump();
        const auto r = run_hetflow("run --plan " + broken);
        EXPECT_EQ(r.status, 3) << r.err << r.out;
        EXPECT_NE(r.err.find("plan cannot run"), std::string::npos) << r.err;
        return;
      }
    }
  }
  FAIL() << "the plan has no receive";
}

// Real math (the default where the plan is covered): the loss of every step, the model and
// the data it trained on, and weights that go back out.
TEST(RunCli, RealTrainingReportsTheLossOfEveryStep) {
  const auto dir = scratch_dir();
  const std::string weights = (dir / "w.safetensors").string();
  const auto r = run_hetflow(std::string("run ") + kTiny + " --precision fp32 --steps 3 --warmup 0 --lr 1e-2 --save-weights " +
                             weights + " --json");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["compute"], "real");
  ASSERT_EQ(j["steps"].size(), 3u);
  // A fresh model predicts about uniformly: ln(256) per token (learning is tested in exec/).
  EXPECT_NEAR(j["steps"][0]["loss"].get<double>(), std::log(256.0), 0.1);
  EXPECT_GT(j["data_entropy_nats"].get<double>(), 0);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_NE(j["model"].get<std::string>().find("GPT-2 style"), std::string::npos);
  // Each device's measured peak of the model's arrays, beside the plan's memory model of it
  // (an FP32 plan: the two count the same arrays, so they agree to within what the model
  // approximates: 5 % here, checked to 15 %).
  for (const auto& device : j["devices"]) {
    const double measured = device["peak_model_bytes"].get<double>(), planned = device["plan_model_bytes"].get<double>();
    EXPECT_GT(measured, 0);
    EXPECT_NEAR(measured, planned, 0.15 * planned) << device.dump();
  }
  const auto text = run_hetflow(std::string("run ") + kTiny + " --steps 1 --init-weights " + weights);
  ASSERT_EQ(text.status, 0) << text.err;
  for (const char* says : {"compute real: the model's training math in FP32 (the plan says fp16)", "loss ", "model: GPT-2 style",
                           "data: ", "MFU", "AdamW lr 0.0003", "model peak", "without the workspace reserve"}) {
    EXPECT_NE(text.out.find(says), std::string::npos) << says << "\n" << text.out;
  }
}

// Megatron's schedule options: the report and --json say the schedule and each step's rate
// (the closed forms of lr_schedule.hpp: cosine from 3e-4 to 1e-5 over steps 1..4 after one of
// warm-up from 0; linear from 3e-4 to 0 over 10), and settings that make none are refused
// naming the option.
TEST(RunCli, ALearningRateScheduleIsReportedAndBadOnesRefused) {
  const std::string run = std::string("run ") + kTiny + " --compute real --steps 3 --warmup 1";
  const auto text = run_hetflow(run + " --lr-decay-style cosine --lr-warmup-iters 1 --min-lr 1e-5");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("AdamW lr 0.0003 (cosine to 1e-05 by step 4, after 1 of warm-up from 0)"), std::string::npos)
      << text.out;
  const char* rates[] = {"lr 0   (warm-up)\n", "lr 0.0003\n", "lr 0.0002275\n", "lr 8.25e-05\n"};
  for (int i = 0; i < 4; ++i) {  // step i's line ends with its rate
    const size_t line = text.out.find("  step   " + std::to_string(i) + " ");
    ASSERT_NE(line, std::string::npos) << i << "\n" << text.out;
    const std::string step = text.out.substr(line, text.out.find('\n', line) + 1 - line);
    EXPECT_NE(step.find(rates[i]), std::string::npos) << step;
  }
  const auto json = run_hetflow(run + " --lr-decay-style linear --lr-decay-iters 10 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto report = nlohmann::json::parse(json.out);
  const auto optimizer = report["optimizer"];
  EXPECT_EQ(optimizer["lr_decay_style"], "linear");
  EXPECT_EQ(optimizer["lr_decay_iters"], 10);
  ASSERT_EQ(report["steps"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(report["steps"][i]["lr"].get<double>(), 3e-4 * (1 - i / 10.0), 1e-15) << i;
  for (const auto& [args, says] : {std::pair{" --lr-decay-style cosine-annealing", "--lr-decay-style: expected constant, linear"},
                                   std::pair{" --min-lr 1", "--min-lr: expected a rate from 0 to --lr"},
                                   std::pair{" --lr-decay-style cosine --lr-warmup-iters 4", "--lr-warmup-iters: 4 steps of warm-up leave no decay"},
                                   std::pair{" --lr-decay-style cosine --lr-warmup-iters 4 --lr-decay-iters 3", "--lr-decay-iters: expected more steps (3)"},
                                   std::pair{" --lr-warmup-iters -1", "--lr-warmup-iters"}}) {
    const auto r = run_hetflow(run + args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  }
}

// --init-weights reads a HuggingFace sharded checkpoint (its index, or the directory) as the
// one file its shards were split from: the same training, bit for bit.
TEST(RunCli, InitWeightsFromAShardedCheckpointTrainAsFromOneFile) {
  const auto dir = scratch_dir();
  const std::string start = (dir / "start.safetensors").string();
  const std::string run = std::string("run ") + kTiny + " --compute real --steps 1 --warmup 0 --save-weights ";
  ASSERT_EQ(run_hetflow(run + start).status, 0);
  hetflow::exec::SafetensorsFile whole = hetflow::exec::read_safetensors(start), one, two;
  ASSERT_GT(whole.tensors.size(), 2u);
  const auto folder = dir / "sharded";
  std::filesystem::create_directories(folder);
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (size_t i = 0; i < whole.tensors.size(); ++i) {
    const bool first = i < whole.tensors.size() / 2;
    index += (i ? ", \"" : "\"") + whole.tensors[i].name + "\": \"model-0000" + (first ? "1" : "2") + "-of-00002.safetensors\"";
    (first ? one : two).tensors.push_back(whole.tensors[i]);
  }
  hetflow::exec::write_safetensors((folder / "model-00001-of-00002.safetensors").string(), one);
  hetflow::exec::write_safetensors((folder / "model-00002-of-00002.safetensors").string(), two);
  std::ofstream(folder / "model.safetensors.index.json") << index << "}}";
  const std::string want = (dir / "from_file.safetensors").string();
  ASSERT_EQ(run_hetflow(run + want + " --init-weights " + start).status, 0);
  for (const std::string& from : {folder.string(), (folder / "model.safetensors.index.json").string()}) {
    const std::string got = (dir / "from_shards.safetensors").string();
    const auto r = run_hetflow(run + got + " --init-weights " + from);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(slurp(got), slurp(want)) << from;
  }
  std::filesystem::remove(folder / "model-00002-of-00002.safetensors");
  const auto missing = run_hetflow(run + (dir / "x.safetensors").string() + " --init-weights " + folder.string());
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("model.safetensors.index.json:1: weight_map: names the shard 'model-00002-of-00002.safetensors', "
                             "which is not a file beside it"),
            std::string::npos)
      << missing.err;
}

// --data-path takes llm.c's LLaMA 3 token files (uint32 tokens) as its GPT-2 ones: the same
// tokens train to the same bits; and a vocabulary past 65,536 trains on tokens above it.
TEST(RunCli, Llama3TokenFilesTrainAsGpt2OnesAndCarryLargeVocabularies) {
  const auto dir = scratch_dir();
  std::vector<int> tokens(600);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i * 37 % 256);
  const std::string narrow = (dir / "narrow.bin").string(), wide = (dir / "wide.bin").string();
  hetflow::exec::write_token_file(narrow, tokens);
  hetflow::exec::write_token_file(wide, tokens, hetflow::exec::TokenFormat::llama3);
  const std::string run = std::string("run ") + kTiny + " --compute real --steps 2 --warmup 0 --save-weights ";
  const std::string from_narrow = (dir / "from_narrow.safetensors").string(), from_wide = (dir / "from_wide.safetensors").string();
  ASSERT_EQ(run_hetflow(run + from_narrow + " --data-path " + narrow).status, 0);
  const auto r = run_hetflow(run + from_wide + " --data-path " + wide);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("600 uint32 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(from_wide), slurp(from_narrow));
  // Tokens up to 69,999 for a vocabulary of 70,000: a fresh model's loss is about ln 70000.
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(65536 + i * 7 % 4464);
  hetflow::exec::write_token_file(wide, tokens, hetflow::exec::TokenFormat::llama3);
  const auto big = run_hetflow("run --cluster cpu-1 --model llama:layers=1,hidden=16,heads=2,seq=8,ffn=32,vocab=70000 "
                               "--compute real --steps 1 --warmup 0 --micro-batch 2 --microbatches 1 --json --data-path " + wide);
  ASSERT_EQ(big.status, 0) << big.err;
  EXPECT_NEAR(nlohmann::json::parse(big.out)["steps"][0]["loss"].get<double>(), std::log(70000.0), 0.05);
}

// `mpirun -np N hetflow run` trains what the threads of one process train, bit for bit, and
// rank 0 alone reports the whole run: pipelines with all-reduce, tensor-parallel ranks that
// push to and pull from parameter servers on other ranks, workers whose stages differ in
// tensor-parallel degree, all-reducing the parts of the split they hold in common, and a
// context group splitting each sequence.
// A run stopped after --save-checkpoint and started again with --resume goes on as the run
// that never stopped: the same losses and weights, bit for bit (ZeRO 2 over a pipeline, a
// cosine schedule whose default end counts the checkpoint's steps). Under mpirun the ranks
// write the checkpoint the threads would; parameter servers save and resume theirs.
TEST(RunCli, AResumedRunGoesOnAsTheRunThatNeverStopped) {
  const auto dir = scratch_dir();
  const std::string base = "run --cluster cpu-4 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32 "
                           "--pipeline 2 --data 2 --zero-stage 2 --microbatches 2 --workspace 0 --precision fp32 --warmup 0 "
                           "--lr 1e-2 --lr-decay-style cosine --lr-warmup-iters 1 --json ";
  const std::string straight = (dir / "straight.safetensors").string(), after = (dir / "resumed.safetensors").string();
  const std::string checkpoint = (dir / "ckpt").string();
  const auto whole = run_hetflow(base + "--steps 4 --save-weights " + straight);
  ASSERT_EQ(whole.status, 0) << whole.err << whole.out;
  const auto first = run_hetflow(base + "--steps 2 --lr-decay-iters 4 --save-checkpoint " + checkpoint);
  ASSERT_EQ(first.status, 0) << first.err << first.out;
  for (const char* file : {"model.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(checkpoint) / file)) << file;
  }
  const auto second = run_hetflow(base + "--steps 2 --resume " + checkpoint + " --save-weights " + after);
  ASSERT_EQ(second.status, 0) << second.err << second.out;
  const auto jw = nlohmann::json::parse(whole.out), js = nlohmann::json::parse(second.out);
  EXPECT_EQ(js["resumed_from"]["iterations"], 2);
  EXPECT_EQ(js["optimizer"]["lr_decay_iters"], 4);  // the checkpoint's 2 steps and this run's 2
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(js["steps"][i]["loss"], jw["steps"][i + 2]["loss"]) << "step " << i + 2;
    EXPECT_EQ(js["steps"][i]["lr"], jw["steps"][i + 2]["lr"]) << "step " << i + 2;
  }
  EXPECT_EQ(slurp(after), slurp(straight));
  const auto text = run_hetflow(base.substr(0, base.size() - 7) + " --steps 1 --resume " + checkpoint);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("resumed from " + checkpoint + " after its 2 steps: this run's go on from step 2"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("  step   2 "), std::string::npos) << text.out;
  EXPECT_EQ(js["steps"][0]["step"], 2);
#ifdef HETFLOW_MPIEXEC
  const std::string by_ranks = (dir / "ranks-ckpt").string();
  const auto m = run_hetflow(base + "--steps 2 --lr-decay-iters 4 --save-checkpoint " + by_ranks, under_mpirun(4));
  ASSERT_EQ(m.status, 0) << m.err << m.out;
  for (const char* file : {"model.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "trainer_state.json"}) {
    EXPECT_EQ(slurp((std::filesystem::path(by_ranks) / file).string()), slurp((std::filesystem::path(checkpoint) / file).string()))
        << file;
  }
#endif
  // Parameter servers: theirs are the weights and moments saved, and they resume them.
  const std::string served = "run --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --data 2 "
                             "--sync ps --precision fp32 --warmup 0 --json ";
  const std::string ps = (dir / "ps").string(), ps_straight = (dir / "ps.safetensors").string(),
                    ps_after = (dir / "ps-resumed.safetensors").string();
  ASSERT_EQ(run_hetflow(served + "--steps 3 --save-weights " + ps_straight).status, 0);
  ASSERT_EQ(run_hetflow(served + "--steps 1 --save-checkpoint " + ps).status, 0);
  const auto ps_resumed = run_hetflow(served + "--steps 2 --resume " + ps + " --save-weights " + ps_after);
  ASSERT_EQ(ps_resumed.status, 0) << ps_resumed.err;
  EXPECT_EQ(slurp(ps_after), slurp(ps_straight));
}

// --save-interval writes the checkpoint on the way, counting steps from the first run's first,
// and the run trains as one that wrote none: the same losses, the same last checkpoint, bit
// for bit; under mpirun the ranks gather each one, and every step's loss counts once.
TEST(RunCli, ASaveIntervalWritesCheckpointsOnTheWayAndTrainsAsOneRun) {
  const auto dir = scratch_dir();
  const std::string base = "run --cluster cpu-4 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32 "
                           "--pipeline 2 --data 2 --zero-stage 2 --microbatches 2 --workspace 0 --precision fp32 --warmup 0 "
                           "--lr 1e-2 --json ";
  const auto file = [](const std::string& folder, const char* name) { return slurp((std::filesystem::path(folder) / name).string()); };
  const char* kFiles[] = {"model.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "trainer_state.json"};
  const std::string plain = (dir / "plain").string(), every = (dir / "every").string();
  const auto whole = run_hetflow(base + "--steps 4 --save-checkpoint " + plain);
  ASSERT_EQ(whole.status, 0) << whole.err << whole.out;
  const auto cut = run_hetflow(base + "--steps 4 --save-interval 2 --save-checkpoint " + every);
  ASSERT_EQ(cut.status, 0) << cut.err << cut.out;
  const auto jw = nlohmann::json::parse(whole.out), jc = nlohmann::json::parse(cut.out);
  EXPECT_FALSE(jw.contains("checkpoints"));
  EXPECT_EQ(jc["save_interval"], 2);
  ASSERT_EQ(jc["checkpoints"].size(), 1u);  // after step 2; step 4's is the end's
  EXPECT_EQ(jc["checkpoints"][0]["after_step"], 2);
  EXPECT_GT(jc["checkpoints"][0]["write_s"].get<double>(), 0);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(jc["steps"][i]["loss"], jw["steps"][i]["loss"]) << "step " << i;
  for (const char* name : kFiles) EXPECT_EQ(file(every, name), file(plain, name)) << name;
  EXPECT_FALSE(std::filesystem::exists(every + ".partial"));
  EXPECT_FALSE(std::filesystem::exists(every + ".previous"));

  // Resumed after 1 step, the interval counts on: checkpoints after steps 2 and 4 of 5.
  const std::string one = (dir / "one").string();
  ASSERT_EQ(run_hetflow(base + "--steps 1 --save-checkpoint " + one).status, 0);
  const auto text = run_hetflow(base.substr(0, base.size() - 7) + " --steps 4 --resume " + one + " --save-interval 2 --save-checkpoint " + one);
  ASSERT_EQ(text.status, 0) << text.err << text.out;
  EXPECT_NE(text.out.find("  checkpoints: " + one + " written after steps 2, 4 (every 2, each replacing the last) in "), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("a training checkpoint after 5 steps"), std::string::npos) << text.out;
#ifdef HETFLOW_MPIEXEC
  const std::string by_ranks = (dir / "ranks").string();
  const auto m = run_hetflow(base + "--steps 4 --save-interval 1 --save-checkpoint " + by_ranks, under_mpirun(4));
  ASSERT_EQ(m.status, 0) << m.err << m.out;
  const auto jm = nlohmann::json::parse(m.out);
  EXPECT_EQ(jm["checkpoints"].size(), 3u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(jm["steps"][i]["loss"], jw["steps"][i]["loss"]) << "step " << i;
  for (const char* name : kFiles) EXPECT_EQ(file(by_ranks, name), file(plain, name)) << name;
#endif
}

TEST(RunCli, MpiRanksTrainBitwiseAsThreads) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI: hetflow run's devices are threads only";
#else
  const auto dir = scratch_dir();
  const auto mixed = dir / "mixed_degrees.yaml";
  std::ofstream(mixed) << "workers:\n"
                          "  - stages:\n      - {devices: [host/gpu0], layers: 0-2}\n"
                          "      - {devices: [host/gpu1, host/gpu2], layers: 3-5}\n"
                          "  - stages:\n      - {devices: [host/gpu3, host/gpu4], layers: 0-3}\n"
                          "      - {devices: [host/gpu5], layers: 4-5}\n";
  const std::pair<int, std::string> cases[] = {
      {6, "--cluster cpu-6 --model gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256 --layout " + mixed.string() +
              " --microbatches 2 "},
      {8, "--cluster cpu-8 --model gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256 --pipeline 4 --data 2 --microbatches 4 "},
      {4, "--cluster cpu-4 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --tensor 2 --data 2 --microbatches 2 "
          "--sync ps "},
      // A context group of 2 tensor-parallel pairs: each pass's keys and values cross ranks.
      {4, "--cluster cpu-4 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32 --tensor 2 "
          "--context-parallel 2 --microbatches 2 "}};
  for (const auto& [n, layout] : cases) {
    const std::string plan = "run " + layout + "--workspace 0 --precision fp32 --steps 2 --warmup 1 --lr 1e-2 --json ";
    const std::string threads = (dir / "threads.safetensors").string(), ranks = (dir / "ranks.safetensors").string();
    const std::string trace = (dir / "ranks.csv").string();
    const auto t = run_hetflow(plan + "--save-weights " + threads);
    ASSERT_EQ(t.status, 0) << t.err << t.out;
    const auto m = run_hetflow(plan + "--save-weights " + ranks + " --trace " + trace, under_mpirun(n));
    ASSERT_EQ(m.status, 0) << m.err << m.out;
    const auto jt = nlohmann::json::parse(t.out), jm = nlohmann::json::parse(m.out);  // one report: rank 0's
    EXPECT_EQ(jm["ranks"], n) << layout;
    EXPECT_EQ(jt["ranks"], 1);
    EXPECT_EQ(jm["compute"], "real") << layout;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(jm["steps"][i]["loss"], jt["steps"][i]["loss"]) << layout << "step " << i;
    EXPECT_EQ(slurp(ranks), slurp(threads)) << layout;
    const hetflow::traces::Trace merged = hetflow::traces::read_trace_csv(slurp(trace), trace);
    long long task_events = 0;  // (the tasks', not their in-task messages')
    for (const auto& e : merged.events) task_events += e.message < 0;
    EXPECT_EQ(task_events, jm["task_instances"].get<long long>());
    std::set<int> devices;
    for (const auto& e : merged.events) devices.insert(e.device);
    EXPECT_EQ(devices.size(), static_cast<size_t>(n)) << layout;
    // Rank 0 reports every device's model memory, as the threads measured it (the same
    // arrays; a transfer's temporaries may overlap the compute's differently).
    ASSERT_EQ(jm["devices"].size(), jt["devices"].size());
    for (size_t d = 0; d < jm["devices"].size(); ++d) {
      const double by_rank = jm["devices"][d]["peak_model_bytes"], by_thread = jt["devices"][d]["peak_model_bytes"];
      EXPECT_GT(by_rank, 0) << layout << "device " << d;
      EXPECT_NEAR(by_rank, by_thread, 0.05 * by_thread) << layout << "device " << d;
    }
  }
#endif
}

TEST(RunCli, AutoFallsBackToProxiesSayingWhyAndRealRefuses) {
  // A worker whose one chunk holds the whole tied model next to a two-stage worker: the
  // all-reduce of the head's layer would sum the head's copy of the embedding with nothing.
  const auto layout = scratch_dir() / "one_chunk_and_two.yaml";
  std::ofstream(layout) << "workers:\n  - stages:\n      - {devices: [host/gpu0], layers: 0-3}\n"
                           "  - stages:\n      - {devices: [host/gpu1], layers: 0-1}\n"
                           "      - {devices: [host/gpu2], layers: 2-3}\n";
  const std::string mixed = "--cluster cpu-3 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --layout " +
                            layout.string() + " --microbatches 2 --workspace 0";
  const auto r = run_hetflow("run " + mixed + " --steps 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("proxies because collective 0 (data_parallel) sums"), std::string::npos) << r.out;
  const auto refused = run_hetflow("run " + mixed + " --steps 1 --compute real");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("its members hold different parameters"), std::string::npos) << refused.err;
  // Tensor and sequence parallelism train for real.
  const auto tp = run_hetflow("run --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --tensor 2 "
                              "--sequence-parallel --workspace 0 --steps 1 --json");
  ASSERT_EQ(tp.status, 0) << tp.err;
  EXPECT_EQ(nlohmann::json::parse(tp.out)["compute"], "real");
  const auto cnn = run_hetflow("run --cluster cpu-1 --model resnet50 --micro-batch 1 --microbatches 1 --workspace 0 --steps 1 "
                               "--flop-scale 0.001");
  ASSERT_EQ(cnn.status, 0) << cnn.err;
  EXPECT_NE(cnn.out.find("compute proxy"), std::string::npos) << cnn.out;
  // A config.json asking for what the real layers leave out (LongRoPE's scaling) runs as
  // proxies under auto, saying so, and is refused under real.
  const auto config = scratch_dir() / "config.json";
  std::ofstream(config) << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 16,
    "rope_scaling": {"rope_type": "longrope", "factor": 8.0}})";
  const std::string scaled = "run --cluster cpu-1 --model " + config.string() + " --workspace 0 --steps 1 --precision fp32";
  const auto fell_back = run_hetflow(scaled);
  ASSERT_EQ(fell_back.status, 0) << fell_back.err;
  EXPECT_NE(fell_back.out.find("proxies because the network 'llama(config.json)' cannot be trained with real math: its "
                               "config asks for what the real layers leave out: rope_scaling (longrope)"),
            std::string::npos)
      << fell_back.out;
  const auto real = run_hetflow(scaled + " --compute real");
  EXPECT_EQ(real.status, 3) << real.err;
  EXPECT_NE(real.err.find("rope_scaling (longrope)"), std::string::npos) << real.err;
}

// A long task is not a stall: unless --watchdog is given, the watchdog waits at least ten
// times the longest compute task the cost model predicts (on GPUs of 1 MFLOP/s here, whose
// tasks it predicts at seconds; the proxies run on this host in milliseconds).
TEST(RunCli, TheDefaultWatchdogOutwaitsThePredictedTasks) {
  const auto dir = scratch_dir();
  const auto slow = dir / "slow.yaml";
  std::ofstream(slow) << "name: slow\ngpu_types:\n"
                         "  - {name: Slow, fp16: 1 MFLOP/s, bf16: 1 MFLOP/s, fp32: 1 MFLOP/s, memory: 48 GiB,\n"
                         "     memory_bandwidth: 1 TB/s, link: pcie, link_bandwidth: 32 GB/s}\n"
                         "nodes:\n  - {name: host, gpu: Slow, gpus: 2}\n";
  const std::string model = " --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --pipeline 2 --microbatches 4 "
                            "--workspace 0 --compute proxy --steps 1 --json";
  const auto fast = run_hetflow("run --cluster cpu-2" + model);
  ASSERT_EQ(fast.status, 0) << fast.err;
  EXPECT_EQ(nlohmann::json::parse(fast.out)["watchdog_s"], 60);
  const auto r = run_hetflow("run --cluster " + slow.string() + model);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["watchdog_s"].get<double>(), 60);
  EXPECT_LE(j["watchdog_s"].get<double>(), 10 * j["analytic_iteration_time_s"].get<double>());  // a task is in an iteration
  const auto told = run_hetflow("run --cluster " + slow.string() + model + " --watchdog 5s");
  ASSERT_EQ(told.status, 0) << told.err;
  EXPECT_EQ(nlohmann::json::parse(told.out)["watchdog_s"], 5);
}

// An error on one rank outside the run ends every rank with it: here rank 0 alone checks the
// output paths before the run. Rank 0 used to return alone, its MPI_Finalize waiting for the
// others and they for it in the run's first barrier, for ever (`timeout` ends the test then).
TEST(RunCli, AnErrorOnOneRankBeforeTheRunEndsEveryRank) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI: hetflow run's devices are threads only";
#else
  const auto r = run_hetflow(std::string("run ") + kTiny + " --compute proxy --steps 1 --trace /nonexistent-folder/t.csv",
                             "timeout -s KILL 120 env " + under_mpirun(2));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--trace"), std::string::npos) << r.err;
#endif
}
