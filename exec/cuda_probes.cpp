// The CUDA back end's probes (cuda_backend.hpp): a GEMM's throughput on one GPU and an
// all-reduce's bus bandwidth over several, with no plan and no engine.
#include "exec/cuda_backend.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "exec/cuda_backend_state.hpp"

namespace hetflow::exec {

using namespace cuda_detail;  // the back end's own helpers (cuda_backend_state.hpp)

namespace {

// Frees what a probe allocated, whatever happens.
struct ProbeMemory {
  std::vector<void*> blocks;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  cublasHandle_t blas = nullptr;
  ProbeMemory() = default;
  ProbeMemory(const ProbeMemory&) = delete;
  ProbeMemory& operator=(const ProbeMemory&) = delete;
  ~ProbeMemory() {
    for (cudaStream_t s : streams) cudaStreamSynchronize(s);
    if (blas != nullptr) cublas::destroy(blas);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    for (void* p : blocks) cudaFree(p);
    cudaGetLastError();
  }
  void* alloc(size_t bytes, const std::string& where) {
    blocks.push_back(device_alloc(bytes, "the probe's buffers", where));
    return blocks.back();
  }
};

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

GemmProbe probe_gemm(int gpu, model::Precision precision, int n, int repeats) {
  if (gpu < 0 || gpu >= visible_gpus()) throw Error("probe_gemm: GPU " + std::to_string(gpu) + " is not visible");
  if (n < 1 || repeats < 1) throw Error("probe_gemm: expected n >= 1 and repeats >= 1");
  const std::string where = "GPU " + std::to_string(gpu);
  cuda(cudaSetDevice(gpu), "cudaSetDevice", where);
  cudaDeviceProp prop{};
  cuda(cudaGetDeviceProperties(&prop, gpu), "cudaGetDeviceProperties", where);
  ProbeMemory m;
  const auto elements = static_cast<size_t>(n) * static_cast<size_t>(n);
  const GemmTypes types = gemm_types(precision);
  void* a = m.alloc(elements * types.bytes, where);
  void* b = m.alloc(elements * types.bytes, where);
  void* c = m.alloc(elements * types.bytes, where);
  fill_gemm_input(a, elements, precision, where);
  fill_gemm_input(b, elements, precision, where);
  cudaStream_t stream = nullptr;
  cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", where);
  m.streams.push_back(stream);
  blas(cublas::create(&m.blas), "cublasCreate", where);
  blas(cublas::set_stream(m.blas, stream), "cublasSetStream", where);
  void* workspace = m.alloc(kBlasWorkspaceBytes, where);
  blas(cublas::set_workspace(m.blas, workspace, kBlasWorkspaceBytes), "cublasSetWorkspace", where);
  const float alpha = 1.0f, beta = 0.0f;
  auto multiply = [&] {
    blas(cublas::gemm_ex(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, types.data, n, b, types.data, n, &beta,
                         c, types.data, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
         "cublasGemmEx", where);
  };
  for (int i = 0; i < 3; ++i) multiply();  // warm-up: kernel loading, clocks
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize", where);
  std::vector<cudaEvent_t> marks(static_cast<size_t>(repeats) + 1);
  for (cudaEvent_t& e : marks) {
    cuda(cudaEventCreate(&e), "cudaEventCreate", where);
    m.events.push_back(e);
  }
  cuda(cudaEventRecord(marks[0], stream), "cudaEventRecord", where);
  for (size_t i = 1; i < marks.size(); ++i) {
    multiply();
    cuda(cudaEventRecord(marks[i], stream), "cudaEventRecord", where);
  }
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize", where);
  std::vector<double> seconds;
  for (size_t i = 1; i < marks.size(); ++i) {
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, marks[i - 1], marks[i]), "cudaEventElapsedTime", where);
    seconds.push_back(ms / 1e3);
  }
  std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2), seconds.end());
  GemmProbe p;
  p.gpu = prop.name;
  p.n = n;
  p.seconds = seconds[seconds.size() / 2];
  p.flops_per_s = p.seconds > 0 ? 2.0 * n * static_cast<double>(n) * n / p.seconds : 0;
  return p;
}

AllReduceProbe probe_all_reduce(int gpus, double bytes, int repeats) {
  if (gpus < 1 || gpus > visible_gpus()) {
    throw Error("probe_all_reduce: " + std::to_string(gpus) + " GPUs asked for, " + std::to_string(visible_gpus()) + " visible");
  }
  if (!(bytes >= 4) || repeats < 1) throw Error("probe_all_reduce: expected bytes >= 4 and repeats >= 1");
  const std::string where = "the all-reduce probe over " + std::to_string(gpus) + " GPUs";
  const auto count = static_cast<size_t>(bytes) / sizeof(float);
  ProbeMemory m;
  std::vector<void*> buffers;
  std::vector<int> devices;
  for (int g = 0; g < gpus; ++g) {
    devices.push_back(g);
    cuda(cudaSetDevice(g), "cudaSetDevice", where);
    buffers.push_back(m.alloc(count * sizeof(float), where));
    cuda(cudaMemset(buffers.back(), 0, count * sizeof(float)), "cudaMemset", where);
    cudaStream_t s = nullptr;
    cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", where);
    m.streams.push_back(s);
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(gpus), nullptr);
  nccl(ncclCommInitAll(comms.data(), gpus, devices.data()), "ncclCommInitAll", where);
  // One thread drives every rank: each all-reduce is one group call, or rank 0's would wait for the others.
  auto all_reduce = [&] {
    nccl(ncclGroupStart(), "ncclGroupStart", where);
    for (size_t g = 0; g < comms.size(); ++g) {
      const ncclResult_t r = ncclAllReduce(buffers[g], buffers[g], count, ncclFloat32, ncclSum, comms[g], m.streams[g]);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        nccl(r, "ncclAllReduce", where, comms[g]);
      }
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd", where);
  };
  auto synchronize = [&] {
    for (size_t g = 0; g < comms.size(); ++g) {
      cuda(cudaSetDevice(static_cast<int>(g)), "cudaSetDevice", where);
      cuda(cudaStreamSynchronize(m.streams[g]), "cudaStreamSynchronize", where);
    }
  };
  AllReduceProbe p;
  try {
    for (int i = 0; i < 5; ++i) all_reduce();  // warm-up: connections, kernels
    synchronize();
    const auto start = Clock::now();
    for (int i = 0; i < repeats; ++i) all_reduce();
    synchronize();
    p.seconds = std::chrono::duration<double>(Clock::now() - start).count() / repeats;
  } catch (...) {
    for (ncclComm_t& c : comms) abort_rank(&c);
    throw;
  }
  // A clean end: finalize every rank in one group (a collective step), then free them.
  ncclGroupStart();
  for (ncclComm_t c : comms) ncclCommFinalize(c);
  ncclGroupEnd();
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  p.gpus = gpus;
  p.bytes = static_cast<double>(count * sizeof(float));
  p.algbw_bytes_per_s = p.seconds > 0 ? p.bytes / p.seconds : 0;
  p.busbw_bytes_per_s = p.algbw_bytes_per_s * 2.0 * (gpus - 1) / gpus;
  return p;
}

}  // namespace hetflow::exec
