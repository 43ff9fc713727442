// The CUDA back end's run(): each task's work enqueued on its lane's stream between two
// timing events and polled until done (proxy GEMMs, NCCL transfers and collectives, the real
// math's compute and collectives, a parameter server's update), and the tensor-parallel
// exchanges inside a compute task (cuda_backend.hpp says what it promises; prepare() is in
// cuda_backend.cpp).
#include "exec/cuda_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "exec/cuda_backend_state.hpp"
#include "partition/estimate.hpp"
#include "partition/task_order.hpp"

namespace hetflow::exec {

using namespace cuda_detail;  // the back end's own helpers (cuda_backend_state.hpp)

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
  double now_s() const override { return job_.task.now_s(); }  // (messages are timed on job_.task)

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

// An in-task message, issued on its stream between the lane's `message` and `end` events and
// awaited, ran for the GPU time between them, up to now: the task's next message_ran, which
// carried `carried_bytes`.
void message_ran(Job& job, double carried_bytes) {
  float ms = 0;
  cuda(cudaEventElapsedTime(&ms, job.lane.message, job.lane.end), "cudaEventElapsedTime", job.where);
  const double end_s = job.task.now_s();
  job.task.message_ran(std::max(0.0, end_s - ms / 1e3), end_s, carried_bytes);
}

// NCCL's all-to-all as grouped sends and receives: each member its part of `unit` floats
// from `at`, and this member's part from each after them. `unit` is alike on every rank (a
// function of the collective and `floats`), so each receive matches its send.
void all_to_all(Job& job, ncclComm_t* comm, const partition::CollectiveSpec& spec, size_t rank, float* at, size_t floats,
                cudaStream_t stream) {
  const size_t n = spec.devices.size();
  double widest = 0;
  for (size_t q = 0; q < n; ++q) widest = std::max(widest, partition::all_to_all_part(spec, q));
  const double unit = static_cast<double>(floats) / (1 + static_cast<double>(n - 1) * widest);
  const auto count = [&](size_t q) { return static_cast<size_t>(std::floor(partition::all_to_all_part(spec, q) * unit)); };
  job.issue(comm, "ncclSend/ncclRecv (grouped all-to-all)", [&](ncclComm_t h) {
    ncclResult_t r = ncclGroupStart();
    size_t sent = 0, received = static_cast<size_t>(unit);
    for (size_t q = 0; q < n && r == ncclSuccess; ++q) {
      if (q != rank) {
        r = ncclSend(at + sent, count(q), ncclFloat32, static_cast<int>(q), h, stream);
        if (r == ncclSuccess) r = ncclRecv(at + received, count(rank), ncclFloat32, static_cast<int>(q), h, stream);
        received += count(rank);
      }
      sent += count(q);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

// A proxy's in-task collective message: NCCL's collective of the plan's bytes (capped) in the
// lane's staging buffer, on the lane's stream after the work before it, awaited there.
void proxy_in_task(Job& job, const partition::InTaskCall& call) {
  const partition::Collective& c = job.s.plan->collective(call.collective);
  const auto group = job.s.nccl_plan.in_task_group.find(c.communicator);
  if (group == job.s.nccl_plan.in_task_group.end()) {
    throw PlanError("communicator " + std::to_string(c.communicator) + " has no NCCL group for collectives inside compute tasks");
  }
  const NcclGroup& g = job.s.nccl_plan.groups[static_cast<size_t>(group->second)];
  const auto rank = static_cast<size_t>(std::find(g.devices.begin(), g.devices.end(), job.task.spec->device) - g.devices.begin());
  if (rank == g.devices.size()) throw PlanError(job.where + " runs an in-task collective on " + g.what + ", which it is not in");
  ncclComm_t* comm = &job.s.comms[static_cast<size_t>(group->second)][rank];
  if (*comm == nullptr) throw Error("the NCCL communicator for " + job.where + " was aborted by an earlier failure");
  const size_t floats = std::min(static_cast<size_t>(std::max(0.0, c.bytes / std::max(1, c.messages))), job.s.cap) / sizeof(float);
  const size_t each = floats / g.devices.size();  // a gather's or scatter's part per rank
  auto* at = static_cast<float*>(job.lane.staging);
  const cudaStream_t stream = job.lane.cuda;
  job.task.waiting_for("in-task collective " + std::to_string(call.collective) + " (" + std::string(partition::to_string(c.kind)) +
                       ", " + std::to_string(floats) + " floats) on " + g.what);
  cuda(cudaEventRecord(job.lane.message, stream), "cudaEventRecord", job.where);
  switch (c.kind) {
    case partition::CollectiveKind::all_gather:
      job.issue(comm, "ncclAllGather", [&](ncclComm_t h) { return ncclAllGather(at + rank * each, at, each, ncclFloat32, h, stream); });
      break;
    case partition::CollectiveKind::reduce_scatter:
      job.issue(comm, "ncclReduceScatter",
                [&](ncclComm_t h) { return ncclReduceScatter(at, at + rank * each, each, ncclFloat32, ncclSum, h, stream); });
      break;
    case partition::CollectiveKind::all_to_all:
      all_to_all(job, comm, partition::collective_spec(*job.s.plan, c), rank, at, floats, stream);
      break;
    case partition::CollectiveKind::sendrecv: throw PlanError("a sendrecv, refused in prepare() (require_cuda_layout)");
    default:
      job.issue(comm, "ncclAllReduce", [&](ncclComm_t h) { return ncclAllReduce(at, at, floats, ncclFloat32, ncclSum, h, stream); });
      break;
  }
  cuda(cudaEventRecord(job.lane.end, stream), "cudaEventRecord", job.where);
  await(job.lane.end, comm, job.stop, job.where);
  message_ran(job, static_cast<double>(floats * sizeof(float)));  // (a proxy's bytes are the plan's, capped)
}

void run_compute(Job& job, double flop_scale) {
  const partition::Task& t = *job.task.spec;
  const double per_row = 2.0 * kProxyN * kProxyN;
  const double wanted = std::ceil(t.flops * flop_scale / per_row / kMinRows) * kMinRows;
  const auto total = static_cast<long long>(wanted > 0 ? std::min(wanted, 1e15) : 0.0);  // NaN: none
  long long issued = 0;
  int calls = 0, groups = 0;
  // The proxy GEMMs up to `point` of the work, in whole multiples of kMinRows.
  const auto work_to = [&](double point) {
    auto rows = static_cast<long long>(std::llround(point * static_cast<double>(total) / kMinRows)) * kMinRows - issued;
    while (rows > 0) {
      int n = kMaxRows;
      while (n > rows) n /= 2;  // rows is a multiple of 64: its binary digits from 8192 down
      gemm(job.lane, job.gpu, job.s.precision, n, job.where);
      rows -= n;
      issued += n;
      if (++calls % kCallsPerGroup != 0) continue;
      // One group runs while the next is queued behind it; waiting here sees stop().
      cuda(cudaEventRecord(job.lane.group[groups % 2], job.lane.cuda), "cudaEventRecord", job.where);
      if (groups > 0) await(job.lane.group[(groups - 1) % 2], nullptr, job.stop, job.where);
      ++groups;
    }
  };
  for (const partition::InTaskCall& call : job.s.plan->inside(job.task.task)) {
    work_to(call.at);
    proxy_in_task(job, call);
  }
  work_to(1);
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
      case partition::CollectiveKind::all_to_all:
        all_to_all(job, comm, partition::collective_spec(*job.s.plan, c), rank, at, n, stream);
        break;
      case partition::CollectiveKind::sendrecv: break;  // refused in prepare() (require_cuda_layout)
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
    case partition::CollectiveKind::all_to_all:
      all_to_all(job, comm, partition::collective_spec(*job.s.plan, c), me, buffer, count, stream);
      break;
    case partition::CollectiveKind::sendrecv: break;  // refused in prepare() (require_cuda_layout)
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
    case TaskKind::load:  // the host's loader: the executor's batches are made by its training feed
      return;
    case TaskKind::to_host:
    case TaskKind::to_device:
    case TaskKind::host_optimizer:  // refused in prepare() (require_cuda_layout)
      throw PlanError(partition::describe_task(*s.plan, task.task) + ": offload does not run on the cuda back end");
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
  double carried_bytes;  // the message's size in the plan's bytes (its floats at the plan's element size)
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
  return {job, comm, rank, g.devices.size(), static_cast<double>(floats) * model::element_bytes(s.plan->layout.precision)};
}

// Issues `call` on the rank, then waits for the compute stream to pass it.
template <typename Call>
void in_task_run(const InTask& t, const char* name, Call call) {
  const cudaStream_t stream = t.job->gpu.ops->stream();
  cuda(cudaEventRecord(t.job->lane.message, stream), "cudaEventRecord", t.job->where);
  t.job->issue(t.comm, name, call);
  cuda(cudaEventRecord(t.job->lane.end, stream), "cudaEventRecord", t.job->where);  // (recorded again when the task ends)
  await(t.job->lane.end, t.comm, t.job->stop, t.job->where);
  message_ran(*t.job, t.carried_bytes);
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

}  // namespace hetflow::exec
