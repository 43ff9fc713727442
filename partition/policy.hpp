#pragma once
// Policies build a layout from a cluster, a network and the user's options. A new policy is
// one new policy_*.cpp plus one line in policy.cpp.
#include <optional>
#include <string>
#include <vector>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

// What `hetflow plan` takes, in Megatron's vocabulary. 0 means "choose for me".
struct PlanOptions {
  std::string policy = "uniform";
  model::Precision precision = model::Precision::fp16;
  int tensor = 1;
  int pipeline = 0;  // uniform/balanced: default 1
  int data = 0;      // default: as many virtual workers as the devices allow
  // Context parallelism (Layout::axes): workers per context group, each 1/context of every
  // sequence (uniform and balanced; the other policies refuse it).
  int context = 1;
  // Expert parallelism (Layout::experts): its size, the routing model, the dispatch's
  // algorithm and a placement given expert by expert (empty: contiguous, or by speed).
  Experts experts;
  // Place the experts by their expert ranks' speed and memory (place_experts_by_speed)
  // instead of contiguously; the placement above must then be empty.
  bool experts_by_speed = false;
  int virtual_stages = 1;
  int micro_batch = 1;
  int global_batch = 0;  // samples per iteration over all virtual workers
  int microbatches = 0;  // per virtual worker; default 2 x pipeline depth (when no global batch)
  // Layers per chunk in model order (pipeline x virtual stages counts summing to the layer
  // count): fixed cuts for uniform and balanced. Empty: the policy cuts.
  std::vector<int> stage_layers;
  // Placement (uniform, balanced): the axes innermost first, e.g. "tensor,pipeline,data" to
  // keep a pipeline's ranks together and spread the replicas; empty: Megatron's
  // tensor,data,pipeline (partition/axis.hpp). The other policies place devices their own way.
  std::string axis_order;
  // A layout file (--layout): the user's own virtual workers, devices and cuts; policy
  // layout-file. Empty: none.
  std::string layout_file;
  // Policy grouped: its virtual workers by GPU type, e.g. "*x4 V100-16, 2x(2 A100-80 + 1 T4)"
  // (see parse_groups). Empty for the other policies.
  std::string groups;
  std::string schedule = "1f1b";
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  std::optional<SyncKind> sync;  // default: allreduce, or wsp for the HetPipe policies
  CollectiveAlgorithm allreduce = CollectiveAlgorithm::ring;
  double bucket_bytes = 25.0 * 1024 * 1024;
  bool overlap_grad_reduce = false;  // Sync::overlap_grad_reduce
  int zero_stage = 0;                // Sharding::stage
  bool reshard_after_forward = true; // Sharding::reshard_after_forward
  ZeroShares zero_shares = ZeroShares::equal;  // Sharding::shares
  ContextComm context_comm = ContextComm::all_gather;  // Layout::context_comm
  bool offload_optimizer = false;    // Offload::optimizer
  bool offload_activations = false;  // Offload::activations
  int staleness = 0;
  int iterations = 1;
  bool fp32_grad_accumulation = false;
  KernelOptions kernels;  // flash attention, Megatron's fusions
  // Plan one replica for all identical virtual workers (Layout::folded): simulations of many
  // data-parallel replicas take a fraction of the time and memory.
  bool fold = false;
  double workspace_bytes = 1024.0 * 1024 * 1024;
  bool operator==(const PlanOptions&) const = default;
};

struct PolicyInfo {
  std::string name;
  std::string description;
};
// The policies that build a layout from the options alone. Beside them, policy layout-file
// reads the user's own layout (PlanOptions::layout_file; see partition/layout_file.hpp).
const std::vector<PolicyInfo>& policies();

// Policy grouped's workers: groups of identical virtual workers, each worker so many GPUs of
// each named type.
//   groups := group (',' group)*
//   group  := [COUNT 'x'] shape        COUNT: workers of this shape (default 1), or '*': as
//                                     many as the GPUs left by the groups before allow
//   shape  := term ('+' term)* | '(' term ('+' term)* ')'
//   term   := N TYPE ['tp' T]          N GPUs of TYPE (the cluster's spelling, any case) in
//                                     tensor-parallel ranks of T GPUs each (default: `tensor`)
// GPUs no group takes stay idle. Workers may so differ in tensor-parallel degree, and so may
// the types within one worker ("2x(4 A100-80 tp4 + 4 V100-16 tp1)"). parse_groups throws InputError (field `groups`) naming the
// group at fault: a malformed term, a type the cluster lacks, a type named twice in a worker.
struct GroupTerm {
  int gpus = 0;
  std::string type;
  int tensor = 0;  // GPUs per tensor-parallel rank; 0: PlanOptions::tensor
  bool operator==(const GroupTerm&) const = default;
};
struct WorkerGroup {
  int count = 1;  // 0: '*'
  std::vector<GroupTerm> terms;
  bool operator==(const WorkerGroup&) const = default;
};
std::vector<WorkerGroup> parse_groups(const std::string& text, const model::Cluster& cluster);
// The canonical spelling ("*x4 V100-16, 2x(2 A100-80 tp2 + 1 T4)"), which parse_groups reads back.
std::string groups_to_string(const std::vector<WorkerGroup>& groups);

// The message refusing `precision` on this cluster: which GPU types have no arithmetic for
// it (bf16 before Ampere: P100, V100, T4, ...) and how many devices of each; empty when every
// device has it. Frameworks run such a part's bf16 at its FP32 speed at best; hetflow refuses
// it rather than score a plan against a peak the part does not have.
std::string precision_unsupported(const model::Cluster& cluster, model::Precision precision);
// Throws InputError on `precision` with that message when it is not empty.
void require_precision_supported(const model::Cluster& cluster, model::Precision precision);

// Throws InputError naming the option at fault (e.g. "--pipeline") when the options do not
// fit the cluster or the network, or the precision is not the hardware's.
Layout make_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                   const CostModel& cost);

// --- shared by the policies (policy_*.cpp) ---
namespace policy_detail {

// The common part of every layout: everything but the workers.
Layout base_layout(const PlanOptions& options, const std::string& policy, SyncKind default_sync);

// Megatron-style uniform split of the layers into `chunks`: transformer layers (or all
// layers, when there are none) spread evenly, embedding with the first chunk, head with the
// last. Throws InputError when there are fewer layers than chunks.
std::vector<Stage> uniform_stages(const model::Network& network, int chunks, int ranks);

// Chunks of the given layer counts (options.stage_layers), chunk k on rank k % ranks.
// Throws InputError naming --stage-layers unless there are `chunks` positive counts summing
// to the network's layer count.
std::vector<Stage> stages_from_counts(const model::Network& network, const std::vector<int>& counts, int chunks,
                                      int ranks);

// Micro-batches per virtual worker from the options (same for every worker).
int microbatches_per_worker(const PlanOptions& options, int workers, int pipeline);

// Splits the layers of one virtual worker over its ranks (in the order given), minimising the
// slowest stage under memory limits; ranks[r] is a tensor group. Returns the stages and the
// bottleneck time per micro-batch. When nothing fits, ignores memory (validation then reports
// the overflow) and says so through `fits`.
struct Balanced {
  std::vector<Stage> stages;
  double bottleneck_s = 0;
  bool fits = true;
};
// `replicas_memory_bytes` (replicas_memory_bytes below; 0: equal shares) bounds each
// device's part of ZeRO's sharded state under shares by memory.
Balanced balance_stages(const model::Network& network, const Layout& layout,
                        const std::vector<std::vector<int>>& ranks, int microbatches, const CostModel& cost,
                        double replicas_memory_bytes = 0);

// What the balancer divides by under ZeRO's shares by memory (ZeroShares::memory): the
// replicas' memory, each replica (`workers`, every one's ranks) counted at its devices' mean,
// so that a device of m bytes holds m / that of every sharded term. zero_parts gives each
// piece's members their memories over the piece's, which is this where a replica's devices
// are alike or every replica places the same memories at the same ranks. 0 where the layout
// does not shard by memory.
double replicas_memory_bytes(const Layout& layout, const std::vector<std::vector<std::vector<int>>>& workers,
                             const CostModel& cost);

// The bottleneck of given chunks on `ranks`, and whether they fit, measured as
// balance_stages measures its own.
Balanced measure_stages(const model::Network& network, const Layout& layout, const std::vector<std::vector<int>>& ranks,
                        std::vector<Stage> stages, int microbatches, const CostModel& cost);

// Tries every order of the GPU types along the pipeline (ranks of one type stay together)
// and keeps the one with the smallest bottleneck; reorders `ranks` accordingly. Each order
// is balanced, or, when `fixed` chunks are given, measured with those cuts.
Balanced balance_with_order(const model::Network& network, const Layout& layout, std::vector<std::vector<int>>& ranks,
                            int microbatches, const CostModel& cost, const std::vector<Stage>& fixed = {},
                            double replicas_memory_bytes = 0);

// balance_with_order for the virtual workers of one layout, remembering each result: a later
// worker whose ranks match an earlier one's position by position (sizes, and the GPU type,
// compute and memory of each rank's first device, and the routes between every pair of
// them: all the balancer reads) gets that worker's order and cuts without balancing again.
class BalanceMemo {
 public:
  // `replicas_memory_bytes`: balance_stages's, the same for every worker of the layout.
  explicit BalanceMemo(double replicas_memory_bytes = 0) : replicas_memory_bytes_(replicas_memory_bytes) {}
  Balanced balance(const model::Network& network, const Layout& layout, std::vector<std::vector<int>>& ranks,
                   int microbatches, const CostModel& cost, const std::vector<Stage>& fixed = {});

 private:
  struct Entry {
    std::vector<std::vector<int>> ranks;  // as given
    std::vector<size_t> order;            // position -> index into ranks, as balanced
    int microbatches = 0;
    Balanced result;
  };
  std::vector<Entry> done_;
  double replicas_memory_bytes_ = 0;
};

// Splits `total` micro-batches over workers in proportion to 1 / bottleneck (largest
// remainder, at least one each).
std::vector<int> split_microbatches(int total, const std::vector<double>& bottleneck_s);

// Splits `total` micro-batches over pipelines so that the last to finish finishes soonest,
// by the pipeline model (m v + p - 1) x bottleneck (depth p, v chunks per rank, the slowest
// chunk's time per micro-batch): at least one each, then one at a time to the worker that
// would finish it first (ties to the lower index), which minimises the largest finish time.
std::vector<int> split_microbatches_by_makespan(int total, const std::vector<double>& bottleneck_s,
                                                const std::vector<int>& depth, int virtual_stages);

// Where ps and wsp keep each layer's parameters and optimizer state
// (Layout::sync.layer_server, one device per layer); allreduce layouts are left alone.
enum class ServerPlacement {
  every_node,  // HetPipe: the first GPU of every node; layers to the least loaded by parameters
  used_nodes,  // the same over the nodes the layout runs on, each at its first device there
  local,       // each layer on the device that runs it in the first virtual worker (ED-local)
};
void place_layer_servers(Layout& layout, const model::Cluster& cluster, const model::Network& network,
                         ServerPlacement placement);

}  // namespace policy_detail

Layout make_uniform_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                           const CostModel& cost);
Layout make_balanced_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                            const CostModel& cost);
Layout make_hetpipe_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                           const CostModel& cost);
Layout make_grouped_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                           const CostModel& cost);
Layout make_layout_file_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                               const CostModel& cost);

}  // namespace hetflow::partition
