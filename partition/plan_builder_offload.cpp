// The optimizer step with its state in host memory (ZeRO-Offload, Ren et al. 2021, section
// 4): once a device's gradients are synchronised they are copied to the host, its CPUs step
// AdamW on the fp32 master weights and moments there, and the updated parameters are copied
// back before the device's next forward. Copies run on the device's "offload" stream (its
// copy engine), the step on its "host" stream (the node's CPUs); the simulator runs them on
// the node's PCIe bridge and CPUs, so they share those with the node's other GPUs.
//
// The whole device's state moves once per iteration, after its last synchronisation.
// DeepSpeed overlaps the copies with the backward bucket by bucket and delays the step one
// iteration (its "one-step delayed parameter update") to hide the CPU's time; neither is
// planned here, so the step's time is on the critical path, as it is in DeepSpeed without
// the delayed update.
#include <tuple>

#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition::builder {

std::pair<int, int> Builder::add_offloaded_step(int device, int w, double params) {
  const auto d = static_cast<size_t>(device);
  const int copies = stream("offload"), host = stream("host");
  const auto elements = static_cast<std::int64_t>(params);
  const int state = tensor(TensorKind::host_state, device, params * offload_host_bytes_per_param(layout_), {elements},
                           model::Precision::fp32);
  // The next iteration's passes read the parameters the copy back writes: its compute stream
  // starts after it, as it started after the optimizer step (which was its last task).
  const std::vector<int>& computes = plan_.program(device, compute_stream_);
  const int first_compute = computes.empty() ? -1 : computes.front();

  Task down = base_task(TaskKind::to_host, device, w, -1, -1);
  down.stream = copies;
  down.purpose = Purpose::offload;
  down.bytes = params * layout_.gradient_element_bytes();
  const int to_host = plan_.add_task(down, grads_[d], std::vector<int>{state});

  Task step = base_task(TaskKind::host_optimizer, device, w, -1, -1);
  step.stream = host;
  step.flops = kAdamFlopsPerParam * params;
  step.memory_bytes = host_step_bytes_per_param(layout_) * params;
  const int stepped = plan_.add_task(step, std::vector<int>{state}, std::vector<int>{state});

  Task up = base_task(TaskKind::to_device, device, w, -1, -1);
  up.stream = copies;
  up.purpose = Purpose::offload;
  up.bytes = params * model::element_bytes(layout_.precision);
  const int to_device = plan_.add_task(up, std::vector<int>{state}, weights_[d]);

  // Persistent tensors imply no data edges: the order is explicit.
  plan_.add_order(to_host, stepped);
  plan_.add_order(stepped, to_device);
  if (first_compute >= 0) plan_.add_order(to_device, first_compute, 1);
  return {to_host, to_device};
}

}  // namespace hetflow::partition::builder
