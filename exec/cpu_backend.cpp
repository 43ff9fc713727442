#include "exec/cpu_backend.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "exec/training.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"

namespace hetflow::exec {

namespace {

// Floats in a device's DecoderOps memory, as host floats while the back end works on them:
// the CPU ops' own memory as it is, any other ops' through a copy put back after (what lets
// a test keep that memory out of the back end's reach).
class HostView {
 public:
  HostView(const DecoderOps& ops, std::span<float> data) : ops_(ops), data_(data) {
    if (ops_.host_addressable()) return;
    copy_.resize(data.size());
    ops_.download(copy_.data(), data.data(), data.size());
  }
  std::span<float> floats() { return ops_.host_addressable() ? data_ : std::span<float>(copy_); }
  void put_back() {
    if (!ops_.host_addressable()) ops_.upload(data_.data(), copy_.data(), copy_.size());
  }

 private:
  const DecoderOps& ops_;
  std::span<float> data_;
  std::vector<float> copy_;
};

}  // namespace

namespace {

using partition::TaskKind;

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });  // the engine's threads are the parallelism
}

constexpr int kProxyK = 128;      // the proxy multiplies [rows x 128] by [128 x 128]
constexpr int kProxyRows = 256;   // at most, per call: about 8 MFLOP, so stop() is seen within ~1 ms

std::string nth(long long k) {
  const char* suffix = (k % 100 >= 11 && k % 100 <= 13) ? "th" : k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
  return std::to_string(k) + suffix;
}

size_t floats_of(double bytes) { return static_cast<size_t>(std::max(0.0, bytes)) / sizeof(float); }

// The lane of the all-reduces inside tensor-parallel compute tasks (the stream slot holds
// the communicator): apart from every lane partition::collective_steps uses.
constexpr int kTensorParallelLane = 1000;

}  // namespace

CpuBackend::CpuBackend(CpuBackendOptions options, Training* training, const Ranks* ranks)
    : options_(options), throttle_(options.loader_throttle_s_per_sample), training_(training),
      ranks_(ranks != nullptr && !ranks->alone() ? ranks : nullptr) {
  if (!(options_.flop_scale >= 0) || !std::isfinite(options_.flop_scale)) {
    throw InputError("<options>", 0, "flop_scale", "expected a finite number >= 0");
  }
  if (!(options_.max_message_bytes >= 0)) throw InputError("<options>", 0, "max_message_bytes", "expected >= 0");
  single_threaded_blas();
}

bool CpuBackend::local(int device) const {
  return ranks_ == nullptr || ranks_->owner(device, plan_->device_count()) == ranks_->rank();
}

// In-process between this rank's devices, MPI to or from another rank's, none between two
// devices of other ranks.
std::unique_ptr<Lane> CpuBackend::make_lane(int src, int dst, int tag) {
  if (local(src) && local(dst)) return std::make_unique<Mailbox>(stop_);
  if (!local(src) && !local(dst)) return nullptr;
  const int devices = plan_->device_count();
  return ranks_->lane(ranks_->owner(src, devices), ranks_->owner(dst, devices), tag, stop_);
}

void CpuBackend::prepare(const partition::Plan& plan) {
  plan_ = &plan;
  stop_.store(false);
  throttle_.prepare(plan, ranks_);
  channels_.clear();
  lanes_.clear();
  if (ranks_ != nullptr) ranks_->check_devices(plan.device_count());
  int tag = 1;  // every rank numbers the lanes alike: channels, then lanes in key order
  for (const partition::Channel& c : plan.channels) channels_.push_back(make_lane(c.src, c.dst, tag++));
  std::vector<int> node_of;
  for (const model::Device& d : plan.cluster.devices()) node_of.push_back(d.node);
  auto node = [&](int d) { return d >= 0 && static_cast<size_t>(d) < node_of.size() ? node_of[static_cast<size_t>(d)] : d; };
  // Every lane first (tensor-parallel groups exchange inside compute tasks: the plan's in-task
  // collectives, and under real math whatever the decoder exchanges, which Training checks
  // against them), so no thread adds to the table while others read it.
  std::vector<char> in_task(plan.communicators.size(), 0);
  for (const partition::Collective& c : plan.collectives) {
    if (c.in_task()) in_task[static_cast<size_t>(c.communicator)] = 1;
  }
  for (size_t id = 0; id < plan.communicators.size(); ++id) {
    const partition::Communicator& c = plan.communicators[id];
    if (!in_task[id] && (training_ == nullptr || c.role != partition::CommRole::tensor)) continue;
    for (const int a : c.devices) {
      for (const int b : c.devices) {
        if (a != b) lanes_[{a, b, kTensorParallelLane, static_cast<int>(id)}];
      }
    }
  }
  std::vector<std::vector<partition::Step>> steps(plan.tasks.size());
  for (const partition::Collective& c : plan.collectives) {
    if (c.in_task()) continue;  // performed by its compute tasks (in_task_message)
    const partition::CollectiveSpec spec = partition::collective_spec(plan, c);
    for (int t : c.tasks) {
      const partition::Task& task = plan.task(t);
      // Messages are scoped by the stream, as in the simulator: collectives on different
      // streams never match each other's messages.
      steps[static_cast<size_t>(t)] = partition::collective_steps(spec, task.device, node);
      for (const partition::Step& s : steps[static_cast<size_t>(t)]) {
        for (const partition::Message& m : s.sends) lanes_[{task.device, m.peer, static_cast<int>(m.lane), task.stream}];
        for (const partition::Message& m : s.receives) lanes_[{m.peer, task.device, static_cast<int>(m.lane), task.stream}];
      }
    }
  }
  for (auto& [key, lane] : lanes_) lane = make_lane(std::get<0>(key), std::get<1>(key), tag++);
  steps_.assign(plan.tasks.size(), {});
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (!local(task.device)) continue;
    for (const partition::Step& s : steps[t]) {
      Step step;
      for (const partition::Message& m : s.sends) {
        step.sends.push_back({lanes_.at({task.device, m.peer, static_cast<int>(m.lane), task.stream}).get(), m.peer, m.begin,
                              m.end, false});
      }
      for (const partition::Message& m : s.receives) {
        step.receives.push_back({lanes_.at({m.peer, task.device, static_cast<int>(m.lane), task.stream}).get(), m.peer,
                                 m.begin, m.end, m.reduce});
      }
      steps_[t].push_back(std::move(step));
    }
  }
  if (training_ != nullptr) {  // the peaks count from here
    for (int d = 0; d < plan.device_count(); ++d) {
      if (local(d)) training_->ops_of(d).memory().reset_peak();
    }
  }
}

std::optional<size_t> CpuBackend::buffer_bytes(int tensor) const {
  if (training_ == nullptr) return std::nullopt;
  return training_->buffer_bytes(tensor);
}

std::optional<double> CpuBackend::model_peak_bytes(int device) const {
  if (training_ == nullptr || plan_ == nullptr || device < 0 || device >= plan_->device_count() || !local(device)) {
    return std::nullopt;
  }
  return static_cast<double>(training_->ops_of(device).memory().peak_bytes());
}

void CpuBackend::stop() {
  stop_.store(true);
  for (auto& box : channels_) {
    if (box) box->wake();
  }
  for (auto& [key, box] : lanes_) {
    if (box) box->wake();
  }
}

void CpuBackend::run(TaskContext& task) {
  if (stop_.load()) throw Stopped();
  switch (task.spec->kind) {
    case TaskKind::forward:
    case TaskKind::backward:
    case TaskKind::backward_weight:
    case TaskKind::optimizer:
    case TaskKind::host_optimizer:
      if (training_ != nullptr) {
        training_->compute(task, stop_, this);
      } else {
        compute(task);
      }
      return;
    case TaskKind::send:
      send(task);
      return;
    case TaskKind::recv:
      receive(task);
      return;
    case TaskKind::collective:
      collective(task);
      return;
    case TaskKind::load:
      load(task);
      return;
    case TaskKind::to_host:
    case TaskKind::to_device:
      copy_to_host_or_device(task);
      return;
  }
}

// Offload's copies. Real math keeps a chunk's optimizer state in its own arrays, which the
// host optimizer steps in place (host and device memory are one here), and moves a stash's
// activations out of the chunk's memory and back (Training::copy_stash), so a backward that
// ran before its copy back would fail; a proxy copies the plan's bytes between the engine's
// buffers, as a GPU's copy engine would move them.
void CpuBackend::copy_to_host_or_device(TaskContext& task) {
  if (training_ != nullptr) {
    training_->copy_stash(task);
  } else {  // the reads' bytes one after another into the writes', as far as both go
    size_t left = static_cast<size_t>(task.spec->bytes), r = 0, w = 0, from = 0, to = 0;
    while (left > 0 && r < task.reads.size() && w < task.writes.size()) {
      const Buffer &in = task.reads[r], &out = task.writes[w];
      const size_t n = std::min({left, in.size_bytes - from, out.size_bytes - to});
      if (n > 0) std::memmove(out.data + to, in.data + from, n);
      left -= n;
      from += n;
      to += n;
      if (from == in.size_bytes) {
        ++r;
        from = 0;
      }
      if (to == out.size_bytes) {
        ++w;
        to = 0;
      }
    }
  }
  task.carried_bytes = task.spec->bytes;
}

// The host's loader: the micro-batch's tokens under real math (a proxy has none), then the
// throttle's share of the node's loader.
void CpuBackend::load(TaskContext& task) {
  if (training_ != nullptr) training_->load_micro_batch(task);
  throttle_.wait(task, stop_);
}

void CpuBackend::compute(TaskContext& task) {
  thread_local std::vector<float> a(static_cast<size_t>(kProxyRows) * kProxyK, 0.5f), b(static_cast<size_t>(kProxyK) * kProxyK, 0.25f),
      c(static_cast<size_t>(kProxyRows) * kProxyK);
  constexpr double per_row = 2.0 * kProxyK * kProxyK;
  const double total = task.spec->flops * options_.flop_scale;
  double done = 0;
  // The work up to `point` of it, in proxy GEMMs.
  const auto work_to = [&](double point) {
    double left = total * point - done;
    while (left > 0) {
      if (stop_.load(std::memory_order_relaxed)) throw Stopped();
      const int rows = static_cast<int>(std::clamp(std::ceil(left / per_row), 1.0, static_cast<double>(kProxyRows)));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, kProxyK, kProxyK, 1.0f, a.data(), kProxyK, b.data(),
                  kProxyK, 0.0f, c.data(), kProxyK);
      left -= rows * per_row;
      done += rows * per_row;
    }
  };
  for (const partition::InTaskCall& call : plan_->inside(task.task)) {
    work_to(call.at);
    // A message that overlaps the work: the work up to its wait between its sends and receives.
    const std::function<void()> meanwhile = [&] { work_to(call.until); };
    in_task_message(task, call, call.overlaps() ? meanwhile : std::function<void()>());
  }
  work_to(1);
  // Outputs: small integers (exact in float sums), different per task, iteration and element.
  // Transient ones only: a persistent tensor (weights, gradients, optimizer state) is one
  // buffer for every iteration, which a transfer of another iteration may be reading (a WSP
  // worker pushes iteration i's gradients while it computes iteration i + 1's; real
  // frameworks, and the real math here, push a copy), and a proxy models no values for it.
  const auto writes = plan_->writes(task.task);
  for (size_t k = 0; k < task.writes.size(); ++k) {
    if (k < writes.size() && partition::is_persistent(plan_->tensor(writes[k]).kind)) continue;
    const Buffer& out = task.writes[k];
    auto* f = reinterpret_cast<float*>(out.data);
    const size_t n = out.size_bytes / sizeof(float);
    const size_t seed = static_cast<size_t>(task.task) * 31 + static_cast<size_t>(task.iteration) * 7;
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>((seed + i) % 97 + 1);
  }
}

double CpuBackend::carried(size_t moved_bytes, bool gradients) const {
  if (training_ == nullptr) return static_cast<double>(moved_bytes);  // a proxy's bytes are the plan's (capped)
  const partition::Layout& l = plan_->layout;
  return static_cast<double>(moved_bytes / sizeof(float)) *
         (gradients ? l.gradient_element_bytes() : model::element_bytes(l.precision));
}

void CpuBackend::send(TaskContext& task) {
  const partition::Task& t = *task.spec;
  Lane& box = *channels_[static_cast<size_t>(t.channel)];
  std::span<const std::byte> data;
  if (!task.reads.empty()) data = {task.reads[0].data, task.reads[0].size_bytes};
  std::optional<std::vector<float>> message;  // a parameter server's push or pull: the model's floats
  if (training_ != nullptr && (message = training_->message(task))) data = std::as_bytes(std::span<const float>(*message));
  // Real math moves the FP32 tensor (or the training's message: a slice, a push); a proxy the plan's bytes (capped).
  const auto bytes = training_ != nullptr ? data.size() : static_cast<size_t>(std::min(t.bytes, options_.max_message_bytes));
  task.carried_bytes = carried(bytes);
  const auto packet = box.post(data, bytes);
  task.waiting_for("device " + std::to_string(plan_->peer(task.task)) + " to receive on channel " +
                   std::to_string(t.channel) + " (" + plan_->channels[static_cast<size_t>(t.channel)].tag + ")");
  box.wait_taken(*packet);
}

void CpuBackend::receive(TaskContext& task) {
  const partition::Task& t = *task.spec;
  Lane& box = *channels_[static_cast<size_t>(t.channel)];
  task.waiting_for("a message from device " + std::to_string(plan_->peer(task.task)) + " on channel " +
                   std::to_string(t.channel) + " (" + plan_->channels[static_cast<size_t>(t.channel)].tag + ")");
  box.take([&](std::span<const std::byte> data) {
    task.carried_bytes = carried(data.size());
    if (training_ != nullptr &&
        training_->receive(task, {reinterpret_cast<const float*>(data.data()), data.size() / sizeof(float)})) {
      return;
    }
    if (task.writes.empty()) return;
    const Buffer& out = task.writes[0];
    const size_t n = std::min(out.size_bytes, data.size());
    if (n > 0) std::memcpy(out.data, data.data(), n);
  });
}

void CpuBackend::collective(TaskContext& task) {
  if (training_ != nullptr) {
    const std::span<float> gradients = training_->collective_data(task);
    if (!gradients.empty() || task.reads.empty()) {
      HostView view(training_->ops_of(task.spec->device), gradients);
      task.carried_bytes = carried(gradients.size() * sizeof(float), true);
      run_steps(task, view.floats());  // in place on the model's gradients
      view.put_back();
      training_->collective_done(task);
      return;
    }
  }
  const partition::Collective& c = plan_->collectives[static_cast<size_t>(task.spec->collective)];
  size_t count = floats_of(std::min(c.bytes, options_.max_message_bytes));
  size_t at = 0, out_at = 0;  // where the read tensor goes in the buffer, where the written one comes from
  if (training_ != nullptr) {
    // Real math: the buffer is the tensors' own floats; a smaller read tensor (a slice to
    // all-gather) is this member's piece of it, and so is a smaller written tensor (the
    // shard a reduce-scatter leaves it).
    const size_t in = task.reads.empty() ? 0 : task.reads[0].size_bytes, out = task.writes.empty() ? 0 : task.writes[0].size_bytes;
    count = std::max(in, out) / sizeof(float);
    const auto& members = plan_->members(c);
    const auto me = static_cast<size_t>(std::find(members.begin(), members.end(), task.spec->device) - members.begin());
    const size_t piece = std::min(count, static_cast<size_t>(std::llround(static_cast<double>(me) /
                                                                          static_cast<double>(members.size()) *
                                                                          static_cast<double>(count))));
    if (in < out) at = piece;
    if (out < in) out_at = piece;
  }
  std::vector<float> buffer(count, 0.0f);
  task.carried_bytes = carried(count * sizeof(float));
  if (!task.reads.empty()) {
    std::memcpy(buffer.data() + at, task.reads[0].data, std::min(task.reads[0].size_bytes, (count - at) * sizeof(float)));
  }
  run_steps(task, buffer);
  const Buffer* out = !task.writes.empty() ? &task.writes[0] : !task.reads.empty() ? &task.reads[0] : nullptr;
  if (out != nullptr) std::memcpy(out->data, buffer.data() + out_at, std::min(out->size_bytes, (count - out_at) * sizeof(float)));
}

void CpuBackend::run_steps(TaskContext& task, std::span<float> buffer) {
  const partition::Task& t = *task.spec;
  const auto& steps = steps_[static_cast<size_t>(task.task)];
  const partition::Collective& c = plan_->collectives[static_cast<size_t>(t.collective)];
  const size_t count = buffer.size();
  auto at = [&](double fraction) { return std::min(count, static_cast<size_t>(std::llround(fraction * static_cast<double>(count)))); };
  std::vector<std::shared_ptr<Lane::Packet>> posted;
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    posted.clear();
    for (const Part& p : step.sends) {  // every send of a step carries the buffer as the step starts
      const size_t b = at(p.begin), e = at(p.end);
      const auto* bytes = reinterpret_cast<const std::byte*>(buffer.data() + b);
      posted.push_back(p.mailbox->post({bytes, (e - b) * sizeof(float)}, (e - b) * sizeof(float)));
    }
    const std::string where = "step " + std::to_string(s + 1) + " of " + std::to_string(steps.size()) + " of collective " +
                              std::to_string(t.collective) + " (" + std::string(partition::to_string(c.kind)) + ", " +
                              std::string(partition::to_string(c.algorithm)) + "): ";
    long long k = 0;
    for (const Part& p : step.receives) {
      task.waiting_for(where + "the " + nth(++k) + " message from device " + std::to_string(p.peer));
      p.mailbox->take([&](std::span<const std::byte> data) {
        const size_t b = at(p.begin), e = std::min(at(p.end), b + data.size() / sizeof(float));
        const auto* in = reinterpret_cast<const float*>(data.data());
        if (p.reduce) {
          for (size_t i = b; i < e; ++i) buffer[i] += in[i - b];
        } else {
          std::copy(in, in + (e - b), buffer.begin() + static_cast<std::ptrdiff_t>(b));
        }
      });
    }
    for (size_t i = 0; i < posted.size(); ++i) {
      task.waiting_for(where + "device " + std::to_string(step.sends[i].peer) + " to take its message");
      step.sends[i].mailbox->wait_taken(*posted[i]);
    }
  }
}

void CpuBackend::exchange_in_task(TaskContext& task, int communicator, const std::string& what, size_t floats,
                                  const std::function<std::span<const float>(size_t member)>& send,
                                  const std::function<size_t(size_t member)>& receive_floats,
                                  const std::function<void(size_t member, std::span<const float>)>& receive, bool ring,
                                  const std::function<void()>& meanwhile) {
  const auto& members = plan_->communicator(communicator).devices;
  const int me = task.spec->device;
  const size_t n = members.size(), mine = static_cast<size_t>(std::find(members.begin(), members.end(), me) - members.begin());
  // Whom this device sends to and takes from: everyone, or its ring neighbours.
  const auto sends_to = [&](size_t r) { return members[r] != me && (!ring || r == (mine + 1) % n); };
  const auto takes_from = [&](size_t r) { return members[r] != me && (!ring || r == (mine + n - 1) % n); };
  const double start_s = task.now_s();
  std::vector<std::shared_ptr<Lane::Packet>> posted;
  std::vector<Lane*> to;
  for (size_t r = 0; r < n; ++r) {
    if (!sends_to(r)) continue;
    const auto bytes = std::as_bytes(send(r));
    to.push_back(lanes_.at({me, members[r], kTensorParallelLane, communicator}).get());
    posted.push_back(to.back()->post(bytes, bytes.size()));
  }
  if (meanwhile) meanwhile();
  const double beside_s = meanwhile ? task.now_s() - start_s : 0;  // the work done before the receives
  for (size_t r = 0; r < n; ++r) {  // in member order on every rank: the same sums everywhere
    const int peer = members[r];
    if (peer == me && !ring) {
      receive(r, send(r));
      continue;
    }
    if (!takes_from(r)) continue;
    task.waiting_for("a tensor-parallel " + what + " inside the task: the floats of device " + std::to_string(peer));
    const size_t expected = receive_floats(r);
    lanes_.at({peer, me, kTensorParallelLane, communicator})->take([&](std::span<const std::byte> in) {
      if (expected == kAnyFloats ? in.size() % sizeof(float) != 0 : in.size() != expected * sizeof(float)) {
        throw Error("tensor-parallel " + what + ": device " + std::to_string(peer) + " sent " + std::to_string(in.size()) +
                    " bytes, expected " + (expected == kAnyFloats ? std::string("whole floats")
                                                                  : std::to_string(expected * sizeof(float))));
      }
      receive(r, {reinterpret_cast<const float*>(in.data()), in.size() / sizeof(float)});
    });
  }
  for (size_t i = 0; i < posted.size(); ++i) {
    task.waiting_for("a tensor-parallel " + what + " inside the task: a peer to take its floats");
    to[i]->wait_taken(*posted[i]);
  }
  task.message_ran(start_s, task.now_s(), carried(floats * sizeof(float)), beside_s);
}

// A proxy's in-task message: the plan's bytes (capped) of zeros to every other member, theirs
// taken back, on the collective's communicator; counted as carried. An all-to-all sends each
// member its part of the bytes and takes its own part from each; a sendrecv its bytes to the
// next member, the previous one's taken.
void CpuBackend::in_task_message(TaskContext& task, const partition::InTaskCall& call,
                                 const std::function<void()>& meanwhile) {
  const partition::Collective& c = plan_->collective(call.collective);
  const size_t floats = floats_of(std::min(c.bytes / std::max(1, c.messages), options_.max_message_bytes));
  const std::vector<float> zeros(floats, 0.0f);
  const partition::CollectiveSpec spec = partition::collective_spec(*plan_, c);
  const bool parts = c.kind == partition::CollectiveKind::all_to_all;
  std::vector<size_t> part(spec.devices.size(), floats);  // what goes to each member
  for (size_t r = 0; parts && r < part.size(); ++r) {
    part[r] = static_cast<size_t>(std::llround(partition::all_to_all_part(spec, r) * static_cast<double>(floats)));
  }
  const size_t me = static_cast<size_t>(std::find(spec.devices.begin(), spec.devices.end(), task.spec->device) -
                                        spec.devices.begin());
  exchange_in_task(
      task, c.communicator, std::string(partition::to_string(c.kind)) + " (collective " + std::to_string(call.collective) + ")", floats,
      [&](size_t r) { return std::span<const float>(zeros).first(part[r]); },
      [&](size_t r) { return parts ? part[me] : part[r]; }, [](size_t, std::span<const float>) {},
      c.kind == partition::CollectiveKind::sendrecv, meanwhile);
}

// Expert parallelism's dispatch or combine: each member's part of `send` to it, and whatever
// each sent this one (the router decides the sizes), in member order.
std::vector<float> CpuBackend::all_to_all(TaskContext& task, int communicator, std::span<const float> send,
                                          std::span<const size_t> send_parts, std::vector<size_t>& recv_parts) {
  const auto& members = plan_->communicator(communicator).devices;
  if (send_parts.size() != members.size() + 1 || send_parts.back() > send.size()) {
    throw Error("an expert all-to-all of task " + std::to_string(task.task) + " with " +
                std::to_string(send_parts.size()) + " offsets for " + std::to_string(members.size()) + " members");
  }
  std::vector<std::vector<float>> got(members.size());
  exchange_in_task(
      task, communicator, "all-to-all", send.size(),
      [&](size_t r) { return send.subspan(send_parts[r], send_parts[r + 1] - send_parts[r]); },
      [](size_t) { return kAnyFloats; },
      [&](size_t r, std::span<const float> in) { got[r].assign(in.begin(), in.end()); });
  std::vector<float> recv;
  recv_parts = {0};
  for (const std::vector<float>& part : got) {
    recv.insert(recv.end(), part.begin(), part.end());
    recv_parts.push_back(recv.size());
  }
  return recv;
}

// A ring's step: the whole of `send` to the next member, the previous one's into `receive`
// (which must be its size), `meanwhile` between.
void CpuBackend::send_recv(TaskContext& task, int communicator, std::span<const float> send, std::span<float> ops_receive,
                           const std::function<void()>& meanwhile) {
  const DecoderOps& ops = training_->ops_of(task.spec->device);
  HostView received(ops, ops_receive);
  const std::span<float> into = received.floats();
  std::vector<float> copy;  // (host ops: `send` itself, which no one writes while it is in flight)
  std::span<const float> out = send;
  if (!ops.host_addressable()) {
    copy.resize(send.size());
    ops.download(copy.data(), send.data(), send.size());
    out = copy;
  }
  exchange_in_task(
      task, communicator, "sendrecv", send.size(), [&](size_t) { return out; },
      [&](size_t) { return into.size(); },
      [&](size_t, std::span<const float> in) { std::copy(in.begin(), in.end(), into.begin()); }, true, meanwhile);
  received.put_back();
}

void CpuBackend::all_reduce(TaskContext& task, int communicator, std::span<float> ops_data, bool max) {
  HostView view(training_->ops_of(task.spec->device), ops_data);
  const std::span<float> data = view.floats();
  std::vector<float> result(data.size(), max ? -std::numeric_limits<float>::infinity() : 0.0f);
  exchange_in_task(
      task, communicator, "all-reduce", data.size(), [&](size_t) { return std::span<const float>(data); },
      [&](size_t) { return data.size(); },
      [&](size_t, std::span<const float> in) {
        for (size_t i = 0; i < result.size(); ++i) result[i] = max ? std::max(result[i], in[i]) : result[i] + in[i];
      });
  std::copy(result.begin(), result.end(), data.begin());
  view.put_back();
}

namespace {

// Member `me`'s place in `parts` (an in-task collective's float offsets), checked.
size_t member_of(const partition::Plan& plan, int communicator, const TaskContext& task, std::span<const size_t> parts,
                 size_t floats) {
  const auto& members = plan.communicator(communicator).devices;
  const auto me = static_cast<size_t>(std::find(members.begin(), members.end(), task.spec->device) - members.begin());
  if (me == members.size() || parts.size() != members.size() + 1 || parts.back() > floats) {
    throw Error("a tensor-parallel collective of task " + std::to_string(task.task) + " on communicator " +
                std::to_string(communicator) + " with " + std::to_string(parts.size()) + " offsets for " +
                std::to_string(members.size()) + " members");
  }
  return me;
}

}  // namespace

void CpuBackend::all_gather(TaskContext& task, int communicator, std::span<float> ops_data,
                            std::span<const size_t> parts) {
  HostView view(training_->ops_of(task.spec->device), ops_data);
  const std::span<float> data = view.floats();
  const size_t me = member_of(*plan_, communicator, task, parts, data.size());
  const auto part = [&](size_t r) { return data.subspan(parts[r], parts[r + 1] - parts[r]); };
  exchange_in_task(
      task, communicator, "all-gather", data.size(), [&](size_t) { return std::span<const float>(part(me)); },
      [&](size_t r) { return part(r).size(); },
      [&](size_t r, std::span<const float> in) {
        if (r != me) std::copy(in.begin(), in.end(), part(r).begin());
      });
  view.put_back();
}

void CpuBackend::reduce_scatter(TaskContext& task, int communicator, std::span<float> ops_data,
                                std::span<const size_t> parts) {
  HostView view(training_->ops_of(task.spec->device), ops_data);
  const std::span<float> data = view.floats();
  const size_t me = member_of(*plan_, communicator, task, parts, data.size());
  const auto part = [&](size_t r) { return std::span<const float>(data.subspan(parts[r], parts[r + 1] - parts[r])); };
  std::vector<float> result(part(me).size(), 0.0f);
  exchange_in_task(
      task, communicator, "reduce-scatter", data.size(), part, [&](size_t) { return result.size(); },
      [&](size_t, std::span<const float> in) {
        for (size_t i = 0; i < result.size(); ++i) result[i] += in[i];
      });
  std::copy(result.begin(), result.end(), data.begin() + static_cast<std::ptrdiff_t>(parts[me]));
  view.put_back();
}

double probe_sgemm_flops_per_s(double seconds, int n) {
  single_threaded_blas();
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  const double flops = 2.0 * n * n * n;
  using Clock = std::chrono::steady_clock;
  auto multiply = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  multiply();  // warm-up: pages, caches
  const auto start = Clock::now();
  long long calls = 0;
  double elapsed = 0;
  do {
    multiply();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return flops * static_cast<double>(calls) / elapsed;
}

}  // namespace hetflow::exec
