#pragma once
// The CUDA/NCCL back end: every plan device of this process is a local GPU, driven by the
// engine's threads (one per device stream). Compute is the model's real training math when a
// Training is given (below), a FLOP-matched proxy otherwise; transfers and collectives
// are real NCCL operations on device memory. Traces and output say "real" or "proxy".
// Includable and linkable without CUDA: where nvcc, cuBLAS or NCCL was not found at configure
// time, cuda_backend_built() is false and prepare() says so.
//
// Real training (options.training): prepare() moves each device's chunks (parameters,
// gradients, Adam moments) into its GPU's memory (Training::place) on a CudaDecoderOps
// whose stream is the device's compute stream (the one that runs its forward tasks); a bf16
// plan's linear layers multiply bf16 operands with fp32 accumulation, an fp16 plan's fp16
// operands when its loss is scaled (OptimizerOptions::loss_scale; fp32 ones otherwise),
// everything else is fp32. It sizes
// every tensor's device copy as the training says (whole FP32 boundary activations, nothing
// for what the training keeps itself), and then:
//  - compute tasks run Training::compute on the device copies of their tensors; a task on
//    another stream than the compute stream makes its stream wait for the compute stream's
//    work before its end event;
//  - send/recv move the whole tensor;
//  - gradient collectives are NCCL all-reduces in place on the floats collective_data()
//    gives (device memory), after the compute stream's work before them.
// Tensor parallelism: the collectives inside a compute task (all-reduces; all-gathers and
// reduce-scatters under sequence parallelism) are NCCL's on the chunk's
// communicator, in a group of the members' compute streams (exec/cuda_plan.hpp), enqueued on
// the compute stream and awaited by polling; the plan's collectives of activations (a
// forward's partial sums all-reduced or reduce-scattered into shards, the all-gather of 1/t
// slices) run in a staging buffer as the cpu back end runs them, and those without tensors
// (the traffic the compute moves itself) move nothing; a boundary the plan sends in 1/t
// slices leaves as the receiving rank's slice (the training's message()). Parameter servers and
// WSP: servers keep host arrays (Training), so a push or pull is the training's host
// floats through the staging buffer (their sizes known in prepare(), message_floats()), a
// pull lands on the host, a received push goes to the engine's host buffer of its instance
// at once (the device copy may take the next iteration's push before the update reads this
// one), and a server's update runs on the host. Compute does not see stop() until the task's
// kernels are enqueued and its host waits (a loss, a norm) are done. The back end must outlive the training's last
// use (weights(), collect_at_root()) in a run: its GPUs' ops are the back end's. A second
// prepare(), a failed one and the destructor move the training's arrays back to the CPU.
//
// What it promises, per task kind:
//  - compute (forward, backward, backward_weight, optimizer): cublasGemmEx calls in the plan's
//    precision (BF16 or FP16 inputs with FP32 accumulation, or FP32) adding up to the task's
//    FLOPs times flop_scale (rounded up to a multiple of 64 rows of 2·1024·1024 FLOPs), issued in
//    groups so that stop() is seen within a few milliseconds; then the CPU proxy's pattern
//    (exec/cpu_backend.hpp: value (31·task + 7·iteration + i) mod 97 + 1 at float i) written
//    into the device copy of each transient tensor the task writes (persistent ones are left
//    alone, as the CPU proxy leaves them: another iteration's transfer may be reading them).
//  - send/recv: ncclSend/ncclRecv of the task's bytes (capped at max_message_bytes) from and
//    into the device copies of the tensors the task reads and writes, on the channel's own
//    communicator (exec/cuda_plan.hpp says why one per channel).
//  - collective: the plan's kind (all-reduce, reduce-scatter, all-gather, broadcast, reduce) as
//    NCCL's collective, in place on a float buffer of the collective's bytes (capped) that
//    starts as the tensor the task reads; the result goes to the tensor it writes (or back
//    into the one it reads). As in the CPU back end, a reduce-scatter leaves member i's sum in
//    part i and an all-gather takes part i from member i; parts are floor(floats / members)
//    floats and the rest is left out (the CPU back end's parts differ by a float instead), so
//    proxy bytes agree between the back ends where the members divide the floats, but for a
//    hierarchical reduce-scatter or all-gather (whose steps deal the parts by node on the CPU)
//    and a reduce's members other than its root (NCCL leaves them their input, the CPU's chain
//    its partial sums). NCCL picks its own algorithm; the plan's (ring, tree, hierarchical) is
//    the simulator's model of it.
// Device memory: each tensor has one device copy of min(its bytes, max_message_bytes), made in
// prepare() and kept for the run (buffer_bytes() gives the engine the same size for its host
// buffers). A transient tensor's copy serves every iteration, so where a plan lets iteration
// i + 1 write a tensor before iteration i's last reader is done (WSP staleness), proxy bytes
// may mix; timing does not depend on them. The proxies allocate nothing while tasks run (a
// cudaMalloc can wait for every kernel of the device, NCCL's included); the real math's
// arrays come from its ops' pool, which calls cudaMalloc only for a size it has not yet
// seen free (the first iteration's).
// Host buffers stay as the engine made them unless copy_outputs_to_host, which copies every
// written tensor's device bytes into its host buffer when the task ends (tests check them).
//
// Timing: CUDA events around each task instance's GPU work on its stream; gpu_time_s() gives
// what they measured. The engine's wall-clock trace is unchanged. A transfer's GPU time
// includes the wait for its peer, as NCCL kernels wait on the device.
//
// Threads and NCCL (its rules: one thread at a time per communicator, the same order on every
// member): communicators are created once, in prepare(), non-blocking (ncclConfig_t blocking
// = 0), all ranks of each from the preparing thread inside ncclGroupStart/End (one thread
// creating several ranks must group them, or the first waits for the others for ever). After
// that a rank is only touched by the one engine thread that runs its tasks (exec/cuda_plan.hpp
// shows why that is one thread), and NCCL calls on one GPU are issued under that GPU's mutex
// (NCCL does not allow issuing on two communicators of one device from two threads at once).
// A task never needs its partner in the same group call: each task is one side of one
// transfer and its own thread issues it, so a send and its receive are issued by different
// threads and cannot deadlock each other.
//
// Stopping: no thread blocks in CUDA or NCCL. After enqueuing, run() polls cudaEventQuery and
// ncclCommGetAsyncError (and, non-blocking, waits for ncclInProgress to clear the same way);
// stop() only sets a flag, and the polling thread then calls ncclCommAbort on the rank it
// drives (which ends its NCCL kernel even when the peer never comes) and throws Stopped.
// Not under the GPU's mutex: an abort waits for the GPU's other kernels, which only the
// other threads' own aborts may end.
// Communicators that no thread was using are aborted when the back end is prepared again or
// destroyed. After a stop, prepare() must run again before run().
//
// Set-up (prepare()): each GPU's default memory pool keeps what stream-ordered frees give
// back (its release threshold raised; put back and trimmed when the run's objects go), so the real math's
// scratch is not unmapped and mapped again at every synchronisation; the real math's linear
// layers run once on a few zeros, so that cuBLAS loads and makes its handle outside any task;
// and the device is synchronised, since the legacy stream that set-up copies use does not
// order the lanes' non-blocking streams.
//
// Errors: every failing CUDA, cuBLAS or NCCL call becomes a hetflow::Error naming the call,
// the GPU (and plan device) and the task instance; a kernel's or cuBLAS's failure inside the
// real math names the CUDA or cuBLAS error (cudaErrorIllegalAddress: ...). prepare() throws
// PlanError, before touching a GPU, for the real math's collectives NCCL cannot run
// (require_real_collectives in exec/cuda_plan.hpp), Error "no CUDA device
// visible ..." without a GPU and PlanError when the plan has more devices than visible GPUs.
//
// Processes: under mpirun (options.ranks, several of them) each process runs its block of the
// plan's devices (Ranks::owner) on its node's visible GPUs after those of the node's lower
// ranks that see the same GPUs (processes name their hosts and CUDA_VISIBLE_DEVICES to each
// other: a launcher showing each process only its own makes each start at GPU 0), and
// creates only their ranks of each communicator; the process of a communicator's first
// member makes its NCCL unique id and sends it to the others over MPI (exec/cuda_plan.hpp,
// exec/group_setup.hpp). Transfers and collectives between processes are then NCCL's own;
// the engine runs this process's devices. What fails in one process before or while the
// communicators are made (too few GPUs, memory, NCCL) is told to all, and every process
// throws: none waits for a communicator that will never come.
//
// Every communicator runs one small operation as soon as it is made (a channel's one-float
// send, a group's one-float all-reduce), and NCCL_RUNTIME_CONNECT=0 is set (unless set)
// before any NCCL call: NCCL connects peers at their first operation otherwise, which, done
// mid-run beside another communicator's spinning kernel, can wait for that kernel for ever.
//
// Modules load eagerly: this file sets CUDA_MODULE_LOADING=EAGER (unless set) before any
// CUDA call, since lazy loading waits for the device's queue to drain at a kernel's first
// launch, which a spinning NCCL kernel can prevent for ever.
//
// Each tensor has one device copy for every iteration (a parameter server's pushes and pulls
// aside: real math hands those to the host), so a plan that let iteration i + 1 write a
// tensor before iteration i's readers are done with it (a worker running ahead) would
// overwrite real activations: prepare() refuses such a plan under real math with PlanError
// naming the tensor, the writer and the reader (exec/copy_reuse.hpp; the plans the project
// makes have none, tested).
//
// Known limits of this increment: NCCL kernels of
// different communicators may run at once on one GPU (pipeline and data-parallel traffic on
// their own streams, as frameworks do), which NCCL documents as working only while they fit
// on the GPU together. Nothing here has run on a GPU yet.
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/backend.hpp"
#include "exec/training.hpp"
#include "model/precision.hpp"

namespace hetflow::exec {

class Ranks;

struct CudaBackendOptions {
  double flop_scale = 1;                         // compute runs flops x flop_scale
  double max_message_bytes = 4.0 * 1024 * 1024;  // device bytes per tensor, transfer and collective at most
  std::vector<int> gpus;                         // plan device d runs on GPU gpus[d]; empty: on GPU d
  bool copy_outputs_to_host = false;             // written tensors' device bytes to the engine's host buffers
  const Ranks* ranks = nullptr;                  // under mpirun: this process runs its block of the devices
  Training* training = nullptr;               // real math (see above); null: proxies
};

// True when this build has the CUDA back end (nvcc, cuBLAS and NCCL found at configure time).
bool cuda_backend_built();

class CudaBackend final : public Backend, public TensorParallelExchange {
 public:
  explicit CudaBackend(CudaBackendOptions options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  std::string compute() const override { return options_.training != nullptr ? "real" : "proxy"; }
  void prepare(const partition::Plan& plan) override;
  std::optional<size_t> buffer_bytes(int tensor) const override;
  // Real math: the most bytes of the GPU ops' arrays alive at once since prepare() (the
  // arrays' blocks, rounded as the pool rounds them; not what the pool keeps free).
  std::optional<double> model_peak_bytes(int device) const override;
  void run(TaskContext& task) override;
  void stop() override;
  // Real math's collectives inside a tensor-parallel compute task (see above): NCCL's
  // all-reduce; all-gather and reduce-scatter in place when the parts are equal, otherwise
  // grouped broadcasts or reduces, one per rank's part (NCCL's way to vary the sizes).
  void all_reduce(TaskContext& task, int communicator, std::span<float> data, bool max) override;
  void all_gather(TaskContext& task, int communicator, std::span<float> data, std::span<const size_t> parts) override;
  void reduce_scatter(TaskContext& task, int communicator, std::span<float> data,
                      std::span<const size_t> parts) override;

  // Seconds between the CUDA events around the task instance's GPU work; nullopt when it has
  // not completed. Thread-safe.
  std::optional<double> gpu_time_s(int task, int iteration) const;

  struct State;  // CUDA, cuBLAS and NCCL objects: cuda_backend_state.hpp

 private:
  CudaBackendOptions options_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<State> state_;
};

// What a GPU does, for tools/gpu-check.sh (via hetflow-gpu-probe): no plan, no engine.
struct GemmProbe {
  std::string gpu;           // the device's name
  int n = 0;                 // n x n x n multiplies
  double seconds = 0;        // per multiply, the median of the timed ones
  double flops_per_s = 0;    // 2 n^3 / seconds
};
// Times cublasGemmEx n x n x n in `precision` (FP32 accumulation) on GPU `gpu`: `repeats`
// multiplies after a warm-up, CUDA events around each. Throws Error when it cannot.
GemmProbe probe_gemm(int gpu, model::Precision precision, int n = 4096, int repeats = 20);

struct AllReduceProbe {
  int gpus = 0;
  double bytes = 0;           // per GPU
  double seconds = 0;         // per all-reduce: the mean of the timed ones (host clock, as nccl-tests)
  double algbw_bytes_per_s = 0;  // bytes / seconds
  double busbw_bytes_per_s = 0;  // algbw x 2 (n - 1) / n (nccl-tests' bus bandwidth)
};
// Times ncclAllReduce of `bytes` (floats, sum, in place) over GPUs 0..gpus-1 on one
// communicator (ncclCommInitAll), `repeats` after 5 warm-up ones. Throws Error when it cannot.
AllReduceProbe probe_all_reduce(int gpus, double bytes, int repeats = 20);

}  // namespace hetflow::exec
