#pragma once
// Whether a plan is safe for a back end that keeps one copy of each transient tensor for
// every iteration (the CUDA back end's device copies), instead of a buffer per instance as
// the engine's host memory has.
//
// With one copy, iteration i + 1's producer of a tensor overwrites what iteration i's
// readers use unless every reader of iteration i is done first. The plan must guarantee
// that order, not the timing of a run: a reader's end must happen before the producer's
// write by a chain of
//  - its dependencies (data and order edges, with their iteration offsets),
//  - program order on each stream (iteration after iteration),
//  - transfers and collectives, whose members cannot end before the members they need data
//    from have started (a receive before its send; an all-reduce before its last member; a
//    broadcast's receivers before the root; a reduce's root before the others). A send may
//    end before its receive has begun (NCCL buffers small messages), so nothing waits on it.
// A receive writes only once its send has started, so it is safe when a reader's end comes
// before either side's start; any other producer writes from its own start. A send has read
// its tensor once either side of the transfer has ended (the bytes have arrived).
//
// Persistent tensors (weights, gradients, optimizer state) are one copy by design and not
// checked. The analysis is conservative: in-task exchanges between tensor-parallel ranks
// are not counted as ordering, so a hazard it reports may be one that those exchanges
// prevent. Among the tensors one_device_copy_under_real_math selects, the plan shapes of
// CopyReuse.ThePlannersPlansAreSafeForOneCopyPerTensor have none (tested).
#include <functional>
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::exec {

struct CopyReuseHazard {
  int tensor = -1;
  int producer = -1;  // its task that writes iteration i + 1's instance
  int reader = -1;    // a task of iteration i not ordered before that write
};

// Every (tensor, reader) pair of `plan` at risk, in tensor order, among the transient
// tensors `one_copy` says are held once (all of them when it is empty). Work: one search
// over two unrolled iterations per reader.
std::vector<CopyReuseHazard> copy_reuse_hazards(const partition::Plan& plan,
                                                const std::function<bool(int tensor)>& one_copy = {});

// What the CUDA back end holds in one device copy when it runs real math: every transient
// tensor but a parameter server's pushes and pulls, which their receives hand to the host
// (the engine's buffer of each instance; the training's pulled weights).
bool one_device_copy_under_real_math(const partition::Plan& plan, int tensor);

// Throws PlanError naming the first hazards (and how many there are in all) when `plan` has
// any among the tensors `one_copy` selects; `holder` says who keeps one copy ("the CUDA back
// end's real math").
void require_no_copy_reuse_hazards(const partition::Plan& plan, const std::function<bool(int tensor)>& one_copy,
                                   const std::string& holder);

// "tensor 9 (activation on host/gpu2): recv #17 on host/gpu2 stream recv<0:act (worker 0,
// stage 0, micro-batch 0, peer 0) of iteration i + 1 may write it before forward #4 on
// host/gpu2 stream compute (worker 0, stage 1, micro-batch 0) of iteration i is done with it"
std::string describe(const partition::Plan& plan, const CopyReuseHazard& hazard);

}  // namespace hetflow::exec
