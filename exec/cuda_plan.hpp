#pragma once
// What the CUDA back end (exec/cuda_backend.hpp) derives from a plan before it touches a GPU:
// which GPU runs each plan device, and which NCCL communicators it creates, with the one each
// transfer and collective task issues on and its rank there. Plain C++, so it is built and
// tested everywhere.
//
// Why these communicators. NCCL's rules: on one communicator every member issues the same
// operations in the same order, and no two threads issue on it at once; the engine calls
// Backend::run from one thread per device stream, concurrently. So:
//  - a channel gets a communicator of its own, of two ranks (source 0, destination 1). A
//    channel's sends are on one stream of its source and its receives on one stream of its
//    destination (checked here, as validation does), so each rank is driven by one engine
//    thread, in program order, iteration after iteration: the k-th ncclSend meets the k-th
//    ncclRecv, which is the plan's rule. A communicator shared by two channels could be
//    driven by two threads at once, or pair one channel's message with another's receive.
//  - collectives get one per (plan communicator, the stream each member's task is on): each
//    member's rank is driven by one thread, and every member must reach the group's
//    collectives in the same order in its program (checked here). Ranks are the plan
//    communicator's order, so a collective's root index is its NCCL root.
//  - a communicator whose members all-reduce inside their compute tasks (real math's tensor
//    parallelism) gets the group of (communicator, each member's compute stream: the one its
//    forward tasks are on), the one its collectives on those streams use if they exist: the
//    compute stream's thread drives it, and both kinds of calls come in program order.
// NCCL cannot put two ranks of one communicator on one GPU: two plan devices may share a GPU
// only when no communicator holds both.
//
// Under mpirun (exec/ranks.hpp) each process runs a contiguous block of the plan's devices on
// its node's GPUs after those of the node's lower ranks (first_gpus) and creates only its
// devices' ranks of each communicator. The process that runs a group's first member makes the group's NCCL unique id
// and sends it to the group's other processes; every process walks the groups in the same
// order, so each pair of processes meets its groups in the same order too.
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

// One NCCL communicator to create.
struct NcclGroup {
  std::vector<int> devices;  // plan devices, in rank order
  std::string what;          // for messages: "channel 3 (gpu0 -> gpu1, act)"
  bool channel = false;      // a channel's: rank 0 sends, rank 1 receives; else collectives
};

struct CudaPlan {
  std::vector<int> gpus;           // per plan device: the CUDA ordinal it runs on (-1: another process's)
  std::vector<NcclGroup> groups;   // the communicators to create
  std::vector<int> group_of_task;  // per task: its group (transfers, collectives), -1 for compute
  std::vector<int> rank_of_task;   // per task: its rank in that group, -1 for compute
  std::vector<int> owner;          // per plan device: the process (MPI rank) that runs it
  int process = 0;                 // this one
  std::map<int, int> in_task_group;  // plan communicator -> the group its in-task all-reduces use

  bool local(int device) const { return owner[static_cast<size_t>(device)] == process; }
  // The processes that hold a rank of group `g`, ascending; the first member's makes its id.
  std::vector<int> processes(size_t g) const;
  int id_maker(size_t g) const { return owner[static_cast<size_t>(groups[g].devices.front())]; }
};

// Which process runs each of `devices` plan devices when `processes` share them in
// contiguous blocks (Ranks::owner's rule): all 0 for one process.
std::vector<int> device_owners(int devices, int processes, const std::function<int(int)>& owner_of);

// The CUDA ordinal of each of `devices` plan devices among `visible` GPUs: device d on GPU d,
// or on requested[d] when a list is given (one entry per plan device). Throws Error saying
// "no CUDA device visible" when visible is 0 (with `why`, what the runtime said), PlanError
// when the plan has more devices than visible GPUs (both counts named), InputError for a list
// of the wrong length or an ordinal that is not visible.
std::vector<int> gpu_ordinals(int devices, int visible, std::span<const int> requested, const std::string& why = "");
// Under mpirun: the devices `owner` gives to `process` on its node's GPUs from `first` on, its
// i-th device on GPU first + i (or requested[d], one entry per plan device), the others -1;
// the same errors, counting this process's devices.
std::vector<int> gpu_ordinals(int devices, int visible, std::span<const int> requested, const std::string& why,
                              std::span<const int> owner, int process, int first = 0);

// The first GPU of each process: processes that see the same GPUs (the same name in
// `hosts`, one per process: the host and its CUDA_VISIBLE_DEVICES) take consecutive GPUs in
// rank order, each as many as `owner` gives it devices. Processes of one host each shown
// only its own GPUs (`srun --gpus-per-task`) are named apart, and each starts at 0.
std::vector<int> first_gpus(const std::vector<std::string>& hosts, std::span<const int> owner);

// The communicators whose collectives run inside compute tasks: the plan's in-task ones, and
// under real math's tensor parallelism every tensor-role group (the decoder exchanges there,
// as the plan's in-task collectives list).
std::vector<int> in_task_communicators(const partition::Plan& plan, bool tensor_parallel_math);

// The communicators for `plan` with devices on `gpus`, run by the processes `owner` says
// (empty: all by this one). Throws PlanError naming the channel whose sends or receives are
// on several streams, the collectives that members reach in different orders, or two members
// of one communicator on the same GPU of one process.
// `in_task`: the plan communicators whose members all-reduce inside compute tasks (PlanError
// when a member has no forward task, compute tasks on two streams, or its compute tasks and
// the group's collectives in another order than the first member's).
CudaPlan cuda_plan(const partition::Plan& plan, std::vector<int> gpus, std::vector<int> owner = {}, int process = 0,
                   const std::vector<int>& in_task = {});

// Tensor and sequence parallelism's collectives move activations (or their gradients); the
// others, gradients or their norm.
bool activation_collective(const partition::Collective& c);

// What the CUDA back end does not run yet, refused in prepare() (PlanError naming the layout's
// field and the option to plan without): ZeRO's sharded state over two or more replicas, and
// offload. (Their transient whole buffers, shards and host copies are the CPU back end's so
// far: exec/training.hpp.)
void require_cuda_layout(const partition::Plan& plan);

// What real math on the CUDA back end cannot run, refused before any GPU is touched (PlanError
// naming the collective): a gradient collective other than an all-reduce, and a tensor- or
// sequence-parallel collective whose pieces NCCL's in-place all-gather and reduce-scatter
// cannot take (floats not divisible by the members). `tensor_bytes`: what the training
// exchanges of each tensor (Training::buffer_bytes).
void require_real_collectives(const partition::Plan& plan, const std::function<size_t(int)>& tensor_bytes);

}  // namespace hetflow::exec
