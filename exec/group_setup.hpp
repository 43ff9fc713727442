#pragma once
// Making communicator groups across processes, so that a failure in one process stops them
// all and none waits for ever (the CUDA back end's NCCL communicators; plain C++, so it is
// tested over MPI ranks without a GPU).
//
// Every process walks the groups in one order and takes part in those it holds a rank of.
// For each: the group's id maker makes an id (make_id), the group's processes exchange what
// they have (Ranks::exchange: the id, nothing, or the first failure this process has seen),
// and each creates its ranks from the id (create). A process that has seen a failure, its
// own or one an exchange brought, goes on through the exchanges sending it but creates
// nothing more; so it reaches every process that shares a group with one that knows it.
// A last exchange among all processes tells those that share no group with any. (A failure
// inside `create` is not seen by that group's other members until their own create returns:
// theirs must end by a deadline of its own, as NCCL's creation does in the back end.)
#include <atomic>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "exec/ranks.hpp"

namespace hetflow::exec {

struct GroupSetup {
  size_t groups = 0;
  std::function<std::vector<int>(size_t g)> processes;  // those holding a rank of g, ascending
  std::function<int(size_t g)> id_maker;                 // one of them
  std::function<std::string(size_t g)> what;             // for messages: "the NCCL communicator of ..."
  std::function<std::vector<std::byte>(size_t g)> make_id;                    // on the id maker; may throw
  std::function<void(size_t g, std::span<const std::byte> id)> create;       // this process's ranks; may throw
};

// Walks the groups as above as process `me` (`processes` null: one process, which holds every
// rank; then the first exception is thrown as it is). Under several processes, after the
// walk: this process's own failure is rethrown as it was; one it heard of throws Error
// "rank R failed: " and R's message, R the rank it happened on. Stopped (the stop flag, seen
// by an exchange) ends the walk at once.
void set_up_groups(const GroupSetup& setup, int me, const Ranks* processes, const std::atomic<bool>& stop);

}  // namespace hetflow::exec
