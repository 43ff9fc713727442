#pragma once
// The plan: what both back ends run. A task graph (Boost.Graph) of compute tasks,
// point-to-point transfers and collectives, plus each device's program order per stream.
// Every task carries what a back end needs (device, FLOPs, bytes, peer, stage, micro-batch,
// iteration); times are not part of a plan — back ends derive them from the cluster.
#include <string>
#include <string_view>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "partition/layout.hpp"

namespace hetflow::partition {

enum class TaskKind {
  forward,          // F: a chunk's forward pass for one micro-batch
  backward,         // B: its backward pass (input gradient only when the schedule splits)
  backward_weight,  // W: the weight gradient of a split backward
  optimizer,        // the optimizer step over a device's (or a server's) parameters
  send,             // one side of a point-to-point transfer; `group` pairs it with its recv
  recv,
  collective,       // one participant of a collective; `group` indexes Plan::collectives
};

// Why bytes move: lets traces and metrics account traffic by purpose.
enum class Purpose { compute, activation, gradient, tensor_parallel, data_parallel, ps_push, ps_pull };

std::string_view to_string(TaskKind k);
std::string_view to_string(Purpose p);
TaskKind parse_task_kind(std::string_view text);  // throws std::invalid_argument
Purpose parse_purpose(std::string_view text);

struct Task {
  TaskKind kind = TaskKind::forward;
  Purpose purpose = Purpose::compute;
  int device = -1;
  int stream = 0;  // index into Plan::streams
  int iteration = 0;
  int worker = -1;      // virtual worker, -1 for parameter-server tasks
  int stage = -1;       // chunk index in its virtual worker (model order)
  int microbatch = -1;  // -1 for per-iteration tasks (optimizer, sync)
  int layer_begin = 0;  // layers the task computes (or whose tensors it moves)
  int layer_end = 0;
  double flops = 0;            // compute tasks, including recompute_flops
  double recompute_flops = 0;  // part of flops that redoes forward work (recomputation)
  double memory_bytes = 0;     // compute tasks: device-memory traffic (roofline bound)
  double bytes = 0;            // send/recv: payload; collective: each participant's buffer
  int peer = -1;               // send: destination device; recv: source device
  int group = -1;              // send/recv: transfer id; collective: index in collectives
  bool operator==(const Task&) const = default;
};

struct Collective {
  CollectiveKind kind = CollectiveKind::all_reduce;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::ring;
  Purpose purpose = Purpose::data_parallel;
  double bytes = 0;           // buffer size on each participant
  std::vector<int> devices;   // participants, in ring order
  std::vector<int> tasks;     // the participants' tasks, same order
  bool operator==(const Collective&) const = default;
};

// Estimated memory of one device at its peak, by term.
struct DeviceMemory {
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;   // master weights + Adam moments (on servers under ps/wsp)
  double activations_bytes = 0; // stashed activations of the micro-batches in flight
  double workspace_bytes = 0;
  double capacity_bytes = 0;
  int peak_in_flight = 0;       // micro-batches whose activations are held at the peak
  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + workspace_bytes;
  }
  bool operator==(const DeviceMemory&) const = default;
};

// One stream of one device: its tasks in program order (each waits for the one before).
struct StreamProgram {
  int stream = 0;  // index into Plan::streams
  std::vector<int> tasks;
  bool operator==(const StreamProgram&) const = default;
};

// Data dependencies: an edge u -> v means task v needs task u's result.
using TaskGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;

struct Plan {
  static constexpr int kFormatVersion = 1;

  std::string cluster_name;
  std::string cluster_yaml;  // the cluster the plan was made for, so a plan file stands alone
  std::string network_name;
  int network_layers = 0;
  Layout layout;
  std::vector<std::string> device_names;  // index = device id
  std::vector<std::string> streams;       // stream names; Task::stream indexes this
  std::vector<Task> tasks;
  TaskGraph graph;
  std::vector<Collective> collectives;
  // programs[device]: the streams that device uses (in order of first use), each with its
  // task ids in program order. Sparse: a device has a handful of streams out of many names.
  std::vector<std::vector<StreamProgram>> programs;
  std::vector<DeviceMemory> memory;  // per device

  int device_count() const { return static_cast<int>(device_names.size()); }
  // Adds a task (and its graph vertex) and appends it to its device's stream program.
  int add_task(const Task& task);
  void add_dependency(int from_task, int to_task);
  // The task ids of one device stream in program order; empty when the device has none.
  const std::vector<int>& program(int device, int stream) const;
};

bool same_plan(const Plan& a, const Plan& b);  // everything, graph edges included

}  // namespace hetflow::partition
