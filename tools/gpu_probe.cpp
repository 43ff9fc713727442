// hetflow-gpu-probe: what this machine's GPUs do, for tools/gpu-check.sh. Three measurements:
//   gemm [--gpu G] [--n N] [--precision bf16|fp16|fp32]
//        cublasGemmEx N x N x N (FP32 accumulation): TFLOP/s = 2 N^3 / time, beside the
//        catalog's dense peak for the part (model/gpu_catalog.cpp) when it knows the part;
//   all-reduce [--gpus N] [--bytes B]
//        ncclAllReduce of B bytes over GPUs 0..N-1, with nccl-tests' figures: algbw = B / time,
//        busbw = algbw x 2 (N - 1) / N.
//   attention [--batch B] [--seq T] [--heads NH] [--kv-heads NKV] [--head-size HS] [--window W]
//        the CUDA attention kernels on GPU 0 (kernels/transformer_cuda.hpp, fp32), from random
//        inputs: the mean of 10 forwards and of 10 backwards (dq, dk and dv) enqueued back to
//        back after a warm-up, and the useful work's rate: a (query, key) pair the mask keeps costs 2 HS
//        multiply-adds forward (Q K^T, P V) and 4 backward (dP, dq, dk, dv), so TFLOP/s =
//        4 B NH HS pairs / time forward and 8 B NH HS pairs / time backward, pairs the kept
//        ones of one head (T (T + 1) / 2 without a window). Defaults: GPT-2 124M's layer
//        at micro-batch 4 (B 4, T 1024, 12 heads of 64).
//   cluster [--gpus N]
//        this machine as a hetflow cluster file, on stdout: one node of its first N visible
//        GPUs (default all) as the catalog knows them (the part of GPU 0; each must be that
//        part), on the part's usual interconnect, so that `hetflow run --cluster FILE` measures
//        MFU against the GPUs' own peak.
// Exit status 0, or 1 with a message (no GPU, no CUDA back end in this build, a CUDA error, a
// part the catalog does not know).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "exec/cuda_backend.hpp"
#include "kernels/matmul.hpp"
#include "kernels/transformer_cuda.hpp"
#include "model/error.hpp"
#include "model/gpu.hpp"
#include "model/io.hpp"
#include "model/precision.hpp"

namespace {

using hetflow::model::GpuSpec;

// The catalog entry for a CUDA device name ("NVIDIA H100 80GB HBM3" -> H100-SXM), if any.
const GpuSpec* catalog_entry(std::string name) {
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string prefix : {"NVIDIA ", "TESLA ", "GEFORCE "}) {
    if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  }
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // (The PCIe and NVL boards run slower clocks and lower power than the SXM parts the catalog
  // has: no peak rather than a wrong one.)
  if (has("H200")) return has("NVL") ? nullptr : hetflow::model::find_builtin_gpu("H200");
  if (has("H100")) return has("PCIE") || has("NVL") ? nullptr : hetflow::model::find_builtin_gpu("H100-SXM");
  if (has("A100")) return hetflow::model::find_builtin_gpu(has("80GB") ? "A100-80" : "A100-40");
  if (has("V100")) return hetflow::model::find_builtin_gpu(has("32GB") ? "V100-32" : "V100-16");
  for (char& c : name) c = c == ' ' ? '-' : c;
  return hetflow::model::find_builtin_gpu(name);
}

std::string option(const std::vector<std::string>& args, const std::string& name, const std::string& fallback) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == name) return args[i + 1];
  }
  return fallback;
}

// A whole number option, positive (or >= 0 where zero_ok), or an Error naming it.
int size_option(const std::vector<std::string>& args, const std::string& name, const std::string& fallback,
                bool zero_ok = false) {
  const std::string text = option(args, name, fallback);
  std::size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < (zero_ok ? 0 : 1)) {
    throw hetflow::Error(name + " takes a whole number" + (zero_ok ? " >= 0" : " >= 1") + ", not '" + text + "'");
  }
  return value;
}

int gemm(const std::vector<std::string>& args) {
  const int gpu = size_option(args, "--gpu", "0", true);
  const int n = size_option(args, "--n", "4096");
  const hetflow::model::Precision precision = hetflow::model::parse_precision(option(args, "--precision", "bf16"));
  const hetflow::exec::GemmProbe p = hetflow::exec::probe_gemm(gpu, precision, n);
  std::printf("gemm %s %dx%dx%d on GPU %d (%s): %.3f ms, %.1f TFLOP/s", std::string(to_string(precision)).c_str(), n, n, n,
              gpu, p.gpu.c_str(), p.seconds * 1e3, p.flops_per_s / 1e12);
  if (const GpuSpec* spec = catalog_entry(p.gpu); spec != nullptr && spec->peak_flops_per_s(precision) > 0) {
    const double peak = spec->peak_flops_per_s(precision);
    std::printf("; catalog peak (%s, dense) %.1f TFLOP/s: %.0f %%\n", spec->name.c_str(), peak / 1e12,
                100 * p.flops_per_s / peak);
  } else {
    std::printf("; no catalog peak for this part\n");
  }
  return 0;
}

int all_reduce(const std::vector<std::string>& args) {
  const int gpus = size_option(args, "--gpus", std::to_string(hetflow::kernels::cuda_device_count()), true);
  const double bytes = std::stod(option(args, "--bytes", "268435456"));
  const hetflow::exec::AllReduceProbe p = hetflow::exec::probe_all_reduce(gpus, bytes);
  std::printf("all-reduce %.0f MiB over %d GPUs: %.3f ms, algbw %.1f GB/s, busbw %.1f GB/s\n", p.bytes / (1 << 20), p.gpus,
              p.seconds * 1e3, p.algbw_bytes_per_s / 1e9, p.busbw_bytes_per_s / 1e9);
  return 0;
}

// Throws with the call's name unless it succeeded.
void check(hetflow::kernels::Status status, const char* what) {
  if (status != hetflow::kernels::Status::success) {
    throw hetflow::Error(std::string(what) + ": " + std::string(hetflow::kernels::status_string(status)) + " (" +
                         hetflow::kernels::cuda_status() + ")");
  }
}

// Seconds a call of `enqueue` takes: the mean of `runs` calls enqueued back to back and waited
// for once, after one call waited for alone. (Back to back, stream-ordered scratch that one call
// frees the next reuses, as within a training step; a wait hands it back to the driver.)
double seconds_per_call(const std::function<hetflow::kernels::Status()>& enqueue, const char* what, int runs = 10) {
  check(enqueue(), what);
  check(hetflow::kernels::cuda_synchronize(nullptr), what);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < runs; ++r) check(enqueue(), what);
  check(hetflow::kernels::cuda_synchronize(nullptr), what);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / runs;
}

int attention(const std::vector<std::string>& args) {
  using hetflow::kernels::DeviceBuffer;
  const int B = size_option(args, "--batch", "4"), T = size_option(args, "--seq", "1024");
  const int NH = size_option(args, "--heads", "12"), NKV = size_option(args, "--kv-heads", std::to_string(NH));
  const int HS = size_option(args, "--head-size", "64"), W = size_option(args, "--window", "0", true);
  if (NH % NKV != 0) throw hetflow::Error("--heads " + std::to_string(NH) + " is not a multiple of --kv-heads");
  if (hetflow::kernels::cuda_device_count() == 0) throw hetflow::Error(hetflow::kernels::cuda_status());
  const auto count = [](long long n) { return static_cast<std::size_t>(n); };
  const std::size_t nq = count(1LL * B * T * NH * HS), nkv = count(1LL * B * T * NKV * HS),
                    nprobs = count(1LL * B * NH * T * T);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const auto allocate = [](std::size_t n) {
    DeviceBuffer buffer;
    check(buffer.allocate(n * sizeof(float)), "cudaMalloc");
    return buffer;
  };
  const auto random = [&](std::size_t n) {  // uniform in [-1, 1)
    DeviceBuffer buffer = allocate(n);
    std::vector<float> host(n);
    std::generate(host.begin(), host.end(), [&] { return uniform(rng); });
    check(hetflow::kernels::cuda_copy_to_device(buffer.get(), host.data(), n * sizeof(float)), "copy to the GPU");
    return buffer;
  };
  // (The forward writes out and probs whole; the gradients only grow from what they hold.)
  const DeviceBuffer q = random(nq), k = random(nkv), v = random(nkv), dout = random(nq);
  const DeviceBuffer out = allocate(nq), probs = allocate(nprobs), dq = random(nq), dk = random(nkv), dv = random(nkv);
  const double forward = seconds_per_call(
      [&] {
        return hetflow::kernels::attention_forward_cuda(out.as<float>(), probs.as<float>(), q.as<float>(), k.as<float>(),
                                                        v.as<float>(), B, T, NH, NKV, HS, W, nullptr);
      },
      "attention forward");
  const double backward = seconds_per_call(
      [&] {
        return hetflow::kernels::attention_backward_cuda(dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                                         dout.as<float>(), probs.as<float>(), q.as<float>(),
                                                         k.as<float>(), v.as<float>(), B, T, NH, NKV, HS, W, nullptr);
      },
      "attention backward");
  double pairs = 0;  // (query, key) pairs one head's mask keeps
  for (int t = 0; t < T; ++t) pairs += W > 0 ? std::min(t + 1, W) : t + 1;
  const double work = 1.0 * B * NH * HS * pairs;
  std::printf("attention fp32 B=%d T=%d NH=%d NKV=%d HS=%d window=%d on GPU 0 (%s), %.0f pairs a head:\n", B, T, NH, NKV,
              HS, W, hetflow::kernels::cuda_device_name(0).c_str(), pairs);
  std::printf("  forward  %.3f ms, 4 B NH HS pairs / time = %.1f TFLOP/s\n", forward * 1e3, 4 * work / forward / 1e12);
  std::printf("  backward %.3f ms, 8 B NH HS pairs / time = %.1f TFLOP/s\n", backward * 1e3, 8 * work / backward / 1e12);
  return 0;
}

int cluster(const std::vector<std::string>& args) {
  const int visible = hetflow::kernels::cuda_device_count();
  if (visible == 0) throw hetflow::Error(hetflow::kernels::cuda_status());
  const int gpus = size_option(args, "--gpus", std::to_string(visible), true);
  if (gpus < 1 || gpus > visible) {
    throw hetflow::Error("--gpus " + std::to_string(gpus) + ": this machine shows " + std::to_string(visible) + " GPU(s)");
  }
  const std::string name = hetflow::kernels::cuda_device_name(0);
  const GpuSpec* spec = catalog_entry(name);
  if (spec == nullptr) throw hetflow::Error("the GPU catalog does not know GPU 0, a " + name);
  for (int g = 1; g < gpus; ++g) {
    if (catalog_entry(hetflow::kernels::cuda_device_name(g)) != spec) {
      throw hetflow::Error("GPU " + std::to_string(g) + " (" + hetflow::kernels::cuda_device_name(g) + ") is not a " +
                           spec->name + " like GPU 0: a node of one part is all this writes");
    }
  }
  const std::string text = hetflow::model::one_node_cluster_yaml(
      *spec, gpus, "this-machine", "This machine, as hetflow-gpu-probe cluster found it: " + std::to_string(gpus) + " x " + name);
  hetflow::model::parse_cluster(text, "<hetflow-gpu-probe cluster>");  // what it writes, hetflow reads
  std::cout << text;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "gemm") return gemm(args);
    if (!args.empty() && args[0] == "all-reduce") return all_reduce(args);
    if (!args.empty() && args[0] == "attention") return attention(args);
    if (!args.empty() && args[0] == "cluster") return cluster(args);
    std::cerr << "usage: hetflow-gpu-probe gemm [--gpu G] [--n N] [--precision bf16|fp16|fp32]\n"
                 "       hetflow-gpu-probe all-reduce [--gpus N] [--bytes B]\n"
                 "       hetflow-gpu-probe attention [--batch B] [--seq T] [--heads NH] [--kv-heads NKV]\n"
                 "                                   [--head-size HS] [--window W]\n"
                 "       hetflow-gpu-probe cluster [--gpus N]\n"
                 "GPUs: "
              << hetflow::kernels::cuda_status() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hetflow-gpu-probe: " << e.what() << "\n";
    return 1;
  }
}
