#pragma once
// The CPU back end: every device of the plan is a set of threads in this process (the
// engine's, one per device stream). What it does per task kind:
//  - compute (forward, backward, backward_weight, optimizer): the model's real math when a
//    Training is given (exec/training.hpp); otherwise a FLOP-matched proxy, not the
//    model's math: cblas_sgemm calls (OpenBLAS, one thread each) adding up to the task's FLOPs
//    times flop_scale, then a deterministic pattern written into the task's transient output
//    tensors (not the persistent ones, which another iteration's transfer may be reading).
//    Traces and output label it "proxy".
//  - send/recv: the plan's channel as an in-process FIFO; the k-th send meets the k-th
//    receive; the bytes (the sent tensor's, up to max_message_bytes) are copied into the
//    received tensor. A send returns when its receive has taken the bytes.
//  - Under mpirun (`ranks` given, several of them), this process runs only its rank's
//    devices (the engine decides, exec/ranks.hpp says which); a channel or collective lane
//    between devices of two ranks is an MPI lane with the same promises, tagged by its
//    place in a table every rank builds alike from the plan. Same bytes, same order of sums:
//    ranks give the bits threads give.
//  - load (partition/loading.hpp): the host's data loader on the device's load stream. Under
//    real math it reads the micro-batch's tokens (Training::load_micro_batch), which the forwards of that
//    micro-batch then take; a proxy has no data to read. With a loader throttle
//    (exec/loader_throttle.hpp) the load then waits for its node's throttled loader.
//  - collective: partition::collective_steps on the plan's communicator, each message a
//    real copy of its part of a float buffer (reductions add in a fixed order, so runs are
//    bitwise reproducible). Each member's buffer is min(bytes, max_message_bytes) long and
//    starts as the tensor the task reads; the result goes to the tensor it writes (or back
//    into the one it reads).
// One run per instance at a time; prepare() readies it for the next.
#include <atomic>
#include <functional>
#include <string>
#include <map>
#include <mutex>
#include <memory>
#include <tuple>
#include <vector>

#include "exec/backend.hpp"
#include "exec/loader_throttle.hpp"
#include "exec/mailbox.hpp"
#include "exec/ranks.hpp"
#include "exec/training.hpp"

namespace hetflow::exec {

struct CpuBackendOptions {
  double flop_scale = 1;                        // compute runs flops x flop_scale
  double max_message_bytes = 4.0 * 1024 * 1024;  // bytes a transfer or collective buffer moves at most
  double loader_throttle_s_per_sample = 0;        // a node's loader spends this on each sample (0: no throttle)
};

class CpuBackend final : public Backend, public TensorParallelExchange {
 public:
  // With `training`, compute tasks run the model's real math (exec/training.hpp), transfers
  // carry whole FP32 activations and gradient collectives reduce the model's gradients;
  // without, compute tasks are proxies.
  explicit CpuBackend(CpuBackendOptions options = {}, Training* training = nullptr, const Ranks* ranks = nullptr);
  std::string name() const override { return "cpu"; }
  std::string compute() const override { return training_ != nullptr ? "real" : "proxy"; }
  void prepare(const partition::Plan& plan) override;
  std::optional<size_t> buffer_bytes(int tensor) const override;
  // Real math: the peak of the device's ops' memory since prepare() (devices placed on one
  // shared ops count together).
  std::optional<double> model_peak_bytes(int device) const override;
  // A tensor-parallel chunk's collectives inside a compute task, on lanes apart from the
  // plan's collectives: every member sends each other member what it needs directly (its
  // floats; its part; the peer's part of its addend) and adds (or takes the maximum) in
  // member order, so all get the same bits, and a reduce-scatter's part has the bits an
  // all-reduce gives it.
  void all_reduce(TaskContext& task, int communicator, std::span<float> data, bool max) override;
  void all_gather(TaskContext& task, int communicator, std::span<float> data, std::span<const size_t> parts) override;
  void reduce_scatter(TaskContext& task, int communicator, std::span<float> data,
                      std::span<const size_t> parts) override;
  std::vector<float> all_to_all(TaskContext& task, int communicator, std::span<const float> send,
                                std::span<const size_t> send_parts, std::vector<size_t>& recv_parts) override;
  void send_recv(TaskContext& task, int communicator, std::span<const float> send, std::span<float> receive,
                 const std::function<void()>& meanwhile) override;
  void run(TaskContext& task) override;
  void stop() override;

 private:
  struct Part {
    Lane* mailbox = nullptr;
    int peer = -1;
    double begin = 0, end = 0;
    bool reduce = false;
  };
  struct Step {
    std::vector<Part> sends, receives;
  };

  void compute(TaskContext& task);
  void load(TaskContext& task);
  void copy_to_host_or_device(TaskContext& task);
  // A proxy's in-task message; `meanwhile` runs between posting its sends and taking its
  // receives (the task's work up to where it waits for a message that overlaps it).
  void in_task_message(TaskContext& task, const partition::InTaskCall& call, const std::function<void()>& meanwhile);
  // What moving these bytes carried, in the plan's units (TaskContext::carried_bytes): real
  // math moves FP32 floats standing for the plan's elements (gradients': the layout's
  // gradient elements).
  double carried(size_t moved_bytes, bool gradients = false) const;
  void send(TaskContext& task);
  void receive(TaskContext& task);
  void collective(TaskContext& task);
  void run_steps(TaskContext& task, std::span<float> buffer);
  std::unique_ptr<Lane> make_lane(int src, int dst, int tag);
  bool local(int device) const;
  // One in-task exchange on `communicator`'s lanes: member r (in the communicator's order)
  // gets send(r) from this device, then receive(r, floats) runs for every member in order,
  // this device's own being send(me); member r must send receive_floats(r) floats, or any
  // number where that is kAnyFloats (Error naming the device otherwise). The task's next
  // message_ran, carrying the collective's size of `floats` (partition/collective.hpp's
  // convention) in the plan's bytes. `ring`: with the next member and the previous one only
  // (a sendrecv: send(next), receive(previous)). `meanwhile` runs between the sends and the
  // receives.
  static constexpr size_t kAnyFloats = static_cast<size_t>(-1);
  void exchange_in_task(TaskContext& task, int communicator, const std::string& what, size_t floats,
                        const std::function<std::span<const float>(size_t member)>& send,
                        const std::function<size_t(size_t member)>& receive_floats,
                        const std::function<void(size_t member, std::span<const float>)>& receive, bool ring = false,
                        const std::function<void()>& meanwhile = {});

  CpuBackendOptions options_;
  LoaderThrottle throttle_;
  Training* training_ = nullptr;
  const Ranks* ranks_ = nullptr;  // null or alone: every device is here
  const partition::Plan* plan_ = nullptr;
  std::atomic<bool> stop_{false};
  // Null where neither end is this rank's.
  std::vector<std::unique_ptr<Lane>> channels_;  // per plan channel
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Lane>> lanes_;  // (src, dst, lane, stream)
  std::vector<std::vector<Step>> steps_;            // per collective task: its steps, resolved
};

// FLOP/s of single-threaded sgemm on this machine: square multiplies of `n` for about
// `seconds`. What `cpu-N:probed` clusters use as each device's speed.
double probe_sgemm_flops_per_s(double seconds = 0.2, int n = 256);

}  // namespace hetflow::exec
