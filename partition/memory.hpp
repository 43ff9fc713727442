#pragma once
// Device memory: the closed forms the policies size stages with, and the peak of a plan's
// tensor lifetimes, which is what the plan records and validation checks. The two agree on
// persistent state exactly; on activations the lifetime peak adds what the closed forms
// leave out: boundary activations waiting to be sent or consumed, their gradients, and
// tensor/sequence-parallel partial sums alive at the peak (DeviceMemory::buffers_bytes).
#include <functional>
#include <vector>

#include "model/network.hpp"
#include "partition/layout.hpp"
#include "partition/plan.hpp"

namespace hetflow::partition {

// Parameters of layers [begin, end) held by the device of a tensor-parallel group of degree
// `tensor` that holds the most: the last rank's shard (partition/shard.hpp; a chunk without
// layer 0 keeps its own copy of tied embeddings). What a closed form sizes a stage with.
double params_per_device(const model::Network& network, int begin, int end, int tensor);
// Layer `layer`'s share of that for a chunk starting at `chunk_begin`: params_per_device is
// their sum, in layer order.
double layer_params_per_device(const model::Network& network, int layer, int chunk_begin, int tensor);

// A layer's activations for one sample as its kernels keep them: the zoo's stashed bytes,
// less the s x s attention scores and masks when flash attention never writes them.
double layer_activation_bytes(const model::Layer& layer, const Layout& layout);

// Bytes one layer keeps per micro-batch for backward under the layout's recomputation,
// sequence parallelism and a tensor-parallel degree of `tensor` (Korthikanti et al. 2022,
// section 4); without `tensor`, the layout's.
double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                    const Layout& layout, int tensor);
double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                    const Layout& layout);

// Closed form: memory of one device that runs the given chunks. in_flight[c] is the peak
// number of micro-batches whose activations chunk c holds (from the schedule);
// hosts_optimizer says whether the optimizer state lives here (all-reduce) or on servers;
// `tensor` is the degree of the device's rank (without it, the layout's); `tensor_rank` its
// rank in that group, whose shard it holds (without it, the last rank's, the largest).
DeviceMemory device_memory(const model::Network& network, const Layout& layout,
                           const std::vector<Stage>& chunks, const std::vector<int>& in_flight,
                           bool hosts_optimizer, double capacity_bytes, int tensor, int tensor_rank);
DeviceMemory device_memory(const model::Network& network, const Layout& layout,
                           const std::vector<Stage>& chunks, const std::vector<int>& in_flight,
                           bool hosts_optimizer, double capacity_bytes, int tensor);
DeviceMemory device_memory(const model::Network& network, const Layout& layout,
                           const std::vector<Stage>& chunks, const std::vector<int>& in_flight,
                           bool hosts_optimizer, double capacity_bytes);

// From the plan's tensors: per device, persistent tensors by kind, plus the peak of the
// transient tensors alive at once when the device's tasks run in `order` (task ids, a
// topological order of the plan, e.g. TaskOrder's). A transient tensor is alive from the
// start of its producer to the end of its free_after task. Adds the layout's workspace on
// every device that runs a task.
std::vector<DeviceMemory> memory_from_lifetimes(const Plan& plan, const std::vector<int>& task_order,
                                                const std::function<double(int)>& capacity_bytes);

}  // namespace hetflow::partition
