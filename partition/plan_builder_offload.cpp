// What offload moves between a device and its node's host memory, as plan tasks.
//
// The optimizer step with its state in host memory (ZeRO-Offload, Ren et al. 2021, section
// 4): once a device's gradients are synchronised they are copied to the host, its CPUs step
// AdamW on the fp32 master weights and moments there, and the updated parameters are copied
// back before the device's next forward. The whole device's state moves once per iteration,
// after its last synchronisation. DeepSpeed overlaps the copies with the backward bucket by
// bucket and delays the step one iteration (its "one-step delayed parameter update") to hide
// the CPU's time; neither is planned here, so the step's time is on the critical path, as it
// is in DeepSpeed without the delayed update.
//
// Stashed activations in host memory (IBM's Large Model Support, Le et al. 2018; ZeRO-R's
// activation offload, Rajbhandari et al. 2020, section 6.1): each forward's stash is copied out
// as soon as the forward ends, and copied back while the compute task before its backward
// runs, so a device holds a stash only around its passes and the copies hide behind compute
// where the link is fast enough.
//
// Copies run on one stream per direction, as a GPU has a copy engine per direction: to_host
// and to_device. The host's step runs on the "host" stream (the node's CPUs). The simulator
// runs copies on the node's PCIe bridge and the step on its CPUs, so they share those with the
// node's other GPUs.
#include <tuple>

#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::builder {

std::pair<int, int> Builder::add_offloaded_step(int device, int w, double params) {
  const auto d = static_cast<size_t>(device);
  const int to_host_stream = stream("to_host"), to_device_stream = stream("to_device"), host = stream("host");
  const auto elements = static_cast<std::int64_t>(params);
  const int state = tensor(TensorKind::host_state, device, params * offload_host_bytes_per_param(layout_), {elements},
                           model::Precision::fp32);
  // The next iteration's passes read the parameters the copy back writes: its compute stream
  // starts after it, as it started after the optimizer step (which was its last task).
  const std::vector<int>& computes = plan_.program(device, compute_stream_);
  const int first_compute = computes.empty() ? -1 : computes.front();

  Task down = base_task(TaskKind::to_host, device, w, -1, -1);
  down.stream = to_host_stream;
  down.purpose = Purpose::offload;
  down.bytes = params * layout_.gradient_element_bytes();
  const int to_host = plan_.add_task(down, grads_[d], std::vector<int>{state});

  Task step = base_task(TaskKind::host_optimizer, device, w, -1, -1);
  step.stream = host;
  step.flops = kAdamFlopsPerParam * params;
  step.memory_bytes = host_step_bytes_per_param(layout_) * params;
  const int stepped = plan_.add_task(step, std::vector<int>{state}, std::vector<int>{state});

  Task up = base_task(TaskKind::to_device, device, w, -1, -1);
  up.stream = to_device_stream;
  up.purpose = Purpose::offload;
  up.bytes = params * model::element_bytes(layout_.precision);
  const int to_device = plan_.add_task(up, std::vector<int>{state}, weights_[d]);

  // Persistent tensors imply no data edges: the order is explicit.
  plan_.add_order(to_host, stepped);
  plan_.add_order(stepped, to_device);
  if (first_compute >= 0) plan_.add_order(to_device, first_compute, 1);
  return {to_host, to_device};
}

void Builder::offload_stash(int device, int w, int stage, int mb, OpRecord& f) {
  const double bytes = plan_.tensor(f.stash).bytes;
  if (bytes <= 0) return;
  Task down = base_task(TaskKind::to_host, device, w, stage, mb);
  down.stream = stream("to_host");
  down.purpose = Purpose::offload;
  down.bytes = bytes;
  f.host_stash = activation_tensor(TensorKind::host_stash, device, bytes);
  const int copy = plan_.add_task(down, std::vector<int>{f.stash}, std::vector<int>{f.host_stash});
  set_free_after(f.stash, copy);
}

void Builder::prefetch_stash(int device, int w, int stage, int mb, OpRecord& f) {
  if (f.host_stash < 0) return;
  const double bytes = plan_.tensor(f.host_stash).bytes;
  // Started as the compute task before the backward starts (when the one before that ends):
  // one task ahead, so the copy overlaps it and the stash is back when the backward needs it,
  // without holding every stash back at once.
  const std::vector<int>& computes = plan_.program(device, compute_stream_);
  const int after = computes.size() >= 2 ? computes[computes.size() - 2] : -1;
  Task up = base_task(TaskKind::to_device, device, w, stage, mb);
  up.stream = stream("to_device");
  up.purpose = Purpose::offload;
  up.bytes = bytes;
  const int back = activation_tensor(TensorKind::stash, device, bytes);
  const int copy = plan_.add_task(up, std::vector<int>{f.host_stash}, std::vector<int>{back});
  set_free_after(f.host_stash, copy);
  if (after >= 0) plan_.add_order(after, copy);
  f.stash = back;
}

}  // namespace hetflow::partition::builder
