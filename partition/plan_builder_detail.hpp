#pragma once
// The plan builder's internals, shared by its files (partition/ only):
//   plan_builder.cpp           the driver, layout checks, lookups, streams and communicators
//   plan_builder_compute.cpp   F/B/W tasks with their tensors and tensor-parallel collectives
//   plan_builder_pipeline.cpp  activations forward and gradients backward between chunks
//   plan_builder_sync.cpp      gradient all-reduce, tied embeddings, optimizer, parameter servers
//   plan_builder_zero.cpp      ZeRO: the shards' reduce-scatters and all-gathers
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/axis_registry.hpp"
#include "partition/cost_model.hpp"
#include "partition/expert_shard.hpp"
#include "partition/plan.hpp"
#include "partition/schedule.hpp"
#include "partition/shard.hpp"

namespace hetflow::partition::builder {

// An Adam step per parameter: ~12 FLOPs, and reads and writes of weights, gradients, master
// copy and two moments (memory bound on every GPU). The builder's optimizer tasks and the
// layout estimate cost them alike.
inline constexpr double kAdamFlopsPerParam = 12;
inline constexpr double kAdamBytesPerParam = 32;
// Unfused (KernelOptions::fused_adam off), PyTorch 1.13's single-tensor AdamW
// (torch/optim/adamw.py, _single_tensor_adamw) runs nine kernels per parameter tensor, each
// reading its inputs and writing its output: param.mul_ 2, exp_avg.mul_ 2 and .add_ 3,
// exp_avg_sq.mul_ 2 and .addcmul_ 3, sqrt 2, the division 2, .add_(eps) 2, param.addcdiv_ 4:
// 22 fp32 accesses where the fused kernel makes 7 (p, g, m, v read; p, m, v written), 60
// bytes more per parameter.
inline constexpr double kUnfusedAdamExtraBytesPerParam = 60;
inline double adam_bytes_per_param(const KernelOptions& k) {
  return kAdamBytesPerParam + (k.fused_adam ? 0 : kUnfusedAdamExtraBytesPerParam);
}

// Offload's host step (plan_builder_offload.cpp), host-memory traffic per parameter: the
// fp16/bf16 gradient read from its staging buffer, the fp32 master weight and two moments
// read and written, the new fp16/bf16 parameter written to its staging buffer (DeepSpeed's
// CPU Adam, fused, one pass).
inline double host_step_bytes_per_param(const Layout& layout) {
  return layout.gradient_element_bytes() + 2 * model::adam_state_bytes(layout.precision) +
         model::element_bytes(layout.precision);
}

// Collective traffic: bytes per device in so many collectives (each paying its latencies).
struct Traffic {
  double bytes = 0;
  int messages = 0;
  void add(const Traffic& t) {
    bytes += t.bytes;
    messages += t.messages;
  }
};

// Per chunk and per device of its rank, for one micro-batch.
struct ChunkWork {
  double forward_flops = 0, backward_flops = 0, recompute_flops = 0;
  double weight_bytes = 0;        // device-memory traffic: weights read once per pass
  double stash_bytes = 0;         // what a forward keeps for its backward
  double largest_layer_bytes = 0; // full recomputation rebuilds one layer's stash at a time
  // Context parallelism: the sequence's keys and values one attention layer gathers (a
  // forward holds one such buffer at a time, a backward two: they and their gradients).
  double context_bytes = 0;
  // Tensor-parallel traffic: what the forward all-reduces (its layers' tp_allreduce_elems,
  // Megatron's g) and what the backward does (tp_backward_allreduce_elems, f); and the same
  // of the layers full recomputation runs again (those with forward FLOPs: not the
  // embedding, whose output is the checkpoint).
  Traffic tp_forward, tp_backward, tp_rerun_forward, tp_rerun_backward;
  double output_bytes = 0;        // the chunk's output activation (whole, per device)
  double input_bytes = 0;         // its input activation (whole)
};
// `tensor`: the degree of the chunk's rank; `experts`: what its worker holds and computes of
// every MoE layer (the routed experts' FLOPs scale with its load, its weights hold its experts).
ChunkWork chunk_work(const model::Network& net, const Layout& layout, const Stage& s, int tensor,
                     const ExpertShare& experts = {});

// One pass's tensor-parallel traffic in total, as the layout estimate times it: under
// sequence parallelism its all-gathers and reduce-scatters, otherwise its all-reduces
// (`reduce`) alone. The plan performs the same calls inside the pass (tp_calls.hpp), plus
// two the estimate leaves out: the loss's all-reduces under sequence parallelism and the
// once-a-step sum of the gains every rank holds whole.
struct TpPass {
  double gather_bytes = 0, reduce_bytes = 0;
  int gather_messages = 0, reduce_messages = 0;  // each at least 1 (a pass without bytes has no task)
};
// A forward: f gathered, g reduced (all-reduced without sequence parallelism). A backward: g's
// gradient gathered and f's inputs gathered again, f's gradients reduced (all-reduced
// without); under full recomputation the rerun layers' forward traffic again.
TpPass tp_pass(const ChunkWork& work, bool backward, bool sequence_parallel, Recompute recompute);
// Whether a chunk's passes run tensor-parallel collectives on `tensor` ranks: traffic in
// either pass (a chunk of the LM head alone has none in its forward, f in its backward).
bool tp_collectives(const ChunkWork& work, int tensor);

// Bucket b of `buckets` over a gradient piece of `bytes`: whole elements, bucket b holding
// elements [n b / k, n (b + 1) / k) of the piece's n, as a back end splits the gradients.
inline double bucket_bytes(double bytes, double element_bytes, int buckets, int b) {
  const auto n = static_cast<long long>(std::llround(bytes / element_bytes)), k = static_cast<long long>(buckets);
  return static_cast<double>(n * (b + 1) / k - n * b / k) * element_bytes;
}

// What one op (F, B or W of one chunk, micro-batch and tensor rank) left behind.
struct OpRecord {
  int task = -1;     // its compute task
  int done = -1;     // the task after which its result is complete (compute, or its collective)
  int output = -1;   // F: the output activation; B: the input gradient (-1 at the ends)
  int stash = -1;    // F: its stash tensor (activation offload: the copy back, from the backward's prefetch)
  int host_stash = -1;  // F, activation offload: the stash's copy in host memory
  int input = -1;    // B: the output gradient its compute read (W reads it too)
};

// Parameters held by groups of different tensor-parallel degrees, cut so that each piece
// lies on one rank of every group: the cuts are every group's rank boundaries j / t. Piece i
// is `fraction` of the parameters, on rank rank_of[g] of group g (of degree degrees[g]).
// With one degree t everywhere: t pieces, piece j on rank j of every group.
struct Share {
  double fraction = 0;
  std::vector<int> rank_of;
  SplitPart part;  // [lo, hi) of the split, exactly: what partition/shard.hpp counts
};
std::vector<Share> shares(const std::vector<int>& degrees);

// A range of layers held by the same chunk (stage_of_worker[w]) in every virtual worker:
// its gradients are all-reduced together. Each piece (one per tensor-parallel rank when
// every worker holds the range at the same degree, else the Shares of their degrees) is
// all-reduced among the devices that hold it, in `buckets` collectives.
struct Segment {
  int begin = 0, end = 0;
  std::vector<int> stage_of_worker;
  struct Piece {
    std::vector<int> rank_of_worker;
    double bytes = 0;  // gradient bytes of the piece
    int buckets = 1;
    // The workers that hold it and sum it, in order; empty: every worker. Under expert
    // parallelism a segment's routed experts are pieces of their own, one per expert rank,
    // summed over the workers that hold those experts.
    std::vector<int> workers;
  };
  std::vector<Piece> pieces;
};
// The workers of a piece, in order (Piece::workers, or all `workers` of the layout).
std::vector<int> piece_workers(const Segment::Piece& piece, size_t workers);
// The segments of a layout with two or more virtual workers (none otherwise), later layers
// first (their gradients are ready first); each cut into the pieces the workers' tensor ranks
// hold (one per rank at one degree), with their gradient bytes and buckets. Every device
// sees the collectives in this one global order, so comm streams cannot deadlock.
std::vector<Segment> data_parallel_segments(const model::Network& net, const Layout& layout);

// The workers of each gradient-norm all-reduce (Builder::add_optimizers), of the first
// `workers` of the layout (every one, or the built ones when folded): under ZeRO one
// all-reduce over every worker (but folded), under expert parallelism one per expert group
// (its members hold the group's experts between them), else one per worker.
std::vector<std::vector<int>> gradient_norm_workers(const Layout& layout, int zero_stage, size_t workers);

// Whether the optimizers of a virtual worker wait for its gradient-norm all-reduce: under
// all-reduce, for a transformer (Megatron clips by the global norm by default; the CNN recipes
// HetPipe and torchvision follow do not clip).
inline bool clips_gradient_norm(const model::Network& net, const Layout& layout) {
  return layout.sync.kind == SyncKind::allreduce && net.architecture.has_value();
}

// ZeRO over the data axis (plan_builder_zero.cpp), shared with the layout estimate:
// the layout's stage where it shards (all-reduce over two or more workers), else 0.
int zero_stage(const Layout& layout);
// Whether ZeRO reduce-scatters each pass's gradients from a whole buffer of its own (stage 2,
// and 3 resharded), not a chunk's once an iteration (3 kept gathered) or buckets (1).
bool zero_scatters_each_pass(const Layout& layout);
// Throws InputError unless every worker cuts the model alike (from stage 2, with the same
// micro-batches too): replicas shard each piece element by element.
void check_zero(const Layout& layout);
// The layout's algorithm where a reduce-scatter or all-gather runs it, else ring.
CollectiveAlgorithm zero_algorithm(const Layout& layout);
// Replica w of `replicas`' whole elements of a piece of `params`: [n w / D, n (w + 1) / D);
// with `parts` (zero_parts), [round(n c_w), round(n c_(w+1))), c the parts' cuts, as the
// executors round a member's part of a reduce-scatter.
double zero_shard(double params, int w, int replicas, const std::vector<double>& parts = {});
// The shares of a piece whose replicas are `devices` (one a worker, in worker order) under
// Sharding::shares: empty for equal shares (or devices of one memory size), else each
// device's memory over theirs: the parts of the piece's reduce-scatters and all-gathers.
std::vector<double> zero_parts(const Layout& layout, const model::Cluster& cluster, const std::vector<int>& devices);
// What replica w keeps of a piece of `params` of which `experts` are routed experts' (0
// without expert parallelism): its shard of the dense part over every replica (its `parts`
// share, or equal), and of the experts over the replicas holding the same ones (member
// w / (C EP) C + w % C of D C / EP).
double zero_own(const Layout& layout, double params, double experts, int w, const std::vector<double>& parts = {});
// The messages of a ZeRO collective of `bytes` over the chunk of layers [begin, end): at stage
// 3 FSDP's units (each layer that holds parameters), else gradient buckets.
int zero_messages(const model::Network& net, const Layout& layout, int begin, int end, double bytes);

// --overlap-grad-reduce: when each of `buckets` buckets of the gradients of layers [begin,
// end) is complete, as the part of the backward work of the chunk [chunk_begin, chunk_end)
// done by then (by FLOPs; the backward runs the chunk's layers last to first). Buckets split
// the gradients evenly from the last layer down, as PyTorch's and Megatron's do; a bucket is
// complete once the backward has passed its lowest layer. 1 for the one completed last when
// nothing below it remains.
std::vector<double> bucket_ready_fractions(const model::Network& net, int chunk_begin, int chunk_end, int begin, int end,
                                           int buckets);

class Builder {
 public:
  // Builds into `plan` (empty).
  Builder(const model::Cluster& cluster, const model::Network& net, const Layout& layout, const CostModel& cost,
          Plan& plan);
  void build();

  // --- the axes' phases, called from their rules (partition/axis_registry.hpp) ---
  void add_pipeline_phase();       // every built worker's boundary transfers (plan_builder_pipeline.cpp)
  void add_data_parallel_sync();   // the all-reduce, or the parameter servers (plan_builder_sync.cpp)

 private:
  // --- plan_builder.cpp: checks, lookups, shared constructors ---
  void check_layout() const;
  void check_mixed_tensor() const;
  void check_fold() const;
  void check_context() const;
  int stream(const std::string& name);
  int transfer_stream(const char* prefix, int peer, const std::string& tag);
  // The communicator of `role` over `devices` (in that order), made on first use.
  int communicator(CommRole role, const std::string& name, const std::vector<int>& devices);
  int channel(int src, int dst, const std::string& tag, CommRole role);
  const VirtualWorker& worker(int w) const { return layout_.workers[static_cast<size_t>(w)]; }
  // The workers that get tasks: every one, or folded, the first context group (worker 0 alone
  // without context parallelism); the rest stand in its data-parallel collectives.
  size_t built_workers() const { return plan_.layout.task_workers(); }
  // The tensor-parallel degree of a chunk (the devices of its rank).
  int degree(int w, int stage) const { return degrees_[static_cast<size_t>(w)][static_cast<size_t>(stage)]; }
  int device_of(int w, int stage, int j) const;
  std::vector<int> rank_devices(int w, int stage) const;
  int chunk_index(int device, int stage) const;  // position of the chunk among the device's
  int weight_of(int device, int stage) const { return weights_[static_cast<size_t>(device)][static_cast<size_t>(chunk_index(device, stage))]; }
  int grad_of(int device, int stage) const { return grads_[static_cast<size_t>(device)][static_cast<size_t>(chunk_index(device, stage))]; }
  OpRecord& op(int w, int stage, int mb, OpKind kind, int j);
  Task base_task(TaskKind kind, int device, int w, int stage, int mb) const;
  static Task communication(Task like, TaskKind kind, Purpose purpose, int device, double bytes);
  int tensor(TensorKind kind, int device, double bytes, std::vector<std::int64_t> shape, model::Precision dtype);
  int activation_tensor(TensorKind kind, int device, double bytes);
  // A collective over `devices` on `stream_id`, participant i reading reads[i] and writing
  // writes[i] (-1: none); returns the participants' task ids. `like` is taken by value: it
  // is often one of plan_.tasks, which each participant's add_task may reallocate. Only the
  // first `with_tasks` devices get tasks (a folded plan's replicas stand in the ring only).
  std::vector<int> add_collective(CollectiveKind kind, CollectiveAlgorithm algorithm, const std::string& group_name,
                                  const std::vector<int>& devices, double bytes, Purpose purpose, int stream_id,
                                  Task like, const std::vector<int>& reads, const std::vector<int>& writes,
                                  size_t with_tasks = static_cast<size_t>(-1));
  // A send/recv pair on the channel src -> dst (tag); returns {send, recv}.
  std::pair<int, int> add_transfer(int src, int dst, const std::string& tag, double bytes, Purpose purpose,
                                   const Task& like, int sent_tensor, int received_tensor);
  void set_free_after(int tensor, int task);
  void add_memory();

  // --- plan_builder_compute.cpp ---
  // Adds one pass call group as an in-task collective over `devices` inside `tasks`.
  using AddCall = std::function<void(const AxisRules& axis, const PassCallGroup& g, const std::string& name,
                                     const std::vector<int>& devices, const std::vector<int>& tasks)>;
  void add_expert_group_calls(const AxisRules& axis, int w, int stage, int mb, bool backward,
                              const std::vector<PassCallGroup>& groups, const AddCall& add);
  size_t slot(int w, int stage, int mb, int j) const;
  bool tp_collectives(int w, int stage) const;  // the chunk's passes exchange between tensor-parallel ranks
  bool sharded(int w, int stage) const;         // sequence parallel: its boundaries are 1/t shards
  void prepare_boundaries(int w);
  void add_compute(int w);
  // `offload`: its stash goes to the host (activation offload) until its backward fetches it.
  void add_forward(int w, int stage, int mb, bool offload);
  std::vector<int> gather_inputs(const std::string& tp_name, const std::vector<int>& devices,
                                 const std::vector<int>& arrived, const std::vector<int>& slices, double whole_bytes,
                                 const Task& like);
  std::string tp_name(int w, int stage) const;  // the chunk's tensor-parallel group
  // The chunk's group on an in-rank axis: its name and devices.
  std::string group_name(const AxisRules& axis, int w, int stage) const;
  std::vector<int> group_devices(const AxisRules& axis, int w, int stage) const;
  void add_in_task_calls(int w, int stage, int mb, bool backward, const std::vector<int>& computes);
  void add_summed_gains(int w, int stage, int mb);
  // An in-task collective of no messages yet on the group's communicator, in `computes`.
  size_t add_in_task(const AxisRules& axis, CollectiveKind kind, const std::string& group_name,
                     const std::vector<int>& devices, double bytes, const std::vector<int>& computes);
  void add_backward(int w, int stage, int mb, OpKind kind);

  // --- plan_builder_pipeline.cpp ---
  void add_pipeline_transfers(int w);
  void connect(int w, int stage, int mb, OpKind kind);

  // --- plan_builder_sync.cpp ---
  std::map<int, int> last_compute_of_devices() const;
  std::map<std::tuple<int, int, int>, int> last_backward_of_chunks() const;
  void reserve();
  void add_allreduce_sync();
  void add_tied_embedding_sync(std::map<int, std::vector<int>>& syncs_of_device);
  // Returns each device's optimizer task.
  std::map<int, int> add_optimizers(const std::map<int, std::vector<int>>& syncs_of_device);
  void add_parameter_server_sync();
  double device_params(int device) const;

  // --- plan_builder_offload.cpp ---
  // Offload's optimizer step for a device's `params` (Layout::offload): gradients to the host,
  // the step on its CPUs, parameters back. Returns {first task, the copy back}.
  std::pair<int, int> add_offloaded_step(int device, int w, double params);
  // Activation offload: F's stash to the host once the forward is done (then freed on the
  // device), and back into a new stash before the backward, F's record then naming it.
  void offload_stash(int device, int w, int stage, int mb, OpRecord& f);
  void prefetch_stash(int device, int w, int stage, int mb, OpRecord& f);

  // --- plan_builder_zero.cpp ---
  int zero_stage() const;  // the layout's ZeRO stage where it shards (all-reduce, 2+ workers), else 0
  void check_zero() const;
  double shard(double params, int w) const;             // replica w's whole elements of a piece of `params`
  double piece_params(int w, int stage, int j) const;   // rank j's part of a chunk, whole
  double rank_params(int w, int stage, int j) const;    // ... less the experts its expert rank does not hold
  double unit_params(int w, int stage, int j) const;    // what one transient whole buffer holds of it
  int zero_messages(int w, int stage, double bytes) const;  // FSDP's units (stage 3) or buckets
  std::vector<int> replicas(int stage, int j) const;    // the piece's devices, worker by worker
  std::vector<double> zero_parts(const std::vector<int>& devices) const;  // builder::zero_parts, checked, remembered
  std::string replica_group_name(int stage, int j) const;
  // An expert rank's piece of layers [begin, end) over `members` (expert parallelism):
  // "edp l<begin>-<end - 1> e<r>", r their expert rank, and " t<j>" on a rank of several devices.
  std::string expert_piece_name(int begin, int end, const std::vector<int>& members, int stage, int j) const;
  CollectiveAlgorithm zero_algorithm() const;           // the layout's, where a scatter or gather runs it
  // The parameters a pass reads: its weights, or under stage 3 the whole copies all-gathers
  // make (made on first ask, for every replica): one, or under expert parallelism one per
  // piece (the dense part over every replica, the rank's experts over their holders);
  // read_params records the pass reading them.
  std::vector<int> pass_params(int w, int stage, int mb, OpKind pass, int j);
  void read_params(const std::vector<int>& tensors, int task);
  // Where a pass puts its weight gradients: it writes the gradient buffer, or from stage 2 the
  // transient whole buffer its reduce-scatter reads; a pass that adds to a buffer an earlier
  // pass made (stage 3 without resharding sums every micro-batch's) reads it instead, since a
  // transient tensor has one writer.
  void add_gradient_target(int w, int stage, int mb, int j, std::vector<int>& reads, std::vector<int>& writes);
  void add_zero_reduce_scatters(std::map<int, std::vector<int>>& syncs_of_device);
  void add_zero_gathers(const std::map<int, int>& optimizer_of_device);

  const model::Cluster& cluster_;
  const model::Network& net_;
  const Layout& layout_;
  const CostModel& cost_;
  const Schedule& schedule_;
  Plan& plan_;
  int compute_stream_ = 0;
  std::unordered_map<std::string, int> stream_ids_;
  std::map<std::pair<CommRole, std::vector<int>>, int> communicator_ids_;
  std::map<std::tuple<int, int, std::string>, int> channel_ids_;
  mutable std::map<std::vector<int>, std::vector<double>> zero_parts_;  // a piece's devices -> their shares
  std::vector<RankPrograms> programs_;        // per worker
  std::vector<std::vector<ChunkWork>> work_;  // per worker, per chunk
  ExpertSplit experts_;                       // the layout's expert split (one rank without an expert axis)
  std::vector<std::vector<OpRecord>> ops_;    // per worker, by op slot
  // Per worker, stage, tensor rank: the input activation (and its gradient) each
  // micro-batch's F (B) reads, created before the tasks that read them.
  std::vector<std::vector<int>> inputs_, output_grads_;  // per worker, by (stage, mb, j) slot
  // ... and where a transfer delivers a 1/t slice that the rank then all-gathers.
  std::vector<std::vector<int>> input_slices_, grad_slices_;
  std::vector<std::vector<int>> degrees_;        // per worker, per chunk: its rank's devices
  std::vector<std::vector<size_t>> slot_base_;   // per worker, per chunk: its first (mb, j) slot
  std::vector<int> sends_;                       // scratch of connect(): sends of one boundary
  std::string stream_name_;                      // scratch of transfer_stream()
  std::vector<std::vector<int>> weights_, grads_;        // per device: per chunk (in chunk order)
  std::vector<std::vector<int>> chunks_of_device_;       // per device: (worker, stage) packed as stage
  std::vector<double> shard_params_;                     // per device: the parameters its optimizer steps
  // ZeRO-3's all-gathers per device in gather-stream order: the task, the whole copy it
  // makes and the first pass that reads it.
  struct Gather {
    int task = -1, tensor = -1, first_reader = -1;
  };
  std::vector<std::vector<Gather>> gathers_;
  // Whole copies by (stage, mb, pass, j) (-1, -1 without resharding): per worker, one per piece.
  std::map<std::tuple<int, int, int, int>, std::vector<std::vector<int>>> gathered_;
  // Under expert parallelism, the data axis's pieces (data_parallel_segments), made once for
  // every pass's stage-3 gathers.
  std::optional<std::vector<Segment>> expert_segments_;
  std::map<std::tuple<int, int, int, int>, int> unsharded_;  // whole gradients by (w, stage, mb or -1, j)
};

}  // namespace hetflow::partition::builder
