#include "partition/memory.hpp"

#include <algorithm>
#include <map>

#include "partition/shard.hpp"
#include "partition/tp_calls.hpp"

namespace hetflow::partition {

double layer_params_per_device(const model::Network& network, int layer, int chunk_begin, int tensor) {
  // The last rank's part: split_units gives it the ceiling of every split dimension at once.
  return layer_part_params(network, layer, chunk_begin, SplitPart::rank(tensor - 1, tensor));
}

double params_per_device(const model::Network& network, int begin, int end, int tensor) {
  return part_params(network, begin, end, SplitPart::rank(tensor - 1, tensor));
}

Sharded sharded_by(const Layout& layout) { return sharded_by(layout, 1.0 / std::max(1, layout.replicas())); }

Sharded sharded_by(const Layout& layout, double share) {
  const double d = share > 0 && layout.replicas() > 1 ? 1 / share : 1;
  const int stage = layout.sync.kind == SyncKind::allreduce ? layout.sync.zero.stage : 0;
  return {stage >= 3 ? d : 1, stage >= 2 ? d : 1, stage >= 1 ? d : 1};
}

double offload_host_bytes_per_param(const Layout& layout) {
  return model::adam_state_bytes(layout.precision) + layout.gradient_element_bytes() +
         model::element_bytes(layout.precision);
}

double gathered_bytes(const Layout& layout, const std::vector<double>& chunk_params, double largest_layer_params) {
  const int stage = layout.sync.kind == SyncKind::allreduce && layout.replicas() > 1 ? layout.sync.zero.stage : 0;
  if (stage < 2 || chunk_params.empty()) return 0;
  const double e = model::element_bytes(layout.precision), g = layout.gradient_element_bytes();
  const double largest = *std::max_element(chunk_params.begin(), chunk_params.end());
  // Two units of each: the one in use and the next (prefetched, or being reduce-scattered).
  if (stage == 2) return 2 * std::min(largest, layout.sync.bucket_bytes / g) * g;
  if (layout.sync.zero.reshard_after_forward) return 2 * std::min(largest, largest_layer_params) * (e + g);
  double all = 0;  // every chunk gathered, and its gradients summed whole, until its last backward
  for (const double p : chunk_params) all += p;
  return all * (e + g);
}

double layer_activation_bytes(const model::Layer& layer, const Layout& layout) {
  return layer.stashed_bytes - (layout.kernels.flash_attention ? layer.attention_stash_bytes : 0);
}

double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network, const Layout& layout) {
  return stashed_bytes_per_microbatch(layer, network, layout, layout.size(Axis::tensor));
}

double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network, const Layout& layout,
                                    int tensor) {
  const double t = layer.tp_splittable ? tensor : 1;
  double bytes = 0;
  if (layout.recompute == Recompute::full) {
    // Only the layer's input is kept; the forward pass is redone during backward.
    double input_elems = 0;
    for (int i : layer.inputs) input_elems += network.layers[static_cast<size_t>(i)].output_elems;
    bytes = input_elems * model::element_bytes(network.precision);
    if (layout.sequence_parallel) bytes /= t;
  } else {
    // Selective recomputation drops the scores flash attention never keeps.
    const double kept = layout.recompute == Recompute::selective ? layer.stashed_bytes - layer.attention_stash_bytes
                                                                  : layer_activation_bytes(layer, layout);
    // (An MoE layer's copies are whole on every rank, split by sequence parallelism or not.)
    const double whole = std::min(layer.tp_whole_bytes, kept);
    const double replicated = layout.sequence_parallel ? whole : std::min(layer.tp_replicated_bytes + whole, kept);
    bytes = t == 1 ? kept : replicated + (kept - replicated) / t;
  }
  return bytes * layout.micro_batch_size / layout.size(Axis::context);  // a device keeps its tokens' alone
}

double routed_stash_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                         const Layout& layout, int tensor) {
  if (layer.experts <= 0 || !network.architecture || layout.recompute == Recompute::full) return 0;
  // The zoo's routed stash (model/zoo_transformer.cpp, moe_mlp): tokens x top-k copies, each
  // hidden wide in and out (tp_whole_bytes) and 4 x expert_ffn wide in between.
  const double t = layer.tp_splittable ? tensor : 1;
  const double hidden = network.architecture->hidden, ffn = layer.expert_params / (3 * hidden);
  const double copies = layer.tp_whole_bytes / (2 * hidden);  // tokens x top-k x element bytes
  return (layer.tp_whole_bytes + copies * 4 * ffn / t) * layout.micro_batch_size / layout.size(Axis::context);
}

DeviceMemory device_memory(const model::Network& network, const Layout& layout, const std::vector<Stage>& chunks,
                           const std::vector<int>& in_flight, bool hosts_optimizer, double capacity_bytes) {
  return device_memory(network, layout, chunks, in_flight, hosts_optimizer, capacity_bytes, layout.size(Axis::tensor));
}

DeviceMemory device_memory(const model::Network& network, const Layout& layout, const std::vector<Stage>& chunks,
                           const std::vector<int>& in_flight, bool hosts_optimizer, double capacity_bytes, int tensor) {
  return device_memory(network, layout, chunks, in_flight, hosts_optimizer, capacity_bytes, tensor, tensor - 1);
}

DeviceMemory device_memory(const model::Network& network, const Layout& layout, const std::vector<Stage>& chunks,
                           const std::vector<int>& in_flight, bool hosts_optimizer, double capacity_bytes, int tensor,
                           int tensor_rank) {
  DeviceMemory m;
  double params = 0, largest_layer_full_bytes = 0, largest_layer_params = 0;
  std::vector<double> chunk_params;
  const SplitPart part = SplitPart::rank(tensor_rank, tensor);
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunk_params.push_back(part_params(network, chunks[c].layer_begin, chunks[c].layer_end, part));
    params += chunk_params.back();
    double chunk_bytes = 0;
    for (int i = chunks[c].layer_begin; i < chunks[c].layer_end; ++i) {
      const model::Layer& l = network.layers[static_cast<size_t>(i)];
      largest_layer_params = std::max(largest_layer_params, layer_part_params(network, i, chunks[c].layer_begin, part));
      chunk_bytes += stashed_bytes_per_microbatch(l, network, layout, tensor);
      const double t = l.tp_splittable ? tensor : 1;
      largest_layer_full_bytes = std::max(largest_layer_full_bytes, layer_activation_bytes(l, layout) / t *
                                                                        layout.micro_batch_size / layout.size(Axis::context));
    }
    const int held = c < in_flight.size() ? in_flight[c] : 0;
    if (layout.offload.activations) {
      // On the device: the stash a pass makes or reads, the next backward's coming back and
      // the last forward's still leaving; every stash in flight has its buffer in host memory
      // (the pinned buffers are kept for the iteration).
      m.activations_bytes += std::min(held, 3) * chunk_bytes;
      m.host_bytes += held * chunk_bytes;
      m.peak_in_flight += std::min(held, 3);
    } else {
      m.activations_bytes += held * chunk_bytes;
      m.peak_in_flight += held;
    }
  }
  // Full recomputation rebuilds one layer's activations at a time during backward.
  if (layout.recompute == Recompute::full) m.activations_bytes += largest_layer_full_bytes;
  // Context parallelism: a backward's gathered keys and values of one layer and their gradients.
  double gathered = 0;
  for (const Stage& c : chunks) {
    gathered = std::max(gathered, context_gathered_bytes(network, layout, c.layer_begin, c.layer_end, tensor));
  }
  m.activations_bytes += 2 * gathered;
  const double e = model::element_bytes(layout.precision), g = layout.gradient_element_bytes();
  const Sharded by = sharded_by(layout);
  m.weights_bytes = params * e / by.weights;
  m.gradients_bytes = params * g / by.gradients;
  if (hosts_optimizer) {
    // Adam: two fp32 moments; mixed precision adds an fp32 master copy of the weights.
    // Offloaded, it lives in host memory with its staging buffers.
    if (layout.offload.optimizer) {
      m.host_bytes += params * offload_host_bytes_per_param(layout) / by.optimizer;
    } else {
      m.optimizer_bytes = params * model::adam_state_bytes(layout.precision) / by.optimizer;
    }
  }
  m.gathered_bytes = gathered_bytes(layout, chunk_params, largest_layer_params);
  m.workspace_bytes = layout.workspace_bytes;
  m.capacity_bytes = capacity_bytes;
  return m;
}

std::vector<DeviceMemory> memory_from_lifetimes(const Plan& plan, const std::vector<int>& task_order,
                                                const std::function<double(int)>& capacity_bytes) {
  const auto devices = static_cast<size_t>(plan.device_count());
  std::vector<DeviceMemory> memory(devices);
  for (size_t d = 0; d < devices; ++d) memory[d].capacity_bytes = capacity_bytes(static_cast<int>(d));
  for (const Tensor& t : plan.tensors) {
    if (!is_persistent(t.kind) || t.device < 0 || static_cast<size_t>(t.device) >= devices) continue;
    DeviceMemory& m = memory[static_cast<size_t>(t.device)];
    if (t.kind == TensorKind::host_state) {
      m.host_bytes += t.bytes;
      continue;
    }
    (t.kind == TensorKind::weight ? m.weights_bytes : t.kind == TensorKind::weight_grad ? m.gradients_bytes
                                                                                         : m.optimizer_bytes) += t.bytes;
  }
  // Which transient tensors each task allocates (as producer) and frees (as free_after), in
  // two arrays indexed by task (a vector per task would cost a million allocations).
  const auto by_task = [&](int Tensor::*field) {
    std::pair<std::vector<int>, std::vector<int>> csr;  // (begin per task + 1, tensors)
    auto& [begin, ids] = csr;
    begin.assign(plan.tasks.size() + 1, 0);
    for (const Tensor& t : plan.tensors) {
      if (!is_persistent(t.kind) && t.*field >= 0) ++begin[static_cast<size_t>(t.*field) + 1];
    }
    for (size_t i = 0; i < plan.tasks.size(); ++i) begin[i + 1] += begin[i];
    ids.resize(static_cast<size_t>(begin.back()));
    std::vector<int> fill(begin.begin(), begin.end() - 1);
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const Tensor& t = plan.tensors[i];
      if (!is_persistent(t.kind) && t.*field >= 0) ids[static_cast<size_t>(fill[static_cast<size_t>(t.*field)]++)] = static_cast<int>(i);
    }
    return csr;
  };
  const auto [allocate_begin, allocates] = by_task(&Tensor::producer);
  const auto [free_begin, frees] = by_task(&Tensor::free_after);
  struct Live {
    double stash = 0, buffers = 0, gathered = 0;
    int stashes = 0;
    double peak = -1;
    double host = 0, host_peak = 0;  // host_stash tensors, in the node's memory: a peak of their own
  };
  std::vector<Live> live(devices);
  auto term = [](Live& l, TensorKind k) -> double& {
    if (k == TensorKind::stash || k == TensorKind::workspace) return l.stash;
    if (k == TensorKind::gathered_weight || k == TensorKind::unsharded_grad) return l.gathered;
    if (k == TensorKind::host_stash) return l.host;
    return l.buffers;
  };
  // ZeRO's transient whole copies (gathered parameters, whole gradient buffers) freed by a task
  // on another stream than the one that made them: the making stream goes on meanwhile (the
  // next pass's buffer is made while the last one's reduce-scatter runs; the next chunk's
  // all-gather runs while the last pass reads its copy), so such a copy counts until the
  // freeing stream's next task starts, not from the end of the freeing task in this order.
  std::map<std::pair<size_t, int>, std::vector<int>> deferred;  // (device, stream) -> tensors
  for (int task : task_order) {
    const auto device = static_cast<size_t>(plan.task(task).device);
    memory[device].workspace_bytes = plan.layout.workspace_bytes;  // a device that runs anything
    Live& l = live[device];
    if (const auto pending = deferred.find({device, plan.task(task).stream}); pending != deferred.end()) {
      for (const int id : pending->second) term(l, plan.tensors[static_cast<size_t>(id)].kind) -= plan.tensors[static_cast<size_t>(id)].bytes;
      deferred.erase(pending);
    }
    for (int k = allocate_begin[static_cast<size_t>(task)]; k < allocate_begin[static_cast<size_t>(task) + 1]; ++k) {
      const Tensor& t = plan.tensors[static_cast<size_t>(allocates[static_cast<size_t>(k)])];
      term(l, t.kind) += t.bytes;
      l.stashes += t.kind == TensorKind::stash;
    }
    l.host_peak = std::max(l.host_peak, l.host);
    if (l.stash + l.buffers + l.gathered > l.peak) {
      l.peak = l.stash + l.buffers + l.gathered;
      memory[device].activations_bytes = l.stash;
      memory[device].buffers_bytes = l.buffers;
      memory[device].gathered_bytes = l.gathered;
      memory[device].peak_in_flight = l.stashes;
    }
    for (int k = free_begin[static_cast<size_t>(task)]; k < free_begin[static_cast<size_t>(task) + 1]; ++k) {
      const int id = frees[static_cast<size_t>(k)];
      const Tensor& t = plan.tensors[static_cast<size_t>(id)];
      const bool whole_copy = t.kind == TensorKind::gathered_weight || t.kind == TensorKind::unsharded_grad;
      if (whole_copy && t.producer >= 0 && plan.task(t.producer).stream != plan.task(task).stream) {
        deferred[{device, plan.task(task).stream}].push_back(id);
        continue;
      }
      term(l, t.kind) -= t.bytes;
      l.stashes -= t.kind == TensorKind::stash;
    }
  }
  for (size_t d = 0; d < devices; ++d) memory[d].host_bytes += live[d].host_peak;
  // A folded plan holds the tasks and tensors of its first workers (Layout::task_workers):
  // each replica's device holds what its counterpart there holds (the worker at its place in
  // the context group).
  if (plan.layout.folded && !plan.layout.workers.empty()) {
    const size_t held = std::min(plan.layout.task_workers(), plan.layout.workers.size());
    for (size_t w = held; w < plan.layout.workers.size(); ++w) {
      const VirtualWorker& vw = plan.layout.workers[w], &first = plan.layout.workers[w % held];
      for (size_t r = 0; r < vw.ranks.size() && r < first.ranks.size(); ++r) {
        for (size_t i = 0; i < vw.ranks[r].size() && i < first.ranks[r].size(); ++i) {
          const auto d = static_cast<size_t>(vw.ranks[r][i]), d0 = static_cast<size_t>(first.ranks[r][i]);
          if (d >= devices || d0 >= devices) continue;
          const double capacity = memory[d].capacity_bytes;
          memory[d] = memory[d0];
          memory[d].capacity_bytes = capacity;
        }
      }
    }
  }
  return memory;
}

}  // namespace hetflow::partition
