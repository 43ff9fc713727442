#pragma once
// Plans as Chakra execution traces (MLCommons Chakra ET, schema 0.0.4: the workload format
// ASTRA-sim reads), and Chakra traces as plans, so that hetflow and ASTRA-sim can run the
// same work.
//
// Writing (one file per device, `<prefix>.<rank>.et`, rank = device id; plus
// `comm_group.json`, ASTRA-sim's process groups {"<pg_name>": [ranks]}): each file is the
// protobuf GlobalMetadata then one Node per task of the device, each length-delimited (a
// varint byte count, then the message), in an order that respects every dependency. Nodes:
//  - compute tasks: COMP_NODE, `num_ops` (FLOPs), `tensor_size` (memory bytes),
//    duration_micros the cost model's time (ASTRA-sim uses it without a roofline model);
//  - send / recv: COMM_SEND_NODE / COMM_RECV_NODE, `comm_dst` / `comm_src` (rank),
//    `comm_size` (bytes), `comm_tag` (the plan's channel: the k-th send of a tag meets its
//    k-th receive, as in MPI);
//  - collective participants: COMM_COLL_NODE, `comm_type` (ALL_REDUCE, ALL_GATHER,
//    REDUCE_SCATTER, BROADCAST, REDUCE), `comm_size` (the collective's bytes), `pg_name`
//    (its communicator's number in comm_group.json), `involved_dim` [true];
//  - a pass with in-task collectives (partition::Collective::at): its parts of work, a
//    COMP_NODE each with its share of the FLOPs, bytes and time, with one COMM_COLL_NODE per
//    message between them (`comm_size` the message's bytes), in the order the pass performs
//    them (partition::Plan::inside); the last part keeps the task's node id;
//  - `ctrl_deps`: the task before it on its stream and its order edges (a part or message:
//    the node before it); `data_deps`: the producers of the tensors it reads. `is_cpu_op`
//    false everywhere.
// hetflow's own attributes (`hetflow_kind`, `hetflow_stream`, `hetflow_purpose`,
// `hetflow_flops` and `hetflow_memory_bytes` as exact doubles, `hetflow_tag`,
// `hetflow_algorithm`, `hetflow_root`, `hetflow_later_deps`: the edges into a task from
// earlier iterations, such as a parameter server's pull or WSP's staleness bound, which a
// one-iteration trace cannot hold; and what joins a pass's parts back: on each part
// `hetflow_part_of` (the task's node id), `hetflow_part_begin` and `hetflow_part_end` (the
// part of its work, from 0 to 1), on its last part the task's exact `hetflow_task_flops`,
// `hetflow_task_recompute_flops` and `hetflow_task_memory_bytes`; on each message
// `hetflow_collective` (the collective's index in the plan), `hetflow_message` and
// `hetflow_at` (its point)) keep what Chakra has no field for; ASTRA-sim skips them.
//
// Reading builds a plan for a cluster with at least as many devices as files: rank r runs on
// device r. Without hetflow's attributes (a trace from elsewhere) every COMP_NODE is a
// forward task on the rank's "compute" stream (ASTRA-sim runs one compute node at a time),
// sends and receives run on a stream per peer and tag in file order, a rank's collectives of
// one process group on a stream of their own, ring all-reduce unless said otherwise. A
// node's dependencies become order edges. The k-th collective node of a process group on
// every member is one collective (their type and size must agree). With hetflow's marks a
// pass's parts (which follow one another in the file, its messages between them) join into
// one task where its first part is, and the messages of one in-task collective on every
// member of its process group into one collective at their points (every member's must
// agree); without them each part is a compute task and each message a collective. The plan
// has no tensors (Chakra's inputs and outputs are not sizes hetflow can account), so its
// memory is not modelled; its network is one placeholder layer and its layout has the
// workload policy (partition::kWorkloadPolicy) and no virtual workers: samples and bubbles
// are not defined.
#include <map>
#include <string>
#include <vector>

#include "model/cluster.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan.hpp"

namespace hetflow::traces {

struct ChakraFile {
  std::string name;   // e.g. "hetflow.3.et", "comm_group.json"
  std::string bytes;
};

// Throws PlanError when no order of the plan's tasks exists (a deadlock), or the plan is
// folded (partition::Layout::folded: it lacks the replicas' ranks).
std::vector<ChakraFile> write_chakra(const partition::Plan& plan, const partition::CostModel& cost,
                                     const std::string& prefix = "hetflow");

// `ranks[r]` is rank r's file (name for messages, bytes); `comm_group` the text of
// comm_group.json, or empty when there is none (a process group is then every rank that has
// a node naming it). Throws InputError naming the file, the node and the field for a file
// that is not a Chakra trace, is truncated or corrupt, names a rank or dependency that does
// not exist, whose sends, receives and collectives do not pair up, or whose parts and
// in-task messages do not make whole passes and collectives the members agree on; and for a
// cluster with fewer devices than ranks.
partition::Plan read_chakra(const std::vector<ChakraFile>& ranks, const std::string& comm_group,
                            const model::Cluster& cluster, const std::string& name);

}  // namespace hetflow::traces
