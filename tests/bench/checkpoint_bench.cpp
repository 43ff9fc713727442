// Training checkpoints (exec/training_checkpoint.hpp): writing and reading one, beside the same
// bytes written and read as one plain file, so the ratio is the format's own cost (headers,
// the temporary folder and renames, fp32 conversion on reading) over the file system's.
//  - BM_CheckpointWrite/P: write_training_checkpoint of P million parameters in 64 tensors
//    (the weights and both moments: 12 bytes a parameter) into a fresh folder under the
//    system's temporary directory; BM_PlainWriteSynced/P the same bytes as one file written
//    and fsynced (each checkpoint file is, by AtomicFile), BM_PlainWrite/P through one
//    std::ofstream left in the page cache.
//  - BM_CheckpointRead/P: TrainingCheckpoint opened (every header checked) and every tensor of
//    its three files read, as a resuming rank reads its shares; BM_PlainRead/P one
//    std::ifstream read of the same bytes.
// Counter GB_per_s: the checkpoint's bytes over the median time. Files land in the page cache
// (the disk is not what is measured unless the data outgrows the host's memory).
//   ./build/tests/checkpoint_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "exec/training_checkpoint.hpp"

namespace {

namespace fs = std::filesystem;
using hetflow::exec::SafetensorsFile;

constexpr int kTensors = 64;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("hetflow-checkpoint-bench-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

SafetensorsFile tensors(long long params, float value) {
  SafetensorsFile f;
  const long long each = params / kTensors;
  for (int k = 0; k < kTensors; ++k) {
    f.tensors.push_back({"model.layers." + std::to_string(k) + ".weight", {each}, std::vector<float>(static_cast<size_t>(each), value)});
  }
  return f;
}

hetflow::exec::TrainingState state_of(long long params) {
  hetflow::exec::TrainingState s;
  s.weights = tensors(params, 0.5f);
  s.exp_avg = tensors(params, 1e-3f);
  s.exp_avg_sq = tensors(params, 1e-6f);
  s.progress.iterations = s.progress.optimizer_steps = 100;
  s.progress.global_batch = 8;
  s.progress.seq_len = 1024;
  return s;
}

double checkpoint_bytes(long long params) { return 12.0 * static_cast<double>(params / kTensors * kTensors); }

void BM_CheckpointWrite(benchmark::State& state) {
  const long long params = state.range(0) * 1'000'000;
  const auto s = state_of(params);
  const std::string folder = (scratch() / "write").string();
  for (auto _ : state) hetflow::exec::write_training_checkpoint(folder, s);
  state.counters["GB_per_s"] = benchmark::Counter(checkpoint_bytes(params) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PlainWrite(benchmark::State& state) {
  const long long params = state.range(0) * 1'000'000;
  const std::vector<float> bytes(static_cast<size_t>(checkpoint_bytes(params) / 4), 0.5f);
  const std::string file = (scratch() / "plain.bin").string();
  for (auto _ : state) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() * sizeof(float)));
  }
  state.counters["GB_per_s"] = benchmark::Counter(checkpoint_bytes(params) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// The same bytes made durable as the checkpoint's files are (AtomicFile fsyncs each one).
void BM_PlainWriteSynced(benchmark::State& state) {
  const long long params = state.range(0) * 1'000'000;
  const std::vector<float> bytes(static_cast<size_t>(checkpoint_bytes(params) / 4), 0.5f);
  const std::string file = (scratch() / "plain-synced.bin").string();
  for (auto _ : state) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = reinterpret_cast<const char*>(bytes.data());
    size_t left = bytes.size() * sizeof(float);
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::fsync(fd);
    ::close(fd);
  }
  state.counters["GB_per_s"] = benchmark::Counter(checkpoint_bytes(params) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_CheckpointRead(benchmark::State& state) {
  const long long params = state.range(0) * 1'000'000;
  const std::string folder = (scratch() / "read").string();
  hetflow::exec::write_training_checkpoint(folder, state_of(params));
  for (auto _ : state) {
    const hetflow::exec::TrainingCheckpoint checkpoint(folder);
    const hetflow::exec::ResumeFrom from = checkpoint.resume();
    for (const hetflow::exec::WeightSource* source : {&from.weights, &from.exp_avg, &from.exp_avg_sq}) {
      for (size_t i = 0; i < source->tensors().size(); ++i) benchmark::DoNotOptimize(source->read(i).data());
    }
  }
  state.counters["GB_per_s"] = benchmark::Counter(checkpoint_bytes(params) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PlainRead(benchmark::State& state) {
  const long long params = state.range(0) * 1'000'000;
  std::vector<float> bytes(static_cast<size_t>(checkpoint_bytes(params) / 4), 0.5f);
  const std::string file = (scratch() / "plain-read.bin").string();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() * sizeof(float)));
  }
  for (auto _ : state) {
    std::ifstream in(file, std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() * sizeof(float)));
    benchmark::DoNotOptimize(bytes.data());
  }
  state.counters["GB_per_s"] = benchmark::Counter(checkpoint_bytes(params) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// (Wall-clock time: the rates are the bytes over it, waits for the disk included.)
BENCHMARK(BM_CheckpointWrite)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PlainWriteSynced)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PlainWrite)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CheckpointRead)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PlainRead)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code error;
  fs::remove_all(scratch(), error);
  return 0;
}
