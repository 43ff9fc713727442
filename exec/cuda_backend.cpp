// How the CUDA back end works (what it promises: cuda_backend.hpp). prepare() makes every
// object a run needs, per plan device: its GPU's proxy GEMM inputs, the pattern table and one
// arena holding the tensors' device copies; per device stream (a "lane": what one engine
// thread uses) a non-blocking CUDA stream, a cuBLAS handle with its own workspace, the GEMM
// output, a staging buffer and events; then one NCCL communicator per group of
// exec/cuda_plan.hpp, each connected by one small operation as it is made (warm_up). It runs
// each GEMM shape the proxy uses once, so that no kernel is loaded
// for the first time while NCCL kernels wait on the device (lazy loading may synchronize it).
// run() (cuda_backend_run.cpp) enqueues a task's work between two timing events and polls
// until it is done. This file: the checked calls the back end's files share, and prepare().
#include "exec/cuda_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "exec/copy_reuse.hpp"
#include "exec/cuda_backend_state.hpp"
#include "exec/group_setup.hpp"
#include "exec/ranks.hpp"
#include "kernels/cast.hpp"
#include "kernels/transformer_cuda.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

using namespace cuda_detail;  // the back end's own helpers (cuda_backend_state.hpp)

namespace {

// CUDA's lazy module loading loads a kernel's module at its first launch and waits for the
// device's queue to drain first; with an NCCL kernel spinning on a peer that waits for this
// GPU's work, it never drains. So modules load eagerly (unless the user chose otherwise),
// set before any CUDA call of the process. (In this file, which every use of the back end or
// its probes links: they call the checked calls below.)
const bool kEagerModules = [] { return ::setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0; }();

// NCCL (2.22 on) connects a communicator's collective algorithms at their first use, not when
// it is made; mid-run, beside another communicator's spinning kernel, that can wait for ever
// (warm_up). All connected when made instead, unless the user chose otherwise: more memory
// per communicator at set-up, no connection while tasks run.
const bool kConnectAtInit = [] { return ::setenv("NCCL_RUNTIME_CONNECT", "0", 0) == 0; }();

}  // namespace

namespace cuda_detail {

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
void nccl(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm) {
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
            Clock::time_point deadline) {
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
void await(cudaEvent_t event, ncclComm_t* comm, const std::atomic<bool>& stop, const std::string& where,
           Clock::time_point deadline) {
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
    if (Clock::now() > deadline) {
      abort_rank(comm);
      failed("an NCCL operation", "not done after " + std::to_string(static_cast<int>(kInitTimeoutS)) + " s", where);
    }
    pause(polls);
  }
}

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

// The GEMM of `rows` on a lane: C[1024 x rows] = A[1024 x 1024] B[1024 x rows], column-major.
void gemm(const GpuLane& lane, const Gpu& gpu, model::Precision p, int rows, const std::string& where) {
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = gemm_types(p).data;
  blas(cublas::gemm_ex(lane.blas, CUBLAS_OP_N, CUBLAS_OP_N, kProxyN, rows, kProxyN, &alpha, gpu.a, type, kProxyN, gpu.b,
                       type, kProxyN, &beta, lane.c, type, kProxyN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx", where);
}

}  // namespace cuda_detail

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
  if (!state_) return;
  state_->abort_comms();  // an NCCL kernel left waiting for a stopped peer ends: place_home waits for the streams
  if (options_.training == nullptr) return;
  try {
    options_.training->place_home();
  } catch (...) {  // a destructor must not throw; the GPU failed already
  }
}

namespace {

// A lane's stream, events and staging buffer; for proxies also its cuBLAS handle, workspace and
// GEMM output, every GEMM shape run once (real math runs its own kernels, not these).
void make_lane(GpuLane& lane, const Gpu& gpu, model::Precision p, size_t staging, bool proxy, const std::string& where) {
  cuda(cudaStreamCreateWithFlags(&lane.cuda, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", where);
  for (cudaEvent_t* e : {&lane.start, &lane.end, &lane.message}) cuda(cudaEventCreate(e), "cudaEventCreate", where);
  for (cudaEvent_t& e : lane.group) cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", where);
  cuda(cudaEventCreateWithFlags(&lane.ops_done, cudaEventDisableTiming), "cudaEventCreateWithFlags", where);
  lane.staging = device_alloc(staging, "the staging buffer", where);
  cuda(cudaMemsetAsync(lane.staging, 0, staging, lane.cuda), "cudaMemsetAsync", where);
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
  cuda(cudaMemcpyAsync(lane.staging, gpu.pattern, std::min<size_t>(staging, 4), cudaMemcpyDeviceToDevice, lane.cuda),
       "cudaMemcpyAsync", where);
  cuda(cudaStreamSynchronize(lane.cuda), "cudaStreamSynchronize (warm-up)", where);
}

// What a lane's staging buffer must hold: the largest message or collective buffer of the
// tasks on its stream (run_transfer, run_collective, run_activation_collective), and one
// float at least (warm_up's). Per lane: a parameter server's whole-model messages would
// otherwise be every lane's.
size_t staging_bytes(const CudaBackend::State& s, const partition::StreamProgram& program) {
  const Plan& plan = *s.plan;
  const auto capped = [&](double bytes) { return std::min(static_cast<size_t>(std::max(0.0, bytes)), s.cap); };
  size_t most = sizeof(float);
  for (const int t : program.tasks) {
    const partition::Task& task = plan.task(t);
    size_t bytes = 0;
    if (task.kind == TaskKind::send || task.kind == TaskKind::recv) {
      bytes = s.training != nullptr ? s.send_bytes[static_cast<size_t>(task.channel)] : capped(task.bytes);
    } else if (task.kind == TaskKind::collective) {
      const partition::Collective& c = plan.collectives[static_cast<size_t>(task.collective)];
      const auto reads = plan.reads(t), writes = plan.writes(t);
      if (s.training == nullptr) {
        bytes = capped(c.bytes);
      } else if (activation_collective(c) && !reads.empty()) {  // (gradients are reduced in place)
        bytes = std::max(s.copy_bytes[static_cast<size_t>(reads[0])],
                         s.copy_bytes[static_cast<size_t>(writes.empty() ? reads[0] : writes[0])]);
      }
    }
    if (s.training == nullptr) {  // a proxy's in-task messages (run_compute)
      for (const partition::InTaskCall& call : plan.inside(t)) {
        const partition::Collective& c = plan.collective(call.collective);
        bytes = std::max(bytes, capped(c.bytes / std::max(1, c.messages)));
      }
    }
    most = std::max(most, bytes);
  }
  return most;
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
        make_lane(gpu.lanes.back(), gpu, s.precision, staging_bytes(s, program), false, gpu.where + ", stream " + plan.stream_name(program.stream));
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
    make_lane(gpu.lanes.back(), gpu, s.precision, staging_bytes(s, program), true, gpu.where + ", stream " + plan.stream_name(program.stream));
  }
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (set-up)", gpu.where);  // as above
}

// One small operation on each of this process's ranks of group `g`, from this thread in one
// NCCL group call, waited for: NCCL connects peers at their first operation (send/receive
// pairs always; collectives with NCCL_RUNTIME_CONNECT, see kConnectAtInit), which allocates
// and copies on the GPU, and doing so mid-run, while another communicator's kernel spins on
// this GPU waiting for a peer, can wait for that kernel for ever (NCCL's "Using multiple NCCL
// communicators concurrently"). Here, group by group in one order in every process, nothing
// else runs; a connection that fails is reported before the run. A channel's source sends
// one float to its destination; any other group all-reduces one float. On a failure the
// caller aborts every rank (the others' operations may wait for the failed one's).
void warm_up(CudaBackend::State& s, size_t g, const std::vector<size_t>& here, const std::atomic<bool>& stop) {
  const NcclGroup& group = s.nccl_plan.groups[g];
  const std::string where = "the NCCL communicator of " + group.what + " (its first operation)";
  std::vector<ncclComm_t>& ranks = s.comms[g];
  std::vector<GpuLane*> lanes;
  for (const size_t r : here) {
    Gpu& gpu = s.gpus[static_cast<size_t>(group.devices[r])];
    if (gpu.lanes.empty()) throw Error(where + ": " + gpu.where + " runs no stream");
    lanes.push_back(&gpu.lanes.front());
  }
  nccl(ncclGroupStart(), "ncclGroupStart", where);
  for (size_t i = 0; i < here.size(); ++i) {
    const size_t r = here[i];
    const Gpu& gpu = s.gpus[static_cast<size_t>(group.devices[r])];
    auto* one = static_cast<float*>(lanes[i]->staging);
    const cudaStream_t stream = lanes[i]->cuda;
    const cudaError_t set = cudaSetDevice(gpu.ordinal);
    ncclResult_t called = ncclSuccess;
    if (set == cudaSuccess) {
      called = group.channel ? (r == 0 ? ncclSend(one, 1, ncclFloat32, 1, ranks[r], stream)
                                       : ncclRecv(one, 1, ncclFloat32, 0, ranks[r], stream))
                             : ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, ranks[r], stream);
    }
    if (set != cudaSuccess || (called != ncclSuccess && called != ncclInProgress)) {
      ncclGroupEnd();
      cuda(set, "cudaSetDevice", gpu.where);
      nccl(called, group.channel ? "ncclSend/ncclRecv" : "ncclAllReduce", where + ", rank " + std::to_string(r), ranks[r]);
    }
  }
  nccl(ncclGroupEnd(), "ncclGroupEnd", where);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kInitTimeoutS));
  for (size_t i = 0; i < here.size(); ++i) {
    const size_t r = here[i];
    settle(&ranks[r], stop, "the first operation", where + ", rank " + std::to_string(r), deadline);
    cuda(cudaEventRecord(lanes[i]->end, lanes[i]->cuda), "cudaEventRecord", where);
    await(lanes[i]->end, &ranks[r], stop, where + ", rank " + std::to_string(r), deadline);
  }
}

// This process's ranks of group `g`, from the group's unique id, all from this thread: inside
// ncclGroupStart/End, or the first rank's creation would wait for the others for ever.
// Non-blocking, so each rank is then polled (by a deadline: a peer process that failed never
// comes); then warmed up (warm_up).
void make_comm(CudaBackend::State& s, size_t g, std::span<const std::byte> id_bytes, const std::atomic<bool>& stop) {
  const CudaPlan& p = s.nccl_plan;
  const NcclGroup& group = p.groups[g];
  const std::string where = "the NCCL communicator of " + group.what;
  std::vector<ncclComm_t>& ranks = s.comms[g];
  ranks.assign(group.devices.size(), nullptr);
  std::vector<size_t> here;
  for (size_t r = 0; r < group.devices.size(); ++r) {
    if (p.local(group.devices[r])) here.push_back(r);
  }
  ncclUniqueId id{};
  if (id_bytes.size() != sizeof id) {
    throw Error(where + ": an NCCL unique id of " + std::to_string(id_bytes.size()) + " bytes, not " +
                std::to_string(sizeof id));
  }
  std::memcpy(&id, id_bytes.data(), sizeof id);
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
  warm_up(s, g, here, stop);
}

// The plan's faults under real math, found before any GPU's.
void require_cuda_real_math(const Plan& plan, const Training& training) {
  if (const int head = training.shape().HS; head > kernels::kMaxCudaHeadSize) {
    throw PlanError("the network's heads are " + std::to_string(head) + " wide; the CUDA attention kernels take up to " +
                    std::to_string(kernels::kMaxCudaHeadSize) + " (the cpu back end takes any)");
  }
  if (training.shape().moe.E > 0 && training.tensor_parallel()) {
    throw PlanError("a mixture of experts over tensor-parallel ranks is trained by the cpu back end's real math only "
                    "(the CUDA path has not run on a GPU): run it with --backend cpu, or --compute proxy");
  }
  require_no_copy_reuse_hazards(
      plan, [&](int tensor) { return one_device_copy_under_real_math(plan, tensor); }, "the CUDA back end's real math");
  require_real_collectives(plan, [&](int tensor) { return training.buffer_bytes(tensor); });
}

// This process's place under mpirun: it runs its block of the plan's devices on its node's
// GPUs, after those of the node's lower ranks (alone: no processes, no owners, GPU 0).
struct Placement {
  const Ranks* processes = nullptr;  // null when this process runs the whole plan
  std::vector<int> owner, all;       // per plan device, its process; every process
  int process = 0, first = 0;        // this process, and its first GPU ordinal
};

Placement place_processes(const Ranks* ranks, int devices, const std::atomic<bool>& stop) {
  Placement p;
  p.processes = ranks != nullptr && !ranks->alone() ? ranks : nullptr;
  if (p.processes == nullptr) return p;
  const Ranks& processes = *p.processes;
  processes.check_devices(devices);
  p.owner = device_owners(devices, processes.size(), [&](int d) { return processes.owner(d, devices); });
  p.process = processes.rank();
  for (int r = 0; r < processes.size(); ++r) p.all.push_back(r);
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "rank-%d", p.process);
  // Processes share GPUs where they share a host and see the same ones: a launcher that
  // gives each its own (CUDA_VISIBLE_DEVICES per process) makes each start at GPU 0.
  const char* listed = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string sees = std::string(host) + "\n" + (listed != nullptr ? listed : "");
  std::vector<std::string> hosts;
  for (const auto& bytes : processes.exchange(p.all, std::as_bytes(std::span<const char>(sees.data(), sees.size())), stop)) {
    hosts.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  p.first = first_gpus(hosts, p.owner)[static_cast<size_t>(p.process)];
  return p;
}

// The bytes of each tensor's copy and of each channel's messages.
void size_messages(CudaBackend::State& s, const Plan& plan) {
  s.copy.assign(plan.tensors.size(), nullptr);
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    // Real math: what the training exchanges, whole; a proxy: the plan's bytes, capped.
    s.copy_bytes.push_back(s.training != nullptr ? s.training->buffer_bytes(static_cast<int>(t))
                                                 : std::min(static_cast<size_t>(std::max(0.0, plan.tensors[t].bytes)), s.cap));
  }
  s.send_bytes.assign(plan.channels.size(), 0);
  if (s.training == nullptr) return;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    const auto reads = plan.reads(static_cast<int>(t));
    if (task.kind != TaskKind::send) continue;
    // A parameter server's push or pull carries the model's floats; the rest, the tensor.
    size_t bytes = reads.empty() ? 0 : s.copy_bytes[static_cast<size_t>(reads[0])];
    if (const auto floats = s.training->message_floats(static_cast<int>(t))) bytes = *floats * sizeof(float);
    size_t& channel_bytes = s.send_bytes[static_cast<size_t>(task.channel)];
    if (channel_bytes != 0 && channel_bytes != bytes) {
      // An NCCL receive must know its size; one per channel keeps the k-th send and receive paired.
      throw PlanError("channel " + std::to_string(task.channel) + " carries messages of " + std::to_string(channel_bytes) +
                      " and " + std::to_string(bytes) + " bytes; real math on the cuda back end needs one size a channel");
    }
    channel_bytes = bytes;
  }
}

// What can fail in one process alone (its GPUs, its memory) fails in all of them together:
// the others would otherwise wait for its communicators for ever. `failed`: "" if it did not.
void fail_together(const Placement& p, const std::string& failed, std::exception_ptr mine, const std::atomic<bool>& stop) {
  const auto verdicts = p.processes->exchange(p.all, std::as_bytes(std::span<const char>(failed.data(), failed.size())), stop);
  if (mine) std::rethrow_exception(mine);
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r].empty()) continue;
    throw Error("rank " + std::to_string(r) + " could not prepare its GPUs: " +
                std::string(reinterpret_cast<const char*>(verdicts[r].data()), verdicts[r].size()));
  }
}

// Communicators, each group in one order in every process (exec/group_setup.hpp): under
// mpirun the process of a group's first member makes its unique id and sends it to the
// group's others, and a failure in one process reaches them all.
void make_comms(CudaBackend::State& s, const Placement& p, const std::atomic<bool>& stop) {
  s.comms.resize(s.nccl_plan.groups.size());
  GroupSetup setup;
  setup.groups = s.nccl_plan.groups.size();
  setup.processes = [&](size_t g) { return s.nccl_plan.processes(g); };
  setup.id_maker = [&](size_t g) { return s.nccl_plan.id_maker(g); };
  setup.what = [&](size_t g) { return "the NCCL communicator of " + s.nccl_plan.groups[g].what; };
  setup.make_id = [&](size_t g) {
    ncclUniqueId id{};
    nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", setup.what(g));
    const auto bytes = std::as_bytes(std::span<const ncclUniqueId>(&id, 1));
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  };
  setup.create = [&](size_t g, std::span<const std::byte> id) { make_comm(s, g, id, stop); };
  try {
    set_up_groups(setup, p.process, p.processes, stop);
  } catch (...) {
    // Before the caller brings the training's arrays home (a cudaFree waits for the device):
    // a rank's operation may still wait for one that failed.
    s.abort_comms();
    throw;
  }
}

}  // namespace

void CudaBackend::prepare(const Plan& plan) {
  // The training's arrays come home before the GPUs' objects they live in go.
  if (state_) state_->abort_comms();  // as ~CudaBackend
  if (state_ && options_.training != nullptr) options_.training->place_home();
  state_.reset();  // the previous run's objects go first
  stop_.store(false);
  require_cuda_layout(plan);
  if (options_.training != nullptr) require_cuda_real_math(plan, *options_.training);  // before any GPU's faults
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
  const int devices = plan.device_count();
  const Placement placement = place_processes(options_.ranks, devices, stop_);
  std::string failed;
  std::exception_ptr mine;
  try {
    std::vector<int> gpus = gpu_ordinals(devices, visible, options_.gpus, counted != cudaSuccess ? cudaGetErrorString(counted) : "",
                                         placement.owner, placement.process, placement.first);
    s->nccl_plan = cuda_plan(plan, std::move(gpus), placement.owner, placement.process,
                             in_task_communicators(plan, s->training != nullptr && s->training->tensor_parallel()));
    s->precision = plan.layout.precision;
    s->cap = static_cast<size_t>(options_.max_message_bytes) / sizeof(float) * sizeof(float);
    size_messages(*s, plan);
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
    if (placement.processes == nullptr) throw;
    failed = e.what();
    mine = std::current_exception();
  }
  if (placement.processes != nullptr) fail_together(placement, failed, mine, stop_);
  make_comms(*s, placement, stop_);
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

}  // namespace hetflow::exec
