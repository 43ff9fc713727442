#pragma once
// The plan: the program both back ends run, and nothing else they need. One training
// iteration's tasks (compute, point-to-point transfers, collectives), each device's program
// order per stream, the tensors tasks read and write with their lifetimes, the communicators
// and channels communication uses, and the number of iterations: back ends run the
// iteration that many times. The cluster and the network it was made for are embedded, so a
// plan file stands alone. Times are not part of a plan: back ends derive them.
//
// Semantics every back end keeps:
//  - A stream runs its tasks in program order, iteration after iteration.
//  - A task starts when the task before it on its stream is done and so are its
//    dependencies: the producer of every transient tensor it reads (data edges, implied by
//    the tensor table) and its explicit order edges. An order edge with offset k makes
//    iteration i of `to` wait for iteration i - k of `from` (WSP's staleness bound).
//  - The k-th send on a channel meets the k-th receive on it (in each iteration).
//  - A collective runs when all its participants have reached it; its point-to-point steps
//    are partition/collective_steps.hpp's.
//  - A transient tensor is allocated when its producer starts and may be freed when its
//    `free_after` task ends; persistent tensors (weights, gradients, optimizer state) live
//    for the whole run.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/graph/compressed_sparse_row_graph.hpp>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/collective.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

enum class TaskKind {
  forward,          // F: a chunk's forward pass for one micro-batch
  backward,         // B: its backward pass (input gradient only when the schedule splits)
  backward_weight,  // W: the weight gradient of a split backward
  optimizer,        // the optimizer step over a device's (or a server's) parameters
  send,             // one side of a point-to-point transfer on a channel
  recv,
  collective,       // one participant of a collective (Plan::collectives)
  load,             // a node's data loader: a micro-batch's samples read and preprocessed (bytes: read)
  to_host,          // offload: a device's bytes copied to its node's host memory over PCIe
  host_optimizer,   // offload: the optimizer step of a device's parameters, on its node's CPUs
  to_device,        // offload: bytes copied back from host memory to the device over PCIe
};

// Why bytes move: lets traces and metrics account traffic by purpose.
enum class Purpose {
  compute, activation, gradient, tensor_parallel, sequence_parallel, data_parallel, embedding, ps_push, ps_pull,
  gradient_norm,  // the optimizer's clipping norm, all-reduced over a virtual worker's devices
  offload,        // copies between a device and its host's memory (Layout::offload)
  context_parallel,  // keys and values gathered over a context group, their gradients scattered back
  expert_parallel    // tokens' copies sent to their experts' holders over an expert group, and back
};

enum class TensorKind {
  activation,       // a chunk boundary's output (or a received one), per micro-batch
  activation_grad,  // its gradient, flowing backward
  stash,            // what a forward keeps for its backward (Korthikanti's activation memory)
  partial_sum,      // tensor-parallel partial results before their collective (a forward's)
  weight,           // persistent: parameters held on a device
  weight_grad,      // persistent: their gradient buffer
  optimizer_state,  // persistent: fp32 master weights and Adam moments
  workspace,        // scratch a task needs while it runs (full recomputation's one layer)
  pushed_grad,      // a gradient pushed to a parameter server, until its update
  gathered_weight,  // ZeRO-3: a chunk's parameters all-gathered whole for the passes that read them (a unit at a time)
  unsharded_grad,   // ZeRO 2-3: a chunk's gradients whole, until their reduce-scatter (a unit at a time)
  host_state,       // persistent, in host memory (offload): fp32 master weights, Adam moments, gradients
  host_stash,       // a stash in host memory (activation offload), from its copy out to its copy back
};

// The parallel axis a communicator spans, and so what its members exchange (Megatron's
// process-group kinds). Back ends choose communicators by role, never by name.
enum class CommRole {
  tensor,         // a pipeline rank's tensor-parallel group (and sequence parallelism's)
  pipeline,       // two neighbouring pipeline ranks: activations and their gradients
  data,           // the replicas of a layer range's shard: gradient synchronisation
  embedding,      // a worker's first and last chunk: tied embedding gradients
  server,         // a device and the parameter server it pushes to and pulls from
  gradient_norm,  // a virtual worker's devices: the clipping norm
  context,        // a context group's devices at one position: keys and values of the sequence
  expert,         // an expert group's devices at one position: the dispatch's and combine's all-to-alls
  unspecified,    // a plan imported from a trace that does not say
};

std::string_view to_string(TaskKind k);
std::string_view to_string(Purpose p);
std::string_view to_string(TensorKind k);
std::string_view to_string(CommRole r);
// These throw std::invalid_argument naming the accepted values.
TaskKind parse_task_kind(std::string_view text);
Purpose parse_purpose(std::string_view text);
TensorKind parse_tensor_kind(std::string_view text);
CommRole parse_comm_role(std::string_view text);
// The role of the communicators that carry traffic of this purpose (compute: unspecified).
CommRole role_of(Purpose p);
bool is_persistent(TensorKind k);  // weight, weight_grad, optimizer_state
// A pipeline pass: forward, backward or backward_weight (what a schedule orders).
bool is_pass(TaskKind k);
// Work on a device's compute units: a pass or the optimizer step.
bool is_compute(TaskKind k);
// A copy between a device and its node's host memory: to_host or to_device.
bool is_host_copy(TaskKind k);

struct Task {
  TaskKind kind = TaskKind::forward;
  Purpose purpose = Purpose::compute;
  int device = -1;
  int stream = 0;       // index into Plan::streams
  int worker = -1;      // virtual worker, -1 for parameter-server tasks
  int stage = -1;       // chunk index in its virtual worker (model order)
  int microbatch = -1;  // -1 for per-iteration tasks (optimizer, sync)
  int layer_begin = 0;  // layers the task computes (or whose tensors it moves)
  int layer_end = 0;
  double flops = 0;            // compute tasks, including recompute_flops
  double recompute_flops = 0;  // part of flops that redoes forward work (recomputation)
  double memory_bytes = 0;     // device-memory traffic: a compute task's (roofline); a collective's own read first
  double bytes = 0;            // send/recv: payload; collective: Collective::bytes
  int channel = -1;            // send/recv: index into Plan::channels
  int collective = -1;         // collective: index into Plan::collectives
  bool operator==(const Task&) const = default;
};

// A group of devices created once and used by collectives and transfers: a tensor-parallel
// group, a pipeline neighbour pair, a data-parallel group, a parameter server's pair... Its
// members' places on the layout's axes are Plan::coords of its devices.
struct Communicator {
  std::string name;          // for people: "tp w0 r1", "pair 3-4", "dp l40-44 t0", ...
  std::vector<int> devices;  // in ring order
  CommRole role = CommRole::unspecified;
  bool operator==(const Communicator&) const = default;
};

// A directed point-to-point channel: messages from `src` to `dst` with this tag are matched
// in order. Channels with different tags never match each other's messages.
struct Channel {
  int src = -1;
  int dst = -1;
  std::string tag;        // "act", "grad", "push", "pull"
  int communicator = -1;  // the pair (or group) it belongs to
  bool operator==(const Channel&) const = default;
};

// A collective is either a task of its own on each member (a gradient bucket's all-reduce), or
// runs inside a compute task of each member (Megatron's per-layer tensor-parallel collectives
// inside a chunk's forward): then `tasks` are those compute tasks and `at` lists, for each of
// its messages, the part of the task's work done before it. A compute task performs the
// messages of its in-task collectives in the order of their points (Plan::inside), so that
// every member meets them in the same order.
struct Collective {
  CollectiveKind kind = CollectiveKind::all_reduce;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::ring;
  Purpose purpose = Purpose::data_parallel;
  int communicator = -1;  // its participants, in ring order
  double bytes = 0;       // partition/collective.hpp's convention
  int root = 0;           // broadcast/reduce: index of the root in the communicator
  int messages = 1;       // back-to-back collectives of bytes / messages (CollectiveSpec::messages)
  std::vector<int> tasks; // one per communicator device, same order
  // In-task: one point in [0, 1] per message, ascending; empty for a collective with tasks
  // of its own.
  std::vector<double> at;
  // In-task messages that overlap the work (a ring attention's exchanges): message m starts
  // at at[m] while the work goes on, and the work waits for it at until[m] (at[m] <= until[m]
  // <= 1, and no later than the task's next message starts). Empty: every message holds the
  // work at its own point until it is done.
  std::vector<double> until;
  // all_to_all: the share of every member's buffer bound for each member (CollectiveSpec::
  // parts); empty: even.
  std::vector<double> parts;
  bool in_task() const { return !at.empty(); }
  bool operator==(const Collective&) const = default;
};

// One message of an in-task collective, as a compute task performs it (Plan::inside).
struct InTaskCall {
  int collective = -1;
  int message = 0;  // which of its messages (Collective::at)
  double at = 0;    // the part of the task's work done before it
  double until = 0; // where the work waits for it (Collective::until; `at` for one that holds the work)
  bool overlaps() const { return until > at; }
};

struct Tensor {
  TensorKind kind = TensorKind::activation;
  int device = -1;
  std::vector<std::int64_t> shape;  // elements per dimension
  model::Precision dtype = model::Precision::fp16;
  double bytes = 0;
  int producer = -1;    // the task that writes it; -1 for persistent tensors
  int free_after = -1;  // the task after which it may be freed; -1 for persistent tensors
  bool operator==(const Tensor&) const = default;
};

// An explicit ordering edge (data edges come from the tensor table). offset: iterations
// between `from` and `to` (0: the same iteration). fraction: `to` may start once `from`, a
// compute task, has done this part of its work (Megatron's --overlap-grad-reduce: a bucket's
// all-reduce starts when the backward has made its gradients); 1, when `from` ends.
// Back ends that cannot see inside a task start `to` when `from` ends, which is later.
struct OrderEdge {
  int from = -1;
  int to = -1;
  int offset = 0;
  double fraction = 1;
  bool operator==(const OrderEdge&) const = default;
};

// Estimated memory of one device at its peak, by term.
struct DeviceMemory {
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;    // master weights + Adam moments (on servers under ps/wsp)
  double activations_bytes = 0;  // stashes alive at the peak (and recomputation workspace)
  double buffers_bytes = 0;      // boundary activations, their gradients, partial sums alive then
  double workspace_bytes = 0;    // the layout's reserve: cuBLAS/NCCL buffers, fragmentation
  // ZeRO: parameters gathered whole and gradients not yet reduce-scattered, alive at the peak
  // (gathered_weight and unsharded_grad tensors).
  double gathered_bytes = 0;
  double capacity_bytes = 0;
  // Offload: what the device keeps in its node's host memory (host_state tensors, and the
  // peak of its host_stash ones), not part of total_bytes(); the node's devices together
  // must fit model::NodeHost::memory_bytes.
  double host_bytes = 0;
  int peak_in_flight = 0;        // micro-batch stashes alive at the peak
  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + buffers_bytes + workspace_bytes +
           gathered_bytes;
  }
  bool operator==(const DeviceMemory&) const = default;
};

// One stream of one device: its tasks in program order (each waits for the one before).
struct StreamProgram {
  int stream = 0;  // index into Plan::streams
  std::vector<int> tasks;
  bool operator==(const StreamProgram&) const = default;
};

// Edge property: offset in iterations (see OrderEdge), and whether a tensor implies it.
struct Dependency {
  int offset = 0;
  bool data = false;
  double fraction = 1;  // see OrderEdge
};
// Compressed sparse rows: the graph is made once from all its edges (Plan::finish), in a few
// allocations, and read many times (ordering, validation, back ends).
using TaskGraph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, Dependency>;

struct Plan {
  static constexpr int kFormatVersion = 3;

  model::Cluster cluster;  // the cluster the plan was made for
  model::Network network;  // and the network
  Layout layout;           // layout.iterations: how often back ends run the iteration
  std::vector<std::string> device_names;  // index = device id (the cluster's devices)
  // coords[device]: where it sits on the layout's axes (layout.device_coords). A task's
  // coordinates are its own worker, stage and micro-batch and its device's coordinates.
  std::vector<AxisCoords> coords;
  std::vector<std::string> streams;       // stream names; Task::stream indexes this
  std::vector<Communicator> communicators;
  std::vector<Channel> channels;
  std::vector<Tensor> tensors;
  std::vector<Task> tasks;
  std::vector<Collective> collectives;
  std::vector<OrderEdge> order;  // explicit ordering edges, as added
  TaskGraph graph;               // data edges (from tensors) and order edges together (finish())
  // programs[device]: the streams that device uses (in order of first use), each with its
  // task ids in program order. Sparse: a device has a handful of streams out of many names.
  std::vector<std::vector<StreamProgram>> programs;
  std::vector<DeviceMemory> memory;  // per device
  // plan_fingerprint(*this) once computed (partition/plan_io.hpp): traces record it. A cache,
  // not content: same_plan ignores it.
  std::string fingerprint;

  int device_count() const { return static_cast<int>(device_names.size()); }
  int iterations() const { return layout.iterations; }

  // Lookups by id. Ids are ints in the file and in every reference between tables; these
  // keep the conversion to an index in one place. Unchecked (validation checks every id).
  const Task& task(int id) const { return tasks[static_cast<size_t>(id)]; }
  Task& task(int id) { return tasks[static_cast<size_t>(id)]; }
  const Tensor& tensor(int id) const { return tensors[static_cast<size_t>(id)]; }
  Tensor& tensor(int id) { return tensors[static_cast<size_t>(id)]; }
  const Collective& collective(int id) const { return collectives[static_cast<size_t>(id)]; }
  const Channel& channel(int id) const { return channels[static_cast<size_t>(id)]; }
  const Communicator& communicator(int id) const { return communicators[static_cast<size_t>(id)]; }
  const std::string& device_name(int id) const { return device_names[static_cast<size_t>(id)]; }
  const AxisCoords& coords_of(int device) const { return coords[static_cast<size_t>(device)]; }
  const std::string& stream_name(int id) const { return streams[static_cast<size_t>(id)]; }

  // Adds a task that reads and writes the given tensors (ids of existing tensors) and
  // appends it to its device's stream program. A transient tensor it writes whose producer
  // is unset becomes its product.
  int add_task(const Task& task, std::span<const int> reads = {}, std::span<const int> writes = {});
  // (Re)builds `graph` from the tasks: the order edges and the data edges the tensor table
  // implies (producer -> each reader of a transient tensor). Call after the last task is
  // added, before anything reads the graph; references out of range are skipped (validation
  // reports them). Building it once at the end is much cheaper than vertex by vertex.
  void finish();
  int add_tensor(const Tensor& tensor);
  // Records an order edge; rebuilds the graph when it was already built (finish()).
  void add_order(int from_task, int to_task, int offset = 0, double fraction = 1);
  int add_channel(const Channel& channel);
  int add_communicator(const Communicator& communicator);
  std::span<const int> reads(int task) const;
  std::span<const int> writes(int task) const;
  // The in-task collective messages a compute task performs, in the order it performs them
  // (by point, then collective id, then message); empty for other tasks. Made by finish().
  std::span<const InTaskCall> inside(int task) const;
  // The tasks that read each tensor, in task order (derived from the tasks' reads).
  std::vector<std::vector<int>> consumers() const;
  // The task ids of one device stream in program order; empty when the device has none.
  const std::vector<int>& program(int device, int stream) const;
  // The other end of a transfer task (send: the channel's dst; recv: its src).
  int peer(int task) const;
  const std::vector<int>& members(const Collective& c) const {
    return communicator(c.communicator).devices;
  }

  // Reads and writes of every task in one array: task t's reads are
  // refs[ref_begin[t], ref_begin[t] + read_count[t]), its writes follow.
  std::vector<int> refs;
  std::vector<std::uint32_t> ref_begin;
  std::vector<std::uint16_t> read_count, write_count;

 private:
  bool finished_ = false;  // finish() ran: add_order keeps the graph up to date
  void index_in_task_calls();  // finish()'s: inside_begin_ and inside_
  // inside(t) is inside_[inside_begin_[t], inside_begin_[t + 1]) (empty until finish()).
  std::vector<std::uint32_t> inside_begin_;
  std::vector<InTaskCall> inside_;
};

bool same_plan(const Plan& a, const Plan& b);  // everything, graph edges included

}  // namespace hetflow::partition
