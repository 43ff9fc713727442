#pragma once
// A layout: how a training job is laid over a cluster. Virtual workers (pipelines) made of
// ranks (tensor-parallel device groups) that run model chunks (contiguous layer ranges);
// data parallelism across virtual workers, which may differ in size, GPU mix and split of
// layers; micro-batching, schedule, recomputation and synchronisation. Pure data.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "model/precision.hpp"
#include "partition/axis.hpp"
#include "partition/collective.hpp"
#include "partition/routing.hpp"

namespace hetflow::partition {

// The source errors about PlanOptions name (InputError::file), with the member at fault as
// the field and other members in messages as `member`: the library speaks of data, and
// tools/ maps them to its options (--stage-layers, ...).
inline constexpr const char* kOptions = "<options>";

enum class Recompute { none, selective, full };
enum class SyncKind { allreduce, ps, wsp };
// How ZeRO divides a piece among its replicas (Sharding::shares): equally, or in proportion
// to their devices' memory.
enum class ZeroShares { equal, memory };
// How a context group exchanges each attention layer's keys and values: gathered whole just
// before the attention (Llama 3's all_gather), or passed around the group's ring in blocks
// while the attention computes on the block at hand (ring attention; Megatron's p2p).
enum class ContextComm { all_gather, ring };

std::string_view to_string(Recompute r);
std::string_view to_string(SyncKind s);
std::string_view to_string(ZeroShares s);
std::string_view to_string(ContextComm c);  // "allgather", "ring"
// These throw std::invalid_argument naming the accepted values.
Recompute parse_recompute(std::string_view text);
SyncKind parse_sync(std::string_view text);
ZeroShares parse_zero_shares(std::string_view text);
ContextComm parse_context_comm(std::string_view text);

// One model chunk: layers [layer_begin, layer_end) run by pipeline rank `rank`.
struct Stage {
  int layer_begin = 0;
  int layer_end = 0;
  int rank = 0;
  bool operator==(const Stage&) const = default;
};

struct VirtualWorker {
  // ranks[r]: the devices of pipeline rank r, a tensor-parallel group: its size is the rank's
  // tensor-parallel degree, which may differ between ranks and between virtual workers.
  std::vector<std::vector<int>> ranks;
  // Chunks in model order. With v virtual stages there are p * v of them and chunk k runs on
  // rank k % p (Megatron's interleaving); otherwise chunk k runs on rank k.
  std::vector<Stage> stages;
  int microbatches = 1;  // per iteration; may differ between virtual workers
  // The tensor-parallel degree of chunk k: the devices of its rank.
  int tensor_of(size_t k) const { return static_cast<int>(ranks[static_cast<size_t>(stages[k].rank)].size()); }
  bool operator==(const VirtualWorker&) const = default;
};

// The kernels a GPU runs for a decoder layer, in Megatron's options (--use-flash-attn and
// the fusions it enables unless told --no-masked-softmax-fusion, --no-bias-gelu-fusion,
// --no-bias-dropout-fusion). They change how many bytes the memory-bound operations move
// (partition/layer_ops.hpp), and flash attention the activations kept (no s x s scores),
// never the FLOPs counted.
struct KernelOptions {
  bool flash_attention = false;
  bool fused_softmax = true;           // scale, mask and softmax in one kernel
  bool fused_bias_gelu = true;         // MLP up's bias added inside the activation
  bool fused_bias_dropout_add = true;  // row-parallel bias, dropout and residual in one kernel
  bool fused_adam = true;              // the optimizer step in one kernel (apex's FusedAdam), not PyTorch's op by op
  bool operator==(const KernelOptions&) const = default;
};

// ZeRO (Rajbhandari et al. 2020; DeepSpeed's stages): the model state the data axis shards
// over the virtual workers, each replica keeping a share of every chunk's piece: 1/D, or its
// device's memory over its replicas' (`shares`).
// Megatron's --use-distributed-optimizer is stage 1; PyTorch FSDP's FULL_SHARD is stage 3.
// The builder (plan_builder_zero.cpp) turns it into the reduce-scatters and all-gathers it
// costs; every worker must cut the model alike (same chunks at the same degrees).
struct Sharding {
  // 0: nothing sharded; 1: optimizer state and fp32 master weights (gradients reduce-scattered
  // once per iteration, the updated weights all-gathered); 2: also the gradients, each
  // micro-batch's reduce-scattered as its backward makes them; 3: also the parameters,
  // all-gathered before the passes that need them.
  int stage = 0;
  // Stage 3: each pass gathers the chunk's parameters and frees them after it (FSDP's
  // default); off, a chunk's parameters are gathered once per iteration and kept until its
  // last backward, its gradients summed whole and reduce-scattered once (FSDP's
  // reshard_after_forward=False under a pipeline schedule, as Llama 3 trained).
  bool reshard_after_forward = true;
  // memory: replica w keeps m_w / sum m of each piece, m its device's memory (a 24 GB GPU
  // holds more of the optimizer state than a 16 GB one beside it); its reduce-scatters and
  // all-gathers carry those parts (Collective::parts). Equal memories: equal shares.
  ZeroShares shares = ZeroShares::equal;
  bool operator==(const Sharding&) const = default;
};

// What lives in the host's memory instead of the GPU's (ZeRO-Offload, Ren et al. 2021). Its
// copies are plan tasks on the node's PCIe links and its optimizer step runs on the node's
// CPUs (model::NodeHost), so the simulator sees their contention with everything else.
struct Offload {
  // fp32 master weights and Adam moments in host memory: after a chunk's gradients are
  // synchronised they are copied to the host, the host CPUs step the optimizer there, and
  // the updated parameters are copied back (to_host, host_optimizer, to_device tasks).
  bool optimizer = false;
  // Each stash copied to host memory after its forward (to_host, on the device's to_host
  // stream) and back before its backward (to_device, on its to_device stream), prefetched
  // while the compute before the backward runs (IBM's Large Model Support; ZeRO-R's
  // activation offload): the device holds a stash only around its passes.
  bool activations = false;
  bool any() const { return optimizer || activations; }
  bool operator==(const Offload&) const = default;
};

struct Sync {
  SyncKind kind = SyncKind::allreduce;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::ring;
  double bucket_bytes = 25.0 * 1024 * 1024;  // PyTorch DDP's default bucket
  // All-reduce: each bucket starts as soon as the backward has made its gradients, in the
  // last micro-batch's backward of the chunk that holds them (Megatron's
  // --overlap-grad-reduce), not after the device's last compute.
  bool overlap_grad_reduce = false;
  int staleness = 0;  // WSP: a virtual worker may run at most this many waves ahead
  // Parameter server (ps, wsp): the device that hosts each layer's parameters and optimizer
  // state (one entry per layer of the network).
  std::vector<int> layer_server;
  Sharding zero;  // all-reduce only
  bool operator==(const Sync&) const = default;
};

// Expert parallelism (Megatron's --expert-model-parallel-size): a mixture's routed experts
// split over `parallel` consecutive data-parallel replicas, an expert group
// (partition/expert_shard.hpp), which hand their tokens' copies to the experts' holders and
// take the results back by all-to-all in every MoE layer's passes (axis_expert.cpp). The
// routing decides how many copies each holder computes; the busiest gates the layer.
struct Experts {
  int parallel = 1;  // EP: the expert group's size, dividing the data axis
  Routing routing;   // how the router spreads the copies over the experts (routing.hpp)
  // placement[e]: the expert rank holding expert e, every rank at least one; empty:
  // experts / parallel consecutive experts a rank (contiguous_placement).
  std::vector<int> placement;
  // The dispatch's and combine's algorithm: pairwise (every pair at once) or hierarchical
  // (inside each node, then one message per peer across).
  CollectiveAlgorithm dispatch = CollectiveAlgorithm::pairwise;
  bool operator==(const Experts&) const = default;
};

struct Layout {
  std::string policy;    // which policy built it
  std::string schedule = "1f1b";
  // The parallel axes by name, in placement order (innermost first: the policies deal
  // devices so that consecutive ones differ first on axes[0]), each with its size: data the
  // virtual workers (over the context size), pipeline the most ranks a worker has, tensor
  // the most devices a rank has (the degree the built-in policies give every rank; each
  // rank's own degree is its device count, ranks[r].size()), context C as given. `workers`
  // is the truth; plans check the sizes against it.
  //
  // Context parallelism (C > 1, Megatron's --context-parallel-size): consecutive virtual
  // workers w = d C + c (c < C) form one context group, one data-parallel replica d. They run
  // the same schedule on the same samples, each 1/C of every sequence's tokens (2C chunks,
  // chunks c and 2C - 1 - c on worker c, which balances causal attention), and all-gather
  // each layer's keys and values inside its passes (axis_context.cpp); their gradients are
  // summed, and ZeRO shards, over all D x C workers, as Megatron's data-parallel group with
  // context parallelism does. context_comm: all-gathered (as above), or a ring of
  // send/receives overlapped with the attention (axis_context.cpp).
  std::vector<LayoutAxis> axes = default_axes();
  ContextComm context_comm = ContextComm::all_gather;
  int virtual_stages = 1;  // v: chunks per rank (interleaved schedules)
  int micro_batch_size = 1;  // samples per micro-batch
  model::Precision precision = model::Precision::fp16;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  bool fp32_grad_accumulation = false;  // Megatron's fp32 main grads: +4 B/param
  // Bytes of one gradient element: what gradient buffers hold and gradient collectives move.
  double gradient_element_bytes() const { return fp32_grad_accumulation ? 4.0 : model::element_bytes(precision); }
  KernelOptions kernels;
  double workspace_bytes = 1024.0 * 1024 * 1024;  // per device: cuBLAS/NCCL buffers, fragmentation
  int iterations = 1;
  Sync sync;
  Offload offload;
  Experts experts;
  std::vector<VirtualWorker> workers;
  // Folded: the virtual workers are identical replicas (same structure, device types and
  // micro-batches) and the plan holds the tasks of worker 0 alone; its data-parallel
  // collectives keep every replica's devices in their communicators, standing for the
  // replicas' identical parts (partition/plan_builder.hpp). Only where replicas share no
  // links but by symmetry: one region, a non-blocking fabric, a NIC per GPU, no shared PCIe
  // uplink. Simulated, not executed.
  bool folded = false;

  // An axis's size; 1 for one the layout does not list (expert: experts.parallel).
  int size(Axis a) const;
  // Sets an axis's size, listing it outermost where the layout did not (context: just
  // outside tensor, Megatron's order tp-cp-dp-pp; expert: experts.parallel, not listed).
  void set_size(Axis a, int n);
  // Sets every axis's size from `workers` (what a layout made from its devices, a layout file
  // or a plan without sizes, has), context's kept; the order stays.
  void fit_axes();
  // Sets the data and pipeline axes' sizes from `workers` and keeps the tensor degree as
  // given, which check_axes then holds to the ranks (a policy's layout, a plan file's).
  void fit_outer_axes();
  // The sizes `workers` give each axis (fit_axes's), in `axes`'s order.
  std::vector<LayoutAxis> fitted_axes() const;
  // The workers a plan holds tasks for: every one, or folded, the first expert group's context
  // groups (worker 0 alone without context or expert parallelism), standing for the rest.
  size_t task_workers() const {
    return folded ? static_cast<size_t>(std::max(1, size(Axis::context)) * std::max(1, experts.parallel)) : workers.size();
  }
  // The workers that hold every parameter and sum their gradients: data x context, what
  // ZeRO shards over.
  int replicas() const { return size(Axis::data) * size(Axis::context); }
  // Samples one iteration trains: every worker's micro-batches, once per context group.
  int samples_per_iteration() const;
  // Each of `devices` devices' coordinates (a device the layout lists twice keeps its first).
  std::vector<AxisCoords> device_coords(int devices) const;
  // Whether every rank of every virtual worker has size(Axis::tensor) devices.
  bool uniform_tensor() const;
  // The largest rank's device count (the tensor axis's size); 1 without ranks.
  int largest_tensor() const;
  bool operator==(const Layout&) const = default;
};

// Throws InputError (file "<layout>", field "axes..." ) unless the layout lists each axis
// once, sized as its workers size it (Layout::fitted_axes).
void check_axes(const Layout& layout);

}  // namespace hetflow::partition
