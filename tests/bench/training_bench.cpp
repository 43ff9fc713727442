// Real training speed on the CPU back end, in one program run so every number comes from the
// same machine state:
//  - BM_TrainOneDevice: a GPT-2 of 4 layers, hidden 256, 4 heads, sequence 256, vocabulary
//    8192 (tied embedding, GELU MLP of 1024, FP32) on one CPU device (cluster cpu-1, one
//    OpenBLAS thread): whole training steps (forward, backward, AdamW with clipping) of a
//    global batch of 4 sequences (1,024 tokens), one micro-batch of 4.
//  - BM_TrainPipeline2: the same model and batch as a 2-stage 1F1B pipeline on cpu-2, 4
//    micro-batches of 1 sequence.
//  - BM_TrainPyTorch: tests/exec/oracle/train_reference.py --bench-steps on the same model,
//    batch and optimizer settings, with one intra-op, one inter-op and one OpenBLAS thread.
//    Skipped, saying why, when /usr/bin/python3 cannot import torch.
//  - BM_TrainMoeOneDevice and BM_TrainPyTorchMoe: the same, for a Mixtral-style mixture of
//    experts of the same size (LLaMA layers, hidden 256, 4 heads, 8 experts 512 wide, the top
//    2 renormalised, load-balancing loss 0.02; untied head) from one HuggingFace config,
//    hetflow's router, permutation and per-expert GEMMs against transformers' loop over
//    experts (index_add) in the oracle script.
//  - BM_SumOfSquares: the gradient norm's local sum of squares (kernels::sum_of_squares)
//    against a single running sum over the same floats, in GB/s read.
//  - BM_Linear*: the decoder's GEMM kernels (kernels::linear_forward, linear_backward_input,
//    linear_backward_weight, with the bias and its sums where the model has one: all but the
//    head) at the model's shapes (N = 1,024 rows) against a direct cblas_sgemm of the same
//    product, 2 N C OC flops each: the ratio is the kernels' overhead over OpenBLAS.
// After the table, one summary line (stderr): hetflow's one-device tokens/s over PyTorch's, and
// the pipeline's over one device, from the medians of the repetitions; a second for the MoE.
// Each training case runs 2 warm-up steps and then 5 timed ones; tokens_per_s is tokens over
// the timed steps' total time (as the PyTorch script computes it), the Time column the
// median step; the counters cpu_s and faults are the CPU seconds (every thread) and minor
// page faults of the whole run (set-up, warm-up and timed steps; tests/bench/bench_usage.hpp),
// which a shared machine's load sways far less than the steps' wall-clock time.
//   ./build/tests/training_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Target: hetflow's one-device tokens/s at least PyTorch's on the same threads
// (hetflow_over_pytorch >= 1).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "exec/training.hpp"
#include "kernels/transformer.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "tests/exec/exec_test_util.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "tests/bench/bench_usage.hpp"

using namespace hetflow;

namespace {

constexpr int kLayers = 4, kHidden = 256, kHeads = 4, kSeq = 256, kVocab = 8192;
constexpr int kBatch = 4;  // sequences per step (global batch)
constexpr int kWarmSteps = 2, kTimedSteps = 5;
constexpr double kTokensPerStep = double(kBatch) * kSeq;

// Tokens/s of every repetition of each training case, for the summary line.
std::map<std::string, std::vector<double>>& results() {
  static std::map<std::string, std::vector<double>> r;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The GPT-2 and the mixture of experts as HuggingFace configs (what the PyTorch script reads).
std::string gpt2_config() {
  return "{\"model_type\": \"gpt2\", \"n_layer\": " + std::to_string(kLayers) + ", \"n_embd\": " + std::to_string(kHidden) +
         ", \"n_head\": " + std::to_string(kHeads) + ", \"n_positions\": " + std::to_string(kSeq) +
         ", \"vocab_size\": " + std::to_string(kVocab) + ", \"layer_norm_epsilon\": 1e-05}\n";
}
std::string moe_config() {
  return "{\"model_type\": \"mixtral\", \"num_hidden_layers\": " + std::to_string(kLayers) +
         ", \"hidden_size\": " + std::to_string(kHidden) + ", \"num_attention_heads\": " + std::to_string(kHeads) +
         ", \"num_key_value_heads\": " + std::to_string(kHeads) + ", \"intermediate_size\": " + std::to_string(2 * kHidden) +
         ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"router_aux_loss_coef\": 0.02, \"vocab_size\": " +
         std::to_string(kVocab) + ", \"max_position_embeddings\": " + std::to_string(kSeq) +
         ", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}\n";
}

// The plan as the executor tests build theirs: `devices` CPU devices as a pipeline of that
// depth, `microbatches` micro-batches of `micro_batch` sequences, FP32, of `config`.
partition::Plan make_plan(int devices, int micro_batch, int microbatches, const std::string& config = gpt2_config()) {
  const model::Network net =
      model::make_transformer(model::transformer_from_hf_config(config, "config.json"), model::Precision::fp32);
  partition::PlanOptions o;
  o.pipeline = devices;
  o.data = 1;
  o.micro_batch = micro_batch;
  o.microbatches = microbatches;
  o.schedule = "1f1b";
  o.sync = partition::SyncKind::allreduce;
  return test_support::planned(model::cpu_cluster(devices), net, o);
}

struct Steps {
  std::vector<double> seconds;  // each timed step, from the end of the step before
  double last_loss = 0;
  std::string error;
};

// Trains warm-up + timed steps; a step ends when the last optimizer task of its iteration does.
Steps run_steps(const partition::Plan& plan) {
  exec::Training training(plan, exec::markov_stream(kVocab, 7), exec::OptimizerOptions{}, 42);
  exec::CpuBackend backend({}, &training);
  exec::EngineOptions e;
  e.iterations = kWarmSteps + kTimedSteps;
  const exec::RunResult r = exec::run_plan(plan, backend, e);
  Steps s;
  if (!r.completed) {
    s.error = r.error;
    return s;
  }
  std::vector<double> end(static_cast<size_t>(e.iterations), 0.0);
  for (const traces::Event& ev : r.trace.events) {
    if (ev.kind == hetflow::partition::TaskKind::optimizer) end[static_cast<size_t>(ev.iteration)] = std::max(end[static_cast<size_t>(ev.iteration)], ev.end_s);
  }
  for (int i = kWarmSteps; i < e.iterations; ++i) s.seconds.push_back(end[static_cast<size_t>(i)] - end[static_cast<size_t>(i - 1)]);
  s.last_loss = training.losses().back();
  return s;
}

void train(benchmark::State& state, const char* name, int devices, int micro_batch, int microbatches,
           const std::string& config = gpt2_config()) {
  const partition::Plan plan = make_plan(devices, micro_batch, microbatches, config);
  bench::UsageMeter usage;
  for (auto _ : state) {
    usage.start();
    const Steps s = run_steps(plan);
    usage.stop();
    if (!s.error.empty()) {
      state.SkipWithError(s.error.c_str());
      return;
    }
    double total = 0;
    for (const double t : s.seconds) total += t;
    const double tokens_per_s = kTokensPerStep * kTimedSteps / total;
    results()[name].push_back(tokens_per_s);
    state.SetIterationTime(median(s.seconds));
    state.counters["tokens_per_s"] = tokens_per_s;
    state.counters["loss"] = s.last_loss;
  }
  usage.report(state);
}

void BM_TrainOneDevice(benchmark::State& state) { train(state, "one_device", 1, kBatch, 1); }
void BM_TrainPipeline2(benchmark::State& state) { train(state, "pipeline2", 2, kBatch / 4, 4); }
void BM_TrainMoeOneDevice(benchmark::State& state) { train(state, "moe_one_device", 1, kBatch, 1, moe_config()); }

// The PyTorch reference on the same model: a HuggingFace config in a temporary folder, the
// oracle script's --bench-steps mode through popen, its JSON line parsed.
void pytorch(benchmark::State& state, const char* name, const std::string& config_text) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    state.SkipWithError("/usr/bin/python3 cannot import torch: no PyTorch baseline");
    return;
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("hetflow_training_bench_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path config = dir / "config.json";
  std::ofstream(config) << config_text;
  const exec::OptimizerOptions adam;  // hetflow's defaults, passed to the script
  const std::string command = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 " HETFLOW_SOURCE_DIR
                              "/tests/exec/oracle/train_reference.py --config " + config.string() +
                              " --bench-steps " + std::to_string(kTimedSteps) + " --batch " + std::to_string(kBatch) +
                              " --seq " + std::to_string(kSeq) + " --threads 1 --lr " + std::to_string(adam.lr) +
                              " --weight-decay " + std::to_string(adam.weight_decay) + " --clip-grad " +
                              std::to_string(adam.clip_grad) + " 2>&1";
  for (auto _ : state) {
    std::string output;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
      state.SkipWithError("popen failed");
      break;
    }
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
    const int status = ::pclose(pipe);
    const auto number = [&](const std::string& key) {
      const size_t at = output.find("\"" + key + "\":");
      return at == std::string::npos ? -1.0 : std::strtod(output.c_str() + at + key.size() + 3, nullptr);
    };
    const double tokens_per_s = number("tokens_per_s"), step_s = number("median_step_s");
    if (status != 0 || tokens_per_s <= 0 || step_s <= 0) {
      const std::string message = "train_reference.py failed: " + output.substr(output.size() > 400 ? output.size() - 400 : 0);
      state.SkipWithError(message.c_str());
      break;
    }
    results()[name].push_back(tokens_per_s);
    state.SetIterationTime(step_s);
    state.counters["tokens_per_s"] = tokens_per_s;
    state.counters["threads"] = number("threads");
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

void BM_TrainPyTorch(benchmark::State& state) { pytorch(state, "pytorch", gpt2_config()); }
void BM_TrainPyTorchMoe(benchmark::State& state) { pytorch(state, "moe_pytorch", moe_config()); }

// --- GEMMs at the model's shapes: hetflow's kernel and a direct sgemm of the same product ---

enum class Gemm { forward, backward_input, backward_weight };

void linear(benchmark::State& state, Gemm op) {
  openblas_set_num_threads(1);
  const int N = kBatch * kSeq, C = static_cast<int>(state.range(0)), OC = static_cast<int>(state.range(1));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = normal(rng);
    return v;
  };
  const size_t n = static_cast<size_t>(N), c = static_cast<size_t>(C), oc = static_cast<size_t>(OC);
  const std::vector<float> x = random(n * c), w = random(oc * c), dy = random(n * oc), bias = random(oc);
  std::vector<float> y(n * oc), dx(n * c), dw(oc * c), db(oc);
  // As the decoder calls them: every GPT-2 linear has a bias but the head (the tied embedding).
  const bool has_bias = OC != kVocab;
  const auto kernel = [&] {
    switch (op) {
      case Gemm::forward:
        kernels::linear_forward(y.data(), x.data(), w.data(), has_bias ? bias.data() : nullptr, N, C, OC);
        break;
      case Gemm::backward_input: kernels::linear_backward_input(dx.data(), dy.data(), w.data(), N, C, OC); break;
      case Gemm::backward_weight:
        kernels::linear_backward_weight(dw.data(), has_bias ? db.data() : nullptr, dy.data(), x.data(), N, C, OC);
        break;
    }
  };
  const auto direct = [&] {
    switch (op) {
      case Gemm::forward:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x.data(), C, w.data(), C, 0.0f, y.data(), OC);
        break;
      case Gemm::backward_input:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dy.data(), OC, w.data(), C, 1.0f,
                    dx.data(), C);
        break;
      case Gemm::backward_weight:
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dy.data(), OC, x.data(), C, 1.0f,
                    dw.data(), C);
        break;
    }
  };
  using clock = std::chrono::steady_clock;
  double kernel_s = 0, direct_s = 0;
  for (auto _ : state) {  // alternating, so both see the same machine state
    const auto t0 = clock::now();
    kernel();
    const auto t1 = clock::now();
    direct();
    const auto t2 = clock::now();
    const double k = std::chrono::duration<double>(t1 - t0).count();
    kernel_s += k;
    direct_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(k);
  }
  const double flops = 2.0 * N * C * OC * static_cast<double>(state.iterations());
  state.counters["hetflow_GFLOPs"] = flops / kernel_s / 1e9;
  state.counters["openblas_GFLOPs"] = flops / direct_s / 1e9;
  state.counters["hetflow_over_openblas"] = direct_s / kernel_s;
}

void BM_LinearForward(benchmark::State& state) { linear(state, Gemm::forward); }
void BM_LinearBackwardInput(benchmark::State& state) { linear(state, Gemm::backward_input); }
void BM_LinearBackwardWeight(benchmark::State& state) { linear(state, Gemm::backward_weight); }

// (C, OC): q/k/v/o projections, PyTorch's fused c_attn, the MLP's two halves, the LM head.
void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"C", "OC"});
  for (const auto& [c, oc] : std::vector<std::pair<int, int>>{
           {kHidden, kHidden}, {kHidden, 3 * kHidden}, {kHidden, 4 * kHidden}, {4 * kHidden, kHidden}, {kHidden, kVocab}}) {
    b->Args({c, oc});
  }
}

// --- The gradient norm's local part: kernels::sum_of_squares against one running sum ---
// The kernel (eight running sums) and the loop it replaced (one sum, a chain of dependent
// additions) over the same gradient, alternating; bytes read over time is each one's GB/s.
double serial_sum_of_squares(const float* x, long n) {
  double sum = 0;
  for (long i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void BM_SumOfSquares(benchmark::State& state) {
  const long n = state.range(0);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = normal(rng);
  using clock = std::chrono::steady_clock;
  double kernel_s = 0, serial_s = 0, sink = 0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    sink += kernels::sum_of_squares(x.data(), n);
    const auto t1 = clock::now();
    sink += serial_sum_of_squares(x.data(), n);
    const auto t2 = clock::now();
    const double k = std::chrono::duration<double>(t1 - t0).count();
    kernel_s += k;
    serial_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(k);
  }
  benchmark::DoNotOptimize(sink);
  const double bytes = 4.0 * static_cast<double>(n) * static_cast<double>(state.iterations());
  state.counters["hetflow_GBps"] = bytes / kernel_s / 1e9;
  state.counters["one_sum_GBps"] = bytes / serial_s / 1e9;
  state.counters["hetflow_over_one_sum"] = serial_s / kernel_s;
}

// One line after the table: hetflow's one-device tokens/s over PyTorch's and the pipeline's over
// one device, from the medians of every repetition (so it holds under
// --benchmark_enable_random_interleaving too). On stderr, so --benchmark_format=json stays JSON.
void print_summary() {
  const auto& r = results();
  const auto get = [&](const char* name) { return r.contains(name) ? median(r.at(name)) : 0.0; };
  const double one = get("one_device"), torch = get("pytorch"), pipe = get("pipeline2");
  if (one > 0) {  // (not when the one-device case was filtered out or failed)
    std::fprintf(stderr, "summary (median tokens/s): hetflow one device %.0f", one);
    if (torch > 0) std::fprintf(stderr, ", PyTorch %.0f, hetflow/PyTorch %.3f", torch, one / torch);
    if (pipe > 0) std::fprintf(stderr, ", hetflow 2-stage pipeline %.0f (%.3f x one device)", pipe, pipe / one);
    std::fprintf(stderr, "\n");
  }
  if (const double moe = get("moe_one_device"), moe_torch = get("moe_pytorch"); moe > 0) {
    std::fprintf(stderr, "summary (median tokens/s): MoE hetflow one device %.0f", moe);
    if (moe_torch > 0) std::fprintf(stderr, ", PyTorch %.0f, hetflow/PyTorch %.3f", moe_torch, moe / moe_torch);
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

BENCHMARK(BM_TrainOneDevice)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainPipeline2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainPyTorch)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainMoeOneDevice)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainPyTorchMoe)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearForward)->Apply(gemm_shapes)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearBackwardInput)->Apply(gemm_shapes)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearBackwardWeight)->Apply(gemm_shapes)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);
// A GPT-2 small's gradients on one of two pipeline stages (62M floats) is too long for a
// benchmark; 1M (4 MB, in cache on most CPUs) and 16M (64 MB, from memory).
BENCHMARK(BM_SumOfSquares)->Arg(1 << 20)->Arg(1 << 24)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
