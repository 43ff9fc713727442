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
// NCCL cannot put two ranks of one communicator on one GPU: two plan devices may share a GPU
// only when no communicator holds both.
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
};

struct CudaPlan {
  std::vector<int> gpus;           // per plan device: the CUDA ordinal it runs on
  std::vector<NcclGroup> groups;   // the communicators to create
  std::vector<int> group_of_task;  // per task: its group (transfers, collectives), -1 for compute
  std::vector<int> rank_of_task;   // per task: its rank in that group, -1 for compute
};

// The CUDA ordinal of each of `devices` plan devices among `visible` GPUs: device d on GPU d,
// or on requested[d] when a list is given (one entry per plan device). Throws Error saying
// "no CUDA device visible" when visible is 0 (with `why`, what the runtime said), PlanError
// when the plan has more devices than visible GPUs (both counts named), InputError for a list
// of the wrong length or an ordinal that is not visible.
std::vector<int> gpu_ordinals(int devices, int visible, std::span<const int> requested, const std::string& why = "");

// The communicators for `plan` with devices on `gpus`. Throws PlanError naming the channel
// whose sends or receives are on several streams, the collectives that members reach in
// different orders, or two members of one communicator on the same GPU.
CudaPlan cuda_plan(const partition::Plan& plan, std::vector<int> gpus);

}  // namespace hetflow::exec
