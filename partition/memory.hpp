#pragma once
// Device memory: the closed forms the policies size stages with, and the peak of a plan's
// tensor lifetimes, which is what the plan records and validation checks. The two agree on
// persistent state exactly (under ZeRO to an element per chunk: shards are whole elements);
// on activations the lifetime peak adds what the closed forms leave out: boundary
// activations waiting to be sent or consumed, their gradients, and tensor/sequence-parallel
// partial sums alive at the peak (DeviceMemory::buffers_bytes).
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

// What ZeRO divides each persistent term by: the replicas' count (data x context,
// Layout::replicas) where the layout's stage
// shards it (Rajbhandari et al. 2020, section 5.1: (2 + 2 + K) Psi bytes of mixed-precision
// Adam state become 2 Psi + 2 Psi + K Psi / Nd at stage 1, 2 Psi + (2 + K) Psi / Nd at stage 2,
// (2 + 2 + K) Psi / Nd at stage 3), 1 where it does not.
struct Sharded {
  double weights = 1, gradients = 1, optimizer = 1;
};
Sharded sharded_by(const Layout& layout);
// The same for a device holding `share` of each sharded term (ZeroShares::memory: its memory
// over its group's) rather than 1 / replicas.
Sharded sharded_by(const Layout& layout, double share);
// Offload (Layout::offload.optimizer): host bytes per parameter of a device's (shard of)
// state: the fp32 master weights and Adam moments, and the pinned staging buffers the
// gradients arrive in and the updated parameters leave from.
double offload_host_bytes_per_param(const Layout& layout);
// Closed form of the peak of ZeRO's transient whole tensors on a device whose chunks hold
// `chunk_params` parameters each (its part of them before ZeRO), the largest layer
// `largest_layer_params`. Two units of each buffer, the one in use and the next (prefetched,
// or in its reduce-scatter): stage 2, gradient buckets; stage 3 with resharding, layers
// (FSDP's units), parameters and gradients; stage 3 without, every chunk's parameters and
// gradients whole. 0 otherwise.
double gathered_bytes(const Layout& layout, const std::vector<double>& chunk_params, double largest_layer_params);

// A layer's activations for one sample as its kernels keep them: the zoo's stashed bytes,
// less the s x s attention scores and masks when flash attention never writes them.
double layer_activation_bytes(const model::Layer& layer, const Layout& layout);

// Bytes one layer keeps per micro-batch for backward under the layout's recomputation,
// sequence parallelism and a tensor-parallel degree of `tensor` (Korthikanti et al. 2022,
// section 4), of the device's 1/C of the tokens under context parallelism; without
// `tensor`, the layout's.
double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                    const Layout& layout, int tensor);
double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                    const Layout& layout);
// Of that, an MoE layer's routed copies at an even share of them (their inputs and outputs,
// whole on every tensor-parallel rank, and their SwiGLU tensors, split by it): what an expert
// rank computing `load` times an even share keeps (load - 1) times more of. 0 for a layer
// without experts, or under full recomputation (the layer's input alone is kept).
double routed_stash_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                         const Layout& layout, int tensor);

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
