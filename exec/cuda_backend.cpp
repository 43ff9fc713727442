// How the CUDA back end works (what it promises: cuda_backend.hpp). prepare() makes every
// object a run needs, per plan device: its GPU's proxy GEMM inputs, the pattern table and one
// arena holding the tensors' device copies; per device stream (a "lane": what one engine
// thread uses) a non-blocking CUDA stream, a cuBLAS handle with its own workspace, the GEMM
// output, a staging buffer and events; then one NCCL communicator per group of
// exec/cuda_plan.hpp. It runs each GEMM shape the proxy uses once, so that no kernel is loaded
// for the first time while NCCL kernels wait on the device (lazy loading may synchronize it).
// run() enqueues a task's work between two timing events and polls until it is done.
#include "exec/cuda_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "exec/copy_reuse.hpp"
#include "exec/cuda_decoder_ops.hpp"
#include "exec/cuda_plan.hpp"
#include "exec/ranks.hpp"
#include "exec/training.hpp"
#include "kernels/cast.hpp"
#include "kernels/cublas_loader.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

namespace {

// CUDA's lazy module loading loads a kernel's module at its first launch and waits for the
// device's queue to drain first; with an NCCL kernel spinning on a peer that waits for this
// GPU's work, it never drains. So modules load eagerly (unless the user chose otherwise),
// set before any CUDA call of the process.
const bool kEagerModules = [] { return ::setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0; }();

using partition::Plan;
using partition::TaskKind;
using Clock = std::chrono::steady_clock;
namespace cublas = kernels::cublas;  // opened at first use: kernels/cublas_loader.hpp

constexpr int kProxyN = 1024;       // the proxy multiplies [1024 x 1024] by [1024 x rows]
constexpr int kMinRows = 64;        // rows come in multiples of this, as sums of powers of two:
constexpr int kMaxRows = 8192;      // 8 shapes, 64 to 8192 rows (17 GFLOP per call at most)
constexpr int kCallsPerGroup = 4;   // GEMM calls between two looks at stop()
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
constexpr size_t kPatternPeriod = 97;
constexpr double kInitTimeoutS = 300;  // NCCL communicator creation, at most

[[noreturn]] void failed(const std::string& call, const std::string& why, const std::string& where) {
  throw Error(call + " failed (" + why + ") on " + where);
}

void cuda(cudaError_t e, const char* call, const std::string& where) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clears a non-sticky error, so the next call starts clean
  failed(call, cudaGetErrorString(e), where);
}

void blas(cublasStatus_t s, const char* call, const std::string& where) {
  if (s != CUBLAS_STATUS_SUCCESS) failed(call, cublas::status_string(s), where);
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string why = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') why += ": " + std::string(last);
  return why;
}

// Non-blocking communicators answer ncclInProgress for work they go on with: not a failure.
void nccl(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess && r != ncclInProgress) failed(call, nccl_error(r, comm), where);
}

// Between two polls: spin a little (much GPU work takes microseconds), then sleep briefly.
void pause(int& polls) {
  if (++polls < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 2048 ? 20 : 200));
  }
}

// Aborting ends the rank's NCCL kernels even when its peer never comes; the handle is gone.
void abort_rank(ncclComm_t* comm) {
  if (comm != nullptr && *comm != nullptr) {
    ncclCommAbort(*comm);
    *comm = nullptr;
  }
}

// Polls a rank until its last call has left ncclInProgress (non-blocking communicators), or
// fails, or stop is set (Stopped), or the deadline passes (Error).
void settle(ncclComm_t* comm, const std::atomic<bool>& stop, const char* call, const std::string& where,
            Clock::time_point deadline = Clock::time_point::max()) {
  for (int polls = 0;;) {
    ncclResult_t state = ncclSuccess;
    nccl(ncclCommGetAsyncError(*comm, &state), "ncclCommGetAsyncError", where, *comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string why = nccl_error(state, *comm);
      abort_rank(comm);
      failed(call, why, where);
    }
    if (stop.load()) {
      abort_rank(comm);
      throw Stopped();
    }
    if (Clock::now() > deadline) {
      abort_rank(comm);
      failed(call, "still in progress after " + std::to_string(static_cast<int>(kInitTimeoutS)) + " s", where);
    }
    pause(polls);
  }
}

// Polls until `event` has happened; meanwhile stop (Stopped) and, with a rank, NCCL's
// asynchronous errors (Error) end the wait, the rank aborted first.
void await(cudaEvent_t event, ncclComm_t* comm, const std::atomic<bool>& stop, const std::string& where) {
  for (int polls = 0;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      abort_rank(comm);
      cuda(e, "cudaEventQuery", where);
    }
    // "Not ready" (ours, or a query inside NCCL's) is also left as the thread's last error: the
    // next kernel launch, checked by cudaGetLastError (CUB's by cudaPeekAtLastError), would
    // report it as its own failure.
    (void)cudaGetLastError();
    if (e == cudaSuccess) return;
    if (comm != nullptr && *comm != nullptr) {
      ncclResult_t state = ncclSuccess;
      nccl(ncclCommGetAsyncError(*comm, &state), "ncclCommGetAsyncError", where, *comm);
      if (state != ncclSuccess && state != ncclInProgress) {
        const std::string why = nccl_error(state, *comm);
        abort_rank(comm);
        failed("an NCCL operation", why, where);
      }
    }
    if (stop.load()) {
      abort_rank(comm);
      throw Stopped();
    }
    pause(polls);
  }
}

struct GemmTypes {
  cudaDataType data;
  size_t bytes;
};

GemmTypes gemm_types(model::Precision p) {
  switch (p) {
    case model::Precision::bf16: return {CUDA_R_16BF, 2};
    case model::Precision::fp16: return {CUDA_R_16F, 2};
    case model::Precision::fp32: break;
  }
  return {CUDA_R_32F, 4};
}

// `count` elements of (i mod 17 - 8) / 8 in the GEMM's type (exact in all three), so the
// multiplies run on ordinary numbers rather than zeros.
std::vector<std::uint16_t> gemm_input16(size_t count, model::Precision p) {
  std::vector<std::uint16_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    const float x = (static_cast<float>(i % 17) - 8.0f) / 8.0f;
    out[i] = p == model::Precision::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_fp16(x);
  }
  return out;
}

void fill_gemm_input(void* device, size_t count, model::Precision p, const std::string& where) {
  if (gemm_types(p).bytes == 2) {
    const auto host = gemm_input16(count, p);
    cuda(cudaMemcpy(device, host.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy", where);
    return;
  }
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = (static_cast<float>(i % 17) - 8.0f) / 8.0f;
  cuda(cudaMemcpy(device, host.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy", where);
}

void* device_alloc(size_t bytes, const std::string& what, const std::string& where) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    failed("cudaMalloc", std::string(cudaGetErrorString(e)) + ", " + std::to_string(bytes) + " bytes for " + what, where);
  }
  return p;
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One device stream's objects: what its engine thread uses, and nobody else.
struct GpuLane {
  int stream = -1;
  cudaStream_t cuda = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  void* c = nullptr;        // the proxy GEMM's output
  void* staging = nullptr;  // cap bytes: messages whose tensors are smaller, collective buffers
  cudaEvent_t start = nullptr, end = nullptr;       // timing
  cudaEvent_t group[2] = {nullptr, nullptr};        // GEMM groups in flight
  cudaEvent_t ops_done = nullptr;                   // real math: the compute stream's work so far
};

// One plan device.
struct Gpu {
  int ordinal = -1;
  std::string where;               // "GPU 1 (plan device 1, gpu1)"
  void* a = nullptr;               // the proxy GEMM's inputs, read by all lanes
  void* b = nullptr;
  float* pattern = nullptr;        // j mod 97 + 1 at j, for j < cap floats + 97
  void* arena = nullptr;           // the device copies of the tensors on this device
  std::vector<GpuLane> lanes;      // one per stream program of the device
  std::mutex* issue = nullptr;     // NCCL calls on this GPU (shared by plan devices on it)
  std::unique_ptr<CudaDecoderOps> ops;  // real math: on the compute stream (the forward tasks')
};

}  // namespace

struct CudaBackend::State {
  const Plan* plan = nullptr;
  Training* training = nullptr;             // real math; null: proxies
  CudaPlan nccl_plan;
  model::Precision precision = model::Precision::fp32;
  size_t cap = 0;                              // bytes per device copy, message and collective
  std::map<int, std::unique_ptr<std::mutex>> issue_on_gpu;  // by ordinal: Gpu::issue
  std::map<int, std::uint64_t> pool_thresholds;  // by ordinal: the default pool's, as it was
  std::vector<Gpu> gpus;                       // per plan device
  std::vector<void*> copy;                     // per tensor: its device copy
  std::vector<size_t> copy_bytes;              // and its size
  std::vector<size_t> send_bytes;              // real math, per channel: what its sends carry
  std::vector<std::vector<ncclComm_t>> comms;  // per NCCL group, per rank
  mutable std::mutex times_mutex;
  std::map<std::pair<int, int>, double> gpu_s;  // (task, iteration) -> seconds

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // Communicators first (their kernels end), then the streams drain, then memory goes.
  // Errors are ignored: this runs after failures too, and must not throw.
  ~State() {
    for (auto& ranks : comms) {
      for (ncclComm_t& c : ranks) abort_rank(&c);
    }
    for (Gpu& g : gpus) {
      if (g.ordinal < 0 || cudaSetDevice(g.ordinal) != cudaSuccess) continue;
      for (GpuLane& l : g.lanes) {
        if (l.cuda != nullptr) cudaStreamSynchronize(l.cuda);
        if (l.blas != nullptr) cublas::destroy(l.blas);
        if (l.cuda != nullptr) kernels::release_linear_handles(l.cuda);  // the real math's, for this stream
        for (cudaEvent_t e : {l.start, l.end, l.group[0], l.group[1], l.ops_done}) {
          if (e != nullptr) cudaEventDestroy(e);
        }
        if (l.cuda != nullptr) cudaStreamDestroy(l.cuda);
        for (void* p : {l.blas_workspace, l.c, l.staging}) cudaFree(p);
      }
      for (void* p : {g.a, g.b, static_cast<void*>(g.pattern), g.arena}) cudaFree(p);
      g.ops.reset();  // its blocks back, before the pool gives what it kept to the driver
    }
    for (const auto& [ordinal, threshold] : pool_thresholds) {
      cudaMemPool_t pool = nullptr;
      if (cudaSetDevice(ordinal) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, ordinal) != cudaSuccess) continue;
      std::uint64_t before = threshold;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &before);
      cudaMemPoolTrimTo(pool, 0);
    }
    cudaGetLastError();
  }

  GpuLane& lane(int device, int stream) {
    for (GpuLane& l : gpus[static_cast<size_t>(device)].lanes) {
      if (l.stream == stream) return l;
    }
    throw Error("the cuda back end has no stream " + std::to_string(stream) + " on device " + std::to_string(device) +
                " (the task is in none of its programs)");
  }
};

bool cuda_backend_built() { return true; }

CudaBackend::CudaBackend(CudaBackendOptions options) : options_(std::move(options)) {
  if (!(options_.flop_scale >= 0) || !std::isfinite(options_.flop_scale)) {
    throw InputError("<options>", 0, "flop_scale", "expected a finite number >= 0");
  }
  if (!(options_.max_message_bytes >= 4) || !(options_.max_message_bytes <= 1024.0 * 1024 * 1024)) {
    throw InputError("<options>", 0, "max_message_bytes", "expected 4 bytes to 1 GiB");
  }
}

// The training's arrays come home before the GPUs' objects go: it may be used after (its
// weights, another back end).
CudaBackend::~CudaBackend() {
  if (!state_ || options_.training == nullptr) return;
  try {
    options_.training->place_home();
  } catch (...) {  // a destructor must not throw; the GPU failed already
  }
}

namespace {

// The GEMM of `rows` on a lane: C[1024 x rows] = A[1024 x 1024] B[1024 x rows], column-major.
void gemm(const GpuLane& lane, const Gpu& gpu, model::Precision p, int rows, const std::string& where) {
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = gemm_types(p).data;
  blas(cublas::gemm_ex(lane.blas, CUBLAS_OP_N, CUBLAS_OP_N, kProxyN, rows, kProxyN, &alpha, gpu.a, type, kProxyN, gpu.b,
                       type, kProxyN, &beta, lane.c, type, kProxyN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx", where);
}

// A lane's stream, events and staging buffer; for proxies also its cuBLAS handle, workspace and
// GEMM output, every GEMM shape run once (real math runs its own kernels, not these).
void make_lane(GpuLane& lane, const Gpu& gpu, model::Precision p, size_t cap, bool proxy, const std::string& where) {
  cuda(cudaStreamCreateWithFlags(&lane.cuda, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", where);
  cuda(cudaEventCreate(&lane.start), "cudaEventCreate", where);
  cuda(cudaEventCreate(&lane.end), "cudaEventCreate", where);
  for (cudaEvent_t& e : lane.group) cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", where);
  cuda(cudaEventCreateWithFlags(&lane.ops_done, cudaEventDisableTiming), "cudaEventCreateWithFlags", where);
  lane.staging = device_alloc(cap, "the staging buffer", where);
  cuda(cudaMemsetAsync(lane.staging, 0, cap, lane.cuda), "cudaMemsetAsync", where);
  if (!proxy) {
    cuda(cudaStreamSynchronize(lane.cuda), "cudaStreamSynchronize (warm-up)", where);
    return;
  }
  blas(cublas::create(&lane.blas), "cublasCreate", where);
  blas(cublas::set_stream(lane.blas, lane.cuda), "cublasSetStream", where);
  lane.blas_workspace = device_alloc(kBlasWorkspaceBytes, "the cuBLAS workspace", where);
  blas(cublas::set_workspace(lane.blas, lane.blas_workspace, kBlasWorkspaceBytes), "cublasSetWorkspace", where);
  lane.c = device_alloc(static_cast<size_t>(kProxyN) * kMaxRows * gemm_types(p).bytes, "the proxy GEMM's output", where);
  for (int rows = kMinRows; rows <= kMaxRows; rows *= 2) gemm(lane, gpu, p, rows, where);  // every shape, loaded now
  cuda(cudaMemcpyAsync(lane.staging, gpu.pattern, std::min<size_t>(cap, 4), cudaMemcpyDeviceToDevice, lane.cuda),
       "cudaMemcpyAsync", where);
  cuda(cudaStreamSynchronize(lane.cuda), "cudaStreamSynchronize (warm-up)", where);
}

// The device copies of the tensors on `device`, in one arena.
void make_copies(CudaBackend::State& s, Gpu& gpu, int device) {
  const Plan& plan = *s.plan;
  size_t total = 0;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    if (plan.tensors[t].device == device) total += aligned(s.copy_bytes[t]);
  }
  gpu.arena = device_alloc(total, "the tensors' device copies", gpu.where);
  cuda(cudaMemset(gpu.arena, 0, std::max<size_t>(total, 1)), "cudaMemset", gpu.where);
  size_t at = 0;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    if (plan.tensors[t].device != device) continue;
    s.copy[t] = static_cast<char*>(gpu.arena) + at;
    at += aligned(s.copy_bytes[t]);
  }
}

// Real math: the device's DecoderOps, on the stream of its forward tasks.
void make_ops(CudaBackend::State& s, Gpu& gpu, int device) {
  const Plan& plan = *s.plan;
  if (gpu.lanes.empty()) return;
  // The real math's kernels go on the stream that runs the device's forward tasks.
  const GpuLane* compute = &gpu.lanes.front();
  for (const partition::StreamProgram& program : plan.programs[static_cast<size_t>(device)]) {
    for (const int t : program.tasks) {
      if (plan.task(t).kind == TaskKind::forward) compute = &s.lane(device, program.stream);
    }
  }
  // A bf16 plan multiplies bf16 operands with fp32 accumulation; an fp16 plan fp16 ones when
  // its loss is scaled (small gradients underflow in fp16 otherwise), fp32 ones if not.
  kernels::GemmInputs inputs = kernels::GemmInputs::fp32;
  if (s.precision == model::Precision::bf16) inputs = kernels::GemmInputs::bf16;
  if (s.precision == model::Precision::fp16 && s.training->loss_scaling()) inputs = kernels::GemmInputs::fp16;
  gpu.ops = std::make_unique<CudaDecoderOps>(gpu.ordinal, compute->cuda, inputs);
}

// Stream-ordered scratch (16-bit GEMM operands, sorts, partial sums) is freed with
// cudaFreeAsync into the device's default pool, whose release threshold of 0 hands the memory
// back to the driver at every synchronisation, to be mapped again by the next task: the pool
// keeps it instead (trimmed when the run's objects go). Without pools, nothing to do.
// Returns the threshold it replaced, for ~State to put back (the pool is the process's).
std::optional<std::uint64_t> keep_freed_memory(int ordinal) {
  cudaMemPool_t pool = nullptr;
  std::uint64_t before = 0, keep = UINT64_MAX;
  const bool kept = cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess &&
                    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &before) == cudaSuccess &&
                    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess;
  cudaGetLastError();
  return kept ? std::optional<std::uint64_t>(before) : std::nullopt;
}

void make_gpu(CudaBackend::State& s, int device) {
  const Plan& plan = *s.plan;
  Gpu& gpu = s.gpus[static_cast<size_t>(device)];
  gpu.ordinal = s.nccl_plan.gpus[static_cast<size_t>(device)];
  gpu.where = "GPU " + std::to_string(gpu.ordinal) + " (plan device " + std::to_string(device) + ", " +
              plan.device_name(device) + ")";
  std::unique_ptr<std::mutex>& issue = s.issue_on_gpu[gpu.ordinal];
  if (!issue) issue = std::make_unique<std::mutex>();
  gpu.issue = issue.get();
  cuda(cudaSetDevice(gpu.ordinal), "cudaSetDevice", gpu.where);
  if (!s.pool_thresholds.count(gpu.ordinal)) {
    if (const auto before = keep_freed_memory(gpu.ordinal)) s.pool_thresholds[gpu.ordinal] = *before;
  }
  const bool proxy = s.training == nullptr;
  if (!proxy) {  // real math: no proxy GEMM inputs or pattern
    make_copies(s, gpu, device);
    if (static_cast<size_t>(device) < plan.programs.size()) {
      for (const partition::StreamProgram& program : plan.programs[static_cast<size_t>(device)]) {
        gpu.lanes.emplace_back();
        gpu.lanes.back().stream = program.stream;
        make_lane(gpu.lanes.back(), gpu, s.precision, s.cap, false, gpu.where + ", stream " + plan.stream_name(program.stream));
      }
    }
    make_ops(s, gpu, device);
    if (gpu.ops) gpu.ops->warm_up();
    // The arena's cudaMemset and the copies above ran on the legacy stream, which the lanes'
    // non-blocking streams do not wait for: done before any lane starts.
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (set-up)", gpu.where);
    return;
  }
  const size_t a = static_cast<size_t>(kProxyN) * kProxyN, b = static_cast<size_t>(kProxyN) * kMaxRows;
  gpu.a = device_alloc(a * gemm_types(s.precision).bytes, "the proxy GEMM's input", gpu.where);
  gpu.b = device_alloc(b * gemm_types(s.precision).bytes, "the proxy GEMM's input", gpu.where);
  fill_gemm_input(gpu.a, a, s.precision, gpu.where);
  fill_gemm_input(gpu.b, b, s.precision, gpu.where);
  std::vector<float> pattern(s.cap / sizeof(float) + kPatternPeriod);
  for (size_t j = 0; j < pattern.size(); ++j) pattern[j] = static_cast<float>(j % kPatternPeriod + 1);
  gpu.pattern = static_cast<float*>(device_alloc(pattern.size() * sizeof(float), "the proxy pattern", gpu.where));
  cuda(cudaMemcpy(gpu.pattern, pattern.data(), pattern.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy", gpu.where);
  make_copies(s, gpu, device);
  if (static_cast<size_t>(device) >= plan.programs.size()) return;
  for (const partition::StreamProgram& program : plan.programs[static_cast<size_t>(device)]) {
    gpu.lanes.emplace_back();
    gpu.lanes.back().stream = program.stream;
    make_lane(gpu.lanes.back(), gpu, s.precision, s.cap, true, gpu.where + ", stream " + plan.stream_name(program.stream));
  }
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (set-up)", gpu.where);  // as above
}

// This process's ranks of one group, all from this thread: inside ncclGroupStart/End, or the
// first rank's creation would wait for the others for ever. Non-blocking, so each rank is
// then polled. Under mpirun the process of the group's first member makes its unique id and
// the others receive it (Ranks::exchange); every process walks the groups in one order.
void make_comm(CudaBackend::State& s, size_t g, const std::atomic<bool>& stop, const Ranks* processes) {
  const CudaPlan& p = s.nccl_plan;
  const NcclGroup& group = p.groups[g];
  const std::string where = "the NCCL communicator of " + group.what;
  std::vector<ncclComm_t>& ranks = s.comms[g];
  ranks.assign(group.devices.size(), nullptr);
  std::vector<size_t> here;
  for (size_t r = 0; r < group.devices.size(); ++r) {
    if (p.local(group.devices[r])) here.push_back(r);
  }
  if (here.empty()) return;
  ncclUniqueId id{};
  const bool maker = p.id_maker(g) == p.process;
  if (maker) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", where);
  const std::vector<int> among = p.processes(g);
  if (among.size() > 1) {
    if (processes == nullptr) throw Error(where + " spans processes, but the back end was given no MPI ranks");
    const auto mine = maker ? std::as_bytes(std::span<const ncclUniqueId>(&id, 1)) : std::span<const std::byte>();
    const auto all = processes->exchange(among, mine, stop);
    const auto from = static_cast<size_t>(std::find(among.begin(), among.end(), p.id_maker(g)) - among.begin());
    if (all[from].size() != sizeof id) {
      throw Error(where + ": rank " + std::to_string(p.id_maker(g)) + " sent " + std::to_string(all[from].size()) +
                  " bytes for its NCCL unique id, not " + std::to_string(sizeof id));
    }
    std::memcpy(&id, all[from].data(), sizeof id);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  nccl(ncclGroupStart(), "ncclGroupStart", where);
  for (const size_t r : here) {
    const Gpu& gpu = s.gpus[static_cast<size_t>(group.devices[r])];
    const cudaError_t set = cudaSetDevice(gpu.ordinal);
    const ncclResult_t made = set == cudaSuccess ? ncclCommInitRankConfig(&ranks[r], static_cast<int>(ranks.size()), id,
                                                                         static_cast<int>(r), &config)
                                                 : ncclSuccess;
    if (set != cudaSuccess || (made != ncclSuccess && made != ncclInProgress)) {
      ncclGroupEnd();
      cuda(set, "cudaSetDevice", gpu.where);
      nccl(made, "ncclCommInitRankConfig", where + ", rank " + std::to_string(r) + " on " + gpu.where);
    }
  }
  nccl(ncclGroupEnd(), "ncclGroupEnd", where);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kInitTimeoutS));
  for (const size_t r : here) {
    settle(&ranks[r], stop, "ncclCommInitRankConfig", where + ", rank " + std::to_string(r), deadline);
  }
}

}  // namespace

void CudaBackend::prepare(const Plan& plan) {
  // The training's arrays come home before the GPUs' objects they live in go.
  if (state_ && options_.training != nullptr) {
    options_.training->place_home();
  }
  state_.reset();  // the previous run's objects go first
  stop_.store(false);
  if (options_.training != nullptr) {  // the plan's fault, before any GPU's
    require_no_copy_reuse_hazards(
        plan, [&](int tensor) { return one_device_copy_under_real_math(plan, tensor); },
        "the CUDA back end's real math");
    require_real_collectives(plan, [&](int tensor) { return options_.training->buffer_bytes(tensor); });
  }
  int visible = 0;
  const cudaError_t counted = cudaGetDeviceCount(&visible);
  if (counted != cudaSuccess) {
    cudaGetLastError();
    visible = 0;
  }
  auto s = std::make_unique<State>();
  s->plan = &plan;
  s->training = options_.training;
  // A failure after the training's arrays moved to the GPUs brings them home while the GPUs'
  // objects still exist (this guard goes before `s`).
  struct Home {
    Training* training = nullptr;
    bool armed = false;
    ~Home() {
      if (!armed) return;
      try {
        training->place_home();
      } catch (...) {  // nothing better to do while failing already
      }
    }
  } home{s->training};
  // Under mpirun this process runs its block of the plan's devices on its node's GPUs, after
  // those of the node's lower ranks.
  const Ranks* processes = options_.ranks != nullptr && !options_.ranks->alone() ? options_.ranks : nullptr;
  const int devices = plan.device_count();
  std::vector<int> owner, all;
  int process = 0, first = 0;
  if (processes != nullptr) {
    processes->check_devices(devices);
    owner = device_owners(devices, processes->size(), [&](int d) { return processes->owner(d, devices); });
    process = processes->rank();
    for (int r = 0; r < processes->size(); ++r) all.push_back(r);
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "rank-%d", process);
    std::vector<std::string> hosts;
    for (const auto& bytes : processes->exchange(all, std::as_bytes(std::span<const char>(host, std::strlen(host))), stop_)) {
      hosts.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    first = first_gpus(hosts, owner)[static_cast<size_t>(process)];
  }
  // What can fail in one process alone (its GPUs, its memory) fails in all of them together:
  // the others would otherwise wait for its communicators for ever.
  std::string failed;
  std::exception_ptr mine;
  try {
    std::vector<int> gpus = gpu_ordinals(devices, visible, options_.gpus, counted != cudaSuccess ? cudaGetErrorString(counted) : "",
                                         owner, process, first);
    // Real math's tensor parallelism all-reduces inside compute tasks on its chunks'
    // communicators (the plan's "tp" ones, as Training finds them).
    std::vector<int> in_task;
    if (s->training != nullptr && s->training->tensor_parallel()) {
      for (size_t c = 0; c < plan.communicators.size(); ++c) {
        if (plan.communicators[c].name.rfind("tp ", 0) == 0 && plan.communicators[c].devices.size() > 1) {
          in_task.push_back(static_cast<int>(c));
        }
      }
    }
    s->nccl_plan = cuda_plan(plan, std::move(gpus), owner, process, in_task);
    s->precision = plan.layout.precision;
    s->cap = static_cast<size_t>(options_.max_message_bytes) / sizeof(float) * sizeof(float);
    s->copy.assign(plan.tensors.size(), nullptr);
    for (size_t t = 0; t < plan.tensors.size(); ++t) {
      // Real math: what the training exchanges, whole; a proxy: the plan's bytes, capped.
      s->copy_bytes.push_back(s->training != nullptr
                                  ? s->training->buffer_bytes(static_cast<int>(t))
                                  : std::min(static_cast<size_t>(std::max(0.0, plan.tensors[t].bytes)), s->cap));
    }
    s->send_bytes.assign(plan.channels.size(), 0);
    if (s->training != nullptr) {
      // The staging buffer holds any whole message or collective buffer of the real math.
      for (const size_t bytes : s->copy_bytes) s->cap = std::max(s->cap, bytes);
      for (size_t t = 0; t < plan.tasks.size(); ++t) {
        const partition::Task& task = plan.tasks[t];
        const auto reads = plan.reads(static_cast<int>(t));
        if (task.kind != TaskKind::send) continue;
        // A parameter server's push or pull carries the model's floats; the rest, the tensor.
        size_t bytes = reads.empty() ? 0 : s->copy_bytes[static_cast<size_t>(reads[0])];
        if (const auto floats = s->training->message_floats(static_cast<int>(t))) bytes = *floats * sizeof(float);
        size_t& channel_bytes = s->send_bytes[static_cast<size_t>(task.channel)];
        if (channel_bytes != 0 && channel_bytes != bytes) {
          // An NCCL receive must know its size; one per channel keeps the k-th send and receive paired.
          throw PlanError("channel " + std::to_string(task.channel) + " carries messages of " + std::to_string(channel_bytes) +
                          " and " + std::to_string(bytes) + " bytes; real math on the cuda back end needs one size a channel");
        }
        channel_bytes = bytes;
        s->cap = std::max(s->cap, bytes);
      }
    }
    s->gpus.resize(static_cast<size_t>(devices));
    for (int d = 0; d < devices; ++d) {
      if (s->nccl_plan.local(d)) make_gpu(*s, d);
    }
    if (s->training != nullptr) {
      // The chunks' arrays to their GPUs: each allocated with its GPU current.
      State* state = s.get();  // the training keeps this function: by value
      home.armed = true;
      s->training->place([state](int d) -> const DecoderOps& {
        Gpu& gpu = state->gpus[static_cast<size_t>(d)];
        if (!gpu.ops) throw Error("plan device " + std::to_string(d) + " holds a chunk but runs no forward task here");
        cuda(cudaSetDevice(gpu.ordinal), "cudaSetDevice", gpu.where);
        return *gpu.ops;
      });
    }
  } catch (const std::exception& e) {
    if (processes == nullptr) throw;
    failed = e.what();
    mine = std::current_exception();
  }
  if (processes != nullptr) {
    const auto verdicts = processes->exchange(all, std::as_bytes(std::span<const char>(failed.data(), failed.size())), stop_);
    if (mine) std::rethrow_exception(mine);
    for (size_t r = 0; r < verdicts.size(); ++r) {
      if (verdicts[r].empty()) continue;
      throw Error("rank " + std::to_string(r) + " could not prepare its GPUs: " +
                  std::string(reinterpret_cast<const char*>(verdicts[r].data()), verdicts[r].size()));
    }
  }
  s->comms.resize(s->nccl_plan.groups.size());
  for (size_t g = 0; g < s->nccl_plan.groups.size(); ++g) make_comm(*s, g, stop_, processes);
  state_ = std::move(s);
  home.armed = false;
}

std::optional<size_t> CudaBackend::buffer_bytes(int tensor) const {
  if (!state_ || tensor < 0 || static_cast<size_t>(tensor) >= state_->copy_bytes.size()) return std::nullopt;
  return state_->copy_bytes[static_cast<size_t>(tensor)];
}

std::optional<double> CudaBackend::model_peak_bytes(int device) const {
  if (!state_ || state_->training == nullptr || device < 0 || static_cast<size_t>(device) >= state_->gpus.size()) {
    return std::nullopt;
  }
  const Gpu& gpu = state_->gpus[static_cast<size_t>(device)];
  if (!gpu.ops) return std::nullopt;
  return static_cast<double>(gpu.ops->memory().peak_bytes());
}

void CudaBackend::stop() { stop_.store(true); }  // the polling threads abort what they drive

std::optional<double> CudaBackend::gpu_time_s(int task, int iteration) const {
  if (!state_) return std::nullopt;
  std::lock_guard lock(state_->times_mutex);
  const auto it = state_->gpu_s.find({task, iteration});
  if (it == state_->gpu_s.end()) return std::nullopt;
  return it->second;
}

namespace {

// What one run() call works with.
struct Job {
  CudaBackend::State& s;
  TaskContext& task;
  Gpu& gpu;
  GpuLane& lane;
  std::string where;  // "GPU 0 (plan device 0, gpu0), forward #3 ..., iteration 1"
  const std::atomic<bool>& stop;
  bool to_host;

  // After the end event: the time, then (on request) the device bytes of `tensors` into
  // their host buffers.
  void finish(ncclComm_t* comm, std::span<const std::pair<int, Buffer>> tensors) {
    cuda(cudaEventRecord(lane.end, lane.cuda), "cudaEventRecord", where);
    await(lane.end, comm, stop, where);
    float ms = 0;
    cuda(cudaEventElapsedTime(&ms, lane.start, lane.end), "cudaEventElapsedTime", where);
    {
      std::lock_guard lock(s.times_mutex);
      s.gpu_s[{task.task, task.iteration}] = ms / 1e3;
    }
    if (!to_host || tensors.empty()) return;
    for (const auto& [t, host] : tensors) {
      const size_t n = std::min(host.size_bytes, s.copy_bytes[static_cast<size_t>(t)]);
      if (n > 0) {
        cuda(cudaMemcpyAsync(host.data, s.copy[static_cast<size_t>(t)], n, cudaMemcpyDeviceToHost, lane.cuda),
             "cudaMemcpyAsync (to the host)", where);
      }
    }
    cuda(cudaEventRecord(lane.end, lane.cuda), "cudaEventRecord", where);
    await(lane.end, nullptr, stop, where);
  }

  // Waits, by polling (stop() and, with a rank, NCCL's errors end the wait), for the work
  // enqueued on this lane so far.
  void drain(ncclComm_t* comm) {
    cuda(cudaEventRecord(lane.end, lane.cuda), "cudaEventRecord", where);
    await(lane.end, comm, stop, where);
  }

  std::vector<std::pair<int, Buffer>> written() const {
    std::vector<std::pair<int, Buffer>> out;
    const auto ids = s.plan->writes(task.task);
    for (size_t k = 0; k < ids.size() && k < task.writes.size(); ++k) out.emplace_back(ids[k], task.writes[k]);
    return out;
  }

  void copy_device(void* to, const void* from, size_t bytes) {
    if (bytes == 0) return;
    cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, lane.cuda), "cudaMemcpyAsync", where);
  }

  ncclComm_t* rank() {
    const auto t = static_cast<size_t>(task.task);
    ncclComm_t* comm = &s.comms[static_cast<size_t>(s.nccl_plan.group_of_task[t])]
                               [static_cast<size_t>(s.nccl_plan.rank_of_task[t])];
    if (*comm == nullptr) throw Error("the NCCL communicator for " + where + " was aborted by an earlier failure");
    return comm;
  }

  // An NCCL call on this GPU, issued while no other thread issues one here.
  template <typename Call>
  void issue(ncclComm_t* comm, const char* name, Call call) {
    ncclResult_t r;
    {
      std::lock_guard lock(*gpu.issue);
      r = call(*comm);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why = nccl_error(r, *comm);
      abort_rank(comm);
      failed(name, why, where);
    }
    settle(comm, stop, name, where);
  }
};

// The task as the training sees it on a GPU: its tensors are their device copies.
class DeviceTask final : public TaskContext {
 public:
  explicit DeviceTask(Job& job) : job_(job) {
    task = job.task.task;
    iteration = job.task.iteration;
    spec = job.task.spec;
    for (const int t : job.s.plan->reads(task)) reads_.push_back(copy_of(t));
    for (const int t : job.s.plan->writes(task)) writes_.push_back(copy_of(t));
    reads = reads_;
    writes = writes_;
  }
  void waiting_for(std::string what) override { job_.task.waiting_for(std::move(what)); }

 private:
  Buffer copy_of(int tensor) const {
    const auto t = static_cast<size_t>(tensor);
    return {static_cast<std::byte*>(job_.s.copy[t]), job_.s.copy_bytes[t]};
  }
  Job& job_;
  std::vector<Buffer> reads_, writes_;
};

// The real math's kernels run on the device's compute stream: this lane's stream waits for
// what is enqueued there so far (nothing to do on the compute stream itself).
void follow_compute_stream(Job& job) {
  const cudaStream_t compute = job.gpu.ops->stream();
  if (compute == job.lane.cuda) return;
  cuda(cudaEventRecord(job.lane.ops_done, compute), "cudaEventRecord", job.where);
  cuda(cudaStreamWaitEvent(job.lane.cuda, job.lane.ops_done, 0), "cudaStreamWaitEvent", job.where);
}

void run_compute(Job& job, double flop_scale) {
  const partition::Task& t = *job.task.spec;
  const double per_row = 2.0 * kProxyN * kProxyN;
  const double wanted = std::ceil(t.flops * flop_scale / per_row / kMinRows) * kMinRows;
  auto rows = static_cast<long long>(wanted > 0 ? std::min(wanted, 1e15) : 0.0);  // NaN: none
  for (int calls = 0, groups = 0; rows > 0;) {
    int n = kMaxRows;
    while (n > rows) n /= 2;  // rows is a multiple of 64: its binary digits from 8192 down
    gemm(job.lane, job.gpu, job.s.precision, n, job.where);
    rows -= n;
    if (++calls % kCallsPerGroup != 0) continue;
    // One group runs while the next is queued behind it; waiting here sees stop().
    cuda(cudaEventRecord(job.lane.group[groups % 2], job.lane.cuda), "cudaEventRecord", job.where);
    if (groups > 0) await(job.lane.group[(groups - 1) % 2], nullptr, job.stop, job.where);
    ++groups;
  }
  // The CPU proxy's pattern: (31 task + 7 iteration + i) mod 97 + 1 at float i, into
  // transient outputs only, as the CPU proxy: a persistent tensor is one copy for every
  // iteration, which another iteration's transfer may be reading (a WSP worker's push).
  const size_t seed = static_cast<size_t>(job.task.task) * 31 + static_cast<size_t>(job.task.iteration) * 7;
  const float* from = job.gpu.pattern + seed % kPatternPeriod;
  for (const int tensor : job.s.plan->writes(job.task.task)) {
    if (partition::is_persistent(job.s.plan->tensor(tensor).kind)) continue;
    const auto at = static_cast<size_t>(tensor);
    job.copy_device(job.s.copy[at], from, job.s.copy_bytes[at] / sizeof(float) * sizeof(float));
  }
  job.finish(nullptr, job.written());
}

void run_transfer(Job& job) {
  const partition::Task& t = *job.task.spec;
  const Plan& plan = *job.s.plan;
  const bool sending = t.kind == TaskKind::send;
  ncclComm_t* comm = job.rank();
  const auto tensors = sending ? plan.reads(job.task.task) : plan.writes(job.task.task);
  const int tensor = tensors.empty() ? -1 : tensors[0];
  const size_t own = tensor < 0 ? 0 : job.s.copy_bytes[static_cast<size_t>(tensor)];
  // Real math moves the sender's whole tensor (a receiver's tensor may be its 1/t slice, cut
  // by the training); a proxy the plan's bytes, capped.
  const bool real = job.s.training != nullptr;
  const size_t bytes = real ? job.s.send_bytes[static_cast<size_t>(t.channel)]
                            : std::min(static_cast<size_t>(std::max(0.0, t.bytes)), job.s.cap);
  // The tensor's own device copy when it holds the message; the staging buffer otherwise.
  void* buffer = tensor >= 0 && own >= bytes ? job.s.copy[static_cast<size_t>(tensor)] : job.lane.staging;
  const std::string channel = "channel " + std::to_string(t.channel) + " (" + plan.channels[static_cast<size_t>(t.channel)].tag + ")";
  std::optional<std::vector<float>> message;  // a parameter server's push or pull: host floats
  if (sending && real) {
    DeviceTask device(job);
    message = job.s.training->message(device);
  }
  if (message) {
    if (message->size() * sizeof(float) != bytes) {
      throw Error("a parameter-server message of " + std::to_string(message->size()) + " floats where " +
                  std::to_string(bytes / sizeof(float)) + " were announced (" + job.where + ")");
    }
    buffer = job.lane.staging;
    cuda(cudaMemcpyAsync(buffer, message->data(), bytes, cudaMemcpyHostToDevice, job.lane.cuda), "cudaMemcpyAsync",
         job.where);
    job.task.waiting_for("device " + std::to_string(plan.peer(job.task.task)) + " to receive on " + channel);
    job.issue(comm, "ncclSend", [&](ncclComm_t c) { return ncclSend(buffer, bytes, ncclUint8, 1, c, job.lane.cuda); });
  } else if (sending) {
    job.task.waiting_for("device " + std::to_string(plan.peer(job.task.task)) + " to receive on " + channel);
    if (buffer == job.lane.staging) {
      cuda(cudaMemsetAsync(buffer, 0, bytes, job.lane.cuda), "cudaMemsetAsync", job.where);
      if (tensor >= 0) job.copy_device(buffer, job.s.copy[static_cast<size_t>(tensor)], own);
    }
    job.issue(comm, "ncclSend", [&](ncclComm_t c) { return ncclSend(buffer, bytes, ncclUint8, 1, c, job.lane.cuda); });
  } else {
    job.task.waiting_for("a message from device " + std::to_string(plan.peer(job.task.task)) + " on " + channel);
    job.issue(comm, "ncclRecv", [&](ncclComm_t c) { return ncclRecv(buffer, bytes, ncclUint8, 0, c, job.lane.cuda); });
    if (real && t.purpose == partition::Purpose::ps_push) {
      // A server's update reads pushes on the host. They go to the engine's buffer of this
      // instance now: the tensor's one device copy may take the next iteration's push (a
      // worker running ahead, WSP) before the update of this one starts.
      job.drain(comm);
      if (!job.task.writes.empty()) {
        const size_t n = std::min(job.task.writes[0].size_bytes, bytes);
        cuda(cudaMemcpyAsync(job.task.writes[0].data, buffer, n, cudaMemcpyDeviceToHost, job.lane.cuda),
             "cudaMemcpyAsync (to the host)", job.where);
      }
      job.drain(nullptr);
      job.finish(comm, {});
      return;
    }
    if (real && t.purpose == partition::Purpose::ps_pull) {
      // A server's weights: the training keeps pulls on the host until the chunk adopts them.
      // The receive is awaited by polling first: a copy to pageable host memory would block
      // in CUDA until it lands, out of stop()'s reach.
      job.drain(comm);
      std::vector<float> host(bytes / sizeof(float));
      cuda(cudaMemcpyAsync(host.data(), buffer, bytes, cudaMemcpyDeviceToHost, job.lane.cuda), "cudaMemcpyAsync",
           job.where);
      job.drain(nullptr);
      DeviceTask device(job);
      if (job.s.training->receive(device, host)) {
        job.finish(comm, {});
        return;
      }
      cuda(cudaMemcpyAsync(buffer, host.data(), bytes, cudaMemcpyHostToDevice, job.lane.cuda), "cudaMemcpyAsync",
           job.where);  // (not taken: back where it was)
    }
    if (real && buffer == job.lane.staging) {
      // The message lands before the training cuts it (on the compute stream).
      job.drain(comm);
      DeviceTask device(job);
      if (job.s.training->receive(device, {static_cast<const float*>(buffer), bytes / sizeof(float)})) {
        follow_compute_stream(job);
        job.finish(comm, job.written());
        return;
      }
    }
    if (buffer == job.lane.staging && tensor >= 0) {
      job.copy_device(job.s.copy[static_cast<size_t>(tensor)], buffer, std::min(own, bytes));
    }
  }
  job.finish(comm, sending ? std::vector<std::pair<int, Buffer>>{} : job.written());
}

void run_collective(Job& job) {
  const partition::Task& t = *job.task.spec;
  const Plan& plan = *job.s.plan;
  const partition::Collective& c = plan.collectives[static_cast<size_t>(t.collective)];
  ncclComm_t* comm = job.rank();
  const auto rank = static_cast<size_t>(job.s.nccl_plan.rank_of_task[static_cast<size_t>(job.task.task)]);
  const size_t members = plan.members(c).size();
  size_t count = std::min(static_cast<size_t>(std::max(0.0, c.bytes)), job.s.cap) / sizeof(float);
  const size_t part = count / members;
  if (c.kind == partition::CollectiveKind::reduce_scatter || c.kind == partition::CollectiveKind::all_gather) {
    count = part * members;
  }
  auto* buffer = static_cast<float*>(job.lane.staging);
  const auto reads = plan.reads(job.task.task), writes = plan.writes(job.task.task);
  const int in = reads.empty() ? -1 : reads[0], out = writes.empty() ? in : writes[0];
  const size_t bytes = count * sizeof(float);
  cuda(cudaMemsetAsync(buffer, 0, bytes, job.lane.cuda), "cudaMemsetAsync", job.where);
  if (in >= 0) job.copy_device(buffer, job.s.copy[static_cast<size_t>(in)], std::min(bytes, job.s.copy_bytes[static_cast<size_t>(in)]));
  job.task.waiting_for("collective " + std::to_string(t.collective) + " (" + std::string(partition::to_string(c.kind)) +
                       ") on " + job.s.nccl_plan.groups[static_cast<size_t>(job.s.nccl_plan.group_of_task[static_cast<size_t>(job.task.task)])].what +
                       ": the other " + std::to_string(members - 1) + " member(s)");
  const cudaStream_t stream = job.lane.cuda;
  const int root = c.root;
  // Collective::messages: that many collectives one after another, each over its share of the
  // buffer (a chunk's per-layer tensor-parallel all-reduces), as the simulator times them. A
  // reduce-scatter's or all-gather's share is the i-th m-th of every member's part, which
  // NCCL cannot take in place: one call over the whole buffer leaves the same result (without
  // the m - 1 further latencies).
  const bool by_part = c.kind == partition::CollectiveKind::reduce_scatter || c.kind == partition::CollectiveKind::all_gather;
  const size_t slices =
      by_part ? 1 : std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(1, c.messages)), std::max<size_t>(1, part)));
  const size_t slice_part = part / slices;
  for (size_t i = 0; i < slices; ++i) {
    const size_t begin = i * count / slices, n = (i + 1) * count / slices - begin;
    float* const at = buffer + begin;
    float* const shared = buffer + i * slice_part * members;  // reduce-scatter and all-gather: parts of slice_part
    switch (c.kind) {
      case partition::CollectiveKind::all_reduce:
        job.issue(comm, "ncclAllReduce", [&](ncclComm_t h) { return ncclAllReduce(at, at, n, ncclFloat32, ncclSum, h, stream); });
        break;
      case partition::CollectiveKind::reduce_scatter:  // in place: member r's sum of part r lands in part r
        job.issue(comm, "ncclReduceScatter", [&](ncclComm_t h) {
          return ncclReduceScatter(shared, shared + rank * slice_part, slice_part, ncclFloat32, ncclSum, h, stream);
        });
        break;
      case partition::CollectiveKind::all_gather:  // in place: part r comes from member r's part r
        job.issue(comm, "ncclAllGather", [&](ncclComm_t h) {
          return ncclAllGather(shared + rank * slice_part, shared, slice_part, ncclFloat32, h, stream);
        });
        break;
      case partition::CollectiveKind::broadcast:
        job.issue(comm, "ncclBroadcast", [&](ncclComm_t h) { return ncclBroadcast(at, at, n, ncclFloat32, root, h, stream); });
        break;
      case partition::CollectiveKind::reduce:
        job.issue(comm, "ncclReduce", [&](ncclComm_t h) { return ncclReduce(at, at, n, ncclFloat32, ncclSum, root, h, stream); });
        break;
    }
  }
  std::vector<std::pair<int, Buffer>> result;
  if (out >= 0) {
    job.copy_device(job.s.copy[static_cast<size_t>(out)], buffer, std::min(bytes, job.s.copy_bytes[static_cast<size_t>(out)]));
    const Buffer& host = !job.task.writes.empty() ? job.task.writes[0] : job.task.reads[0];
    result.emplace_back(out, host);
  }
  job.finish(comm, result);
}

// The compute task this thread runs, for the tensor-parallel all-reduces inside it.
thread_local Job* current_compute = nullptr;

// A parameter server's update: it reads the pushes from the engine's host buffers (their
// receives put them there) and updates host arrays.
void run_server_update(Job& job) {
  job.s.training->compute(job.task, job.stop, nullptr);
  job.finish(nullptr, {});
}

void run_real_compute(Job& job, TensorParallelExchange* exchange) {
  if (job.task.spec->kind == TaskKind::optimizer && job.s.training->parameter_server()) {
    run_server_update(job);
    return;
  }
  DeviceTask device(job);
  current_compute = &job;
  try {
    job.s.training->compute(device, job.stop, exchange);
  } catch (...) {
    current_compute = nullptr;
    throw;
  }
  current_compute = nullptr;
  follow_compute_stream(job);
  job.finish(nullptr, job.written());
}

// A collective of the real math's tensors (tensor and sequence parallelism: the partial sums'
// all-reduce, a sequence all-gather or reduce-scatter), as the cpu back end runs it: a buffer
// of the larger of the read and written tensors, the read one at this member's piece when it
// is the smaller (an all-gather), the written one taken from its piece when that is (a
// reduce-scatter). NCCL's in-place forms need equal pieces (require_real_collectives).
void run_activation_collective(Job& job) {
  const partition::Task& t = *job.task.spec;
  const Plan& plan = *job.s.plan;
  const partition::Collective& c = plan.collectives[static_cast<size_t>(t.collective)];
  const auto reads = plan.reads(job.task.task), writes = plan.writes(job.task.task);
  const size_t in = job.s.copy_bytes[static_cast<size_t>(reads[0])];
  const int out_tensor = writes.empty() ? reads[0] : writes[0];
  const size_t out = job.s.copy_bytes[static_cast<size_t>(out_tensor)];
  const size_t count = std::max(in, out) / sizeof(float), members = plan.members(c).size();
  const auto me = static_cast<size_t>(job.s.nccl_plan.rank_of_task[static_cast<size_t>(job.task.task)]);
  const size_t part = count / members;
  auto* buffer = static_cast<float*>(job.lane.staging);
  const size_t at = in < out ? me * part : 0, out_at = out < in ? me * part : 0;
  follow_compute_stream(job);
  cuda(cudaMemsetAsync(buffer, 0, count * sizeof(float), job.lane.cuda), "cudaMemsetAsync", job.where);
  job.copy_device(buffer + at, job.s.copy[static_cast<size_t>(reads[0])], std::min(in, (count - at) * sizeof(float)));
  ncclComm_t* comm = job.rank();
  job.task.waiting_for("collective " + std::to_string(t.collective) + " (" + std::string(partition::to_string(c.kind)) +
                       " of " + std::to_string(count) + " activation floats): the other " + std::to_string(members - 1) +
                       " member(s)");
  const cudaStream_t stream = job.lane.cuda;
  const int root = c.root;
  switch (c.kind) {
    case partition::CollectiveKind::all_reduce:
      job.issue(comm, "ncclAllReduce",
                [&](ncclComm_t h) { return ncclAllReduce(buffer, buffer, count, ncclFloat32, ncclSum, h, stream); });
      break;
    case partition::CollectiveKind::reduce_scatter:
      job.issue(comm, "ncclReduceScatter", [&](ncclComm_t h) {
        return ncclReduceScatter(buffer, buffer + me * part, part, ncclFloat32, ncclSum, h, stream);
      });
      break;
    case partition::CollectiveKind::all_gather:
      job.issue(comm, "ncclAllGather",
                [&](ncclComm_t h) { return ncclAllGather(buffer + me * part, buffer, part, ncclFloat32, h, stream); });
      break;
    case partition::CollectiveKind::broadcast:
      job.issue(comm, "ncclBroadcast",
                [&](ncclComm_t h) { return ncclBroadcast(buffer, buffer, count, ncclFloat32, root, h, stream); });
      break;
    case partition::CollectiveKind::reduce:
      job.issue(comm, "ncclReduce",
                [&](ncclComm_t h) { return ncclReduce(buffer, buffer, count, ncclFloat32, ncclSum, root, h, stream); });
      break;
  }
  job.copy_device(job.s.copy[static_cast<size_t>(out_tensor)], buffer + out_at, std::min(out, (count - out_at) * sizeof(float)));
  const Buffer& host = !job.task.writes.empty() ? job.task.writes[0] : job.task.reads[0];
  const std::pair<int, Buffer> result[] = {{out_tensor, host}};
  job.finish(comm, result);
}

// A gradient collective of the real math: NCCL's all-reduce in place on the training's floats.
void run_real_collective(Job& job) {
  const partition::Task& t = *job.task.spec;
  const Plan& plan = *job.s.plan;
  const partition::Collective& c = plan.collectives[static_cast<size_t>(t.collective)];
  DeviceTask device(job);
  const std::span<float> data = job.s.training->collective_data(device);
  if (activation_collective(c)) {
    if (job.task.reads.empty()) {  // traffic the compute moves itself: nothing to move, on every member
      job.finish(nullptr, {});
      return;
    }
    run_activation_collective(job);
    return;
  }
  // (require_real_collectives refused any other kind of gradient collective.)
  follow_compute_stream(job);  // the gradients, and what collective_data gathered, are complete
  ncclComm_t* comm = job.rank();
  job.task.waiting_for("collective " + std::to_string(t.collective) + " (all-reduce of " + std::to_string(data.size()) +
                       " gradient floats): the other " + std::to_string(plan.members(c).size() - 1) + " member(s)");
  float* const at = data.data();
  const size_t n = data.size();
  const cudaStream_t stream = job.lane.cuda;
  job.issue(comm, "ncclAllReduce", [&](ncclComm_t h) { return ncclAllReduce(at, at, n, ncclFloat32, ncclSum, h, stream); });
  job.finish(comm, {});
  // Gathered floats go back on the compute stream; the task ends when they are there.
  job.s.training->collective_done(device);
  cuda(cudaEventRecord(job.lane.ops_done, job.gpu.ops->stream()), "cudaEventRecord", job.where);
  await(job.lane.ops_done, nullptr, job.stop, job.where);
}

}  // namespace

void CudaBackend::run(TaskContext& task) {
  if (stop_.load()) throw Stopped();
  if (!state_) throw Error("the cuda back end was asked to run a task before prepare()");
  State& s = *state_;
  const partition::Task& t = *task.spec;
  Gpu& gpu = s.gpus[static_cast<size_t>(t.device)];
  Job job{s, task, gpu, s.lane(t.device, t.stream),
          gpu.where + ", " + partition::describe_task(*s.plan, task.task) + ", iteration " + std::to_string(task.iteration),
          stop_, options_.copy_outputs_to_host};
  cuda(cudaSetDevice(gpu.ordinal), "cudaSetDevice", job.where);
  // Each task's launches are checked by the thread's last error: start it clean, whatever a
  // library's query left there. (A sticky fault is not lost: every later call returns it.)
  (void)cudaGetLastError();
  cuda(cudaEventRecord(job.lane.start, job.lane.cuda), "cudaEventRecord", job.where);
  switch (t.kind) {
    case TaskKind::forward:
    case TaskKind::backward:
    case TaskKind::backward_weight:
    case TaskKind::optimizer:
      if (s.training != nullptr) {
        run_real_compute(job, this);
      } else {
        run_compute(job, options_.flop_scale);
      }
      return;
    case TaskKind::send:
    case TaskKind::recv:
      run_transfer(job);
      return;
    case TaskKind::collective:
      if (s.training != nullptr) {
        run_real_collective(job);
      } else {
        run_collective(job);
      }
      return;
  }
}

// Megatron's collectives inside a tensor-parallel chunk's compute task: NCCL's, on the
// communicator's in-task group, on the compute stream where the chunk's kernels run (the
// decoder's next kernels follow it there). Awaited by polling, so a rank whose peers never
// come is stopped like any other NCCL wait.
namespace {

struct InTask {
  Job* job;
  ncclComm_t* comm;
  size_t rank, ranks;
};

InTask in_task(CudaBackend::State& s, TaskContext& task, int communicator, const char* what, size_t floats) {
  Job* job = current_compute;
  if (job == nullptr || job->task.task != task.task) {
    throw Error(std::string("a tensor-parallel ") + what + " outside its compute task (task " +
                std::to_string(task.task) + ")");
  }
  const auto group = s.nccl_plan.in_task_group.find(communicator);
  if (group == s.nccl_plan.in_task_group.end()) {
    throw PlanError("communicator " + std::to_string(communicator) + " has no NCCL group for collectives inside compute tasks");
  }
  const NcclGroup& g = s.nccl_plan.groups[static_cast<size_t>(group->second)];
  const auto rank = static_cast<size_t>(std::find(g.devices.begin(), g.devices.end(), task.spec->device) - g.devices.begin());
  if (rank == g.devices.size()) {
    throw PlanError("device " + std::to_string(task.spec->device) + " runs a " + what + " on " + g.what +
                    ", which it is not in");
  }
  ncclComm_t* comm = &s.comms[static_cast<size_t>(group->second)][rank];
  if (*comm == nullptr) throw Error("the NCCL communicator for " + job->where + " was aborted by an earlier failure");
  task.waiting_for(std::string("a tensor-parallel ") + what + " (" + std::to_string(floats) + " floats) on " + g.what);
  return {job, comm, rank, g.devices.size()};
}

// Issues `call` on the rank, then waits for the compute stream to pass it.
template <typename Call>
void in_task_run(const InTask& t, const char* name, Call call) {
  t.job->issue(t.comm, name, call);
  cuda(cudaEventRecord(t.job->lane.ops_done, t.job->gpu.ops->stream()), "cudaEventRecord", t.job->where);
  await(t.job->lane.ops_done, t.comm, t.job->stop, t.job->where);
}

// The parts' common size, or nullopt when they differ (or do not start at 0).
std::optional<size_t> equal_parts(std::span<const size_t> parts, size_t ranks, size_t floats) {
  if (parts.size() != ranks + 1 || parts.back() > floats) {
    throw Error("a tensor-parallel collective with " + std::to_string(parts.size()) + " offsets for " +
                std::to_string(ranks) + " ranks");
  }
  const size_t n = parts[1] - parts[0];
  for (size_t r = 0; r < ranks; ++r) {
    if (parts[r] > parts[r + 1]) throw Error("a tensor-parallel collective's offsets go backwards");
    if (parts[r + 1] - parts[r] != n) return std::nullopt;
  }
  return parts[0] == 0 ? std::optional<size_t>(n) : std::nullopt;
}

// Grouped per-root calls (one thread issues the whole group, as NCCL requires).
template <typename PerRoot>
ncclResult_t grouped(size_t ranks, PerRoot per_root) {
  if (const ncclResult_t started = ncclGroupStart(); started != ncclSuccess) return started;
  ncclResult_t first = ncclSuccess;
  for (size_t r = 0; r < ranks && (first == ncclSuccess || first == ncclInProgress); ++r) first = per_root(r);
  const ncclResult_t end = ncclGroupEnd();
  return first == ncclSuccess || first == ncclInProgress ? end : first;
}

}  // namespace

void CudaBackend::all_reduce(TaskContext& task, int communicator, std::span<float> data, bool max) {
  const InTask t = in_task(*state_, task, communicator, "all-reduce", data.size());
  const cudaStream_t stream = t.job->gpu.ops->stream();
  float* const at = data.data();
  const size_t n = data.size();
  in_task_run(t, "ncclAllReduce",
              [&](ncclComm_t h) { return ncclAllReduce(at, at, n, ncclFloat32, max ? ncclMax : ncclSum, h, stream); });
}

void CudaBackend::all_gather(TaskContext& task, int communicator, std::span<float> data, std::span<const size_t> parts) {
  const InTask t = in_task(*state_, task, communicator, "all-gather", data.size());
  const cudaStream_t stream = t.job->gpu.ops->stream();
  float* const at = data.data();
  if (const auto n = equal_parts(parts, t.ranks, data.size())) {
    in_task_run(t, "ncclAllGather",
                [&](ncclComm_t h) { return ncclAllGather(at + t.rank * *n, at, *n, ncclFloat32, h, stream); });
    return;
  }
  in_task_run(t, "ncclBroadcast (grouped)", [&](ncclComm_t h) {
    return grouped(t.ranks, [&](size_t r) {
      float* const part = at + parts[r];
      return ncclBroadcast(part, part, parts[r + 1] - parts[r], ncclFloat32, static_cast<int>(r), h, stream);
    });
  });
}

void CudaBackend::reduce_scatter(TaskContext& task, int communicator, std::span<float> data,
                                 std::span<const size_t> parts) {
  const InTask t = in_task(*state_, task, communicator, "reduce-scatter", data.size());
  const cudaStream_t stream = t.job->gpu.ops->stream();
  float* const at = data.data();
  if (const auto n = equal_parts(parts, t.ranks, data.size())) {
    in_task_run(t, "ncclReduceScatter", [&](ncclComm_t h) {
      return ncclReduceScatter(at, at + t.rank * *n, *n, ncclFloat32, ncclSum, h, stream);
    });
    return;
  }
  in_task_run(t, "ncclReduce (grouped)", [&](ncclComm_t h) {
    return grouped(t.ranks, [&](size_t r) {
      float* const part = at + parts[r];
      return ncclReduce(part, part, parts[r + 1] - parts[r], ncclFloat32, ncclSum, static_cast<int>(r), h, stream);
    });
  });
}

// --- probes: no plan, no engine ---

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
