#pragma once
// The processes that run one plan together: the ranks `mpirun -np N hetflow run ...` starts
// (OpenMPI). Each rank runs the streams of a contiguous block of the plan's devices (so the
// devices of a node stay together) and meets the others only through what is here:
//  - lanes: one direction of messages between two devices on different ranks, with the
//    in-process Mailbox's promises (exec/mailbox.hpp): the k-th post meets the k-th take, a
//    post's sender can wait until the receiver has taken it (a synchronous MPI send);
//  - exchange: every listed rank gets every other's bytes (the global gradient norm);
//  - the engine's rounds: a non-blocking sum over the ranks the watchdog polls, so progress,
//    completion, a failure or a stall anywhere is seen everywhere;
//  - gather to rank 0 and broadcast from it (traces, losses, weights after the run), and the
//    offset of this rank's clock to rank 0's (Cristian's algorithm: the round trip of least
//    delay out of several), so traces share one time axis.
// Every wait polls the caller's stop flag and ends with Stopped once it is set.
//
// Outside mpirun (no OMPI_COMM_WORLD_SIZE in the environment) there is one rank, MPI is never
// initialised and nothing here sends a message; the same holds in a build without MPI, where
// a process mpirun starts with more than one rank is refused with a clear error.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "exec/mailbox.hpp"
#include "model/error.hpp"

namespace hetflow::exec {

class Ranks {
 public:
  // This process's place among the ranks mpirun started (MPI_Init_thread with
  // MPI_THREAD_MULTIPLE on first use; MPI_Finalize at exit). Throws Error when mpirun started
  // several ranks and MPI is not built in or lacks thread support.
  static Ranks& world();
  // For a process about to exit on an error: when it has joined several ranks (world() ran
  // under mpirun), ends the whole job with `status` (MPI_Abort), since the others would wait
  // for it in their next collective and MPI_Finalize would wait for them, for ever. Returns
  // when it has not, or runs alone.
  static void abort_job(int status);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool alone() const { return size_ == 1; }
  // The rank that runs `device` of a plan with `devices` devices: contiguous blocks.
  int owner(int device, int devices) const;
  // Throws PlanError when there are more ranks than devices (a rank would have nothing).
  void check_devices(int devices) const;

  // Messages from rank `from` to rank `to` on `tag` (>= 1; tag 0 is the exchange's). Tags
  // name lanes: two lanes between the same ranks need different tags.
  std::unique_ptr<Lane> lane(int from, int to, int tag, const std::atomic<bool>& stop) const;
  int max_tag() const;

  // Every rank of `among` (ascending, this rank included) calls it in the same order; each
  // gets every member's bytes, in the order of `among`.
  std::vector<std::vector<std::byte>> exchange(std::span<const int> among, std::span<const std::byte> mine,
                                               const std::atomic<bool>& stop) const;

  // A non-blocking sum over all ranks, polled: the first call starts a round with `mine`;
  // later calls return true once the round is complete, with the totals in `total` (the
  // next call then starts the next round). Every rank must keep polling until it sees the
  // totals it ends on, so that no rank leaves a round unfinished. From one thread.
  bool poll_sum(std::span<const long long> mine, std::vector<long long>& total);

  // Blocking, from the thread that runs the plan, after (or before) the stream threads.
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine) const;  // at rank 0; empty elsewhere
  std::vector<std::byte> broadcast(std::span<const std::byte> from_root) const;        // rank 0's bytes everywhere
  void barrier() const;
  // Every rank, before each run's lanes and exchanges are made: they get a communicator of
  // their own, so a message a stopped run left unreceived (MPI cannot withdraw a send) never
  // meets a later run's receive.
  void begin_run();
  // What to add to this rank's `now_s()` to read rank 0's `now_s()` (0 at rank 0).
  double clock_offset_s(const std::function<double()>& now_s) const;

  ~Ranks();
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

 private:
  Ranks() = default;
  struct Mpi;
  std::unique_ptr<Mpi> mpi_;  // null when alone
  int rank_ = 0, size_ = 1;
};

// Plain values in and out of byte vectors, for what ranks send each other (the same binary
// on the same kind of host, so native layout).
template <class T>
void put(std::vector<std::byte>& out, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}
// Their count, then the values: what ByteReader::get_into reads back after the count.
template <class T>
void put_counted(std::vector<std::byte>& out, std::span<const T> values) {
  static_assert(std::is_trivially_copyable_v<T>);
  put(out, static_cast<std::uint64_t>(values.size()));
  const auto* p = reinterpret_cast<const std::byte*>(values.data());
  out.insert(out.end(), p, p + values.size_bytes());
}
inline void put_string(std::vector<std::byte>& out, const std::string& s) {
  put(out, static_cast<std::uint64_t>(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  explicit ByteReader(std::vector<std::byte>&&) = delete;  // it would read a vector already gone
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  std::string get_string() {
    const auto n = static_cast<size_t>(get<std::uint64_t>());
    const std::byte* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  template <class T>
  void get_into(std::span<T> out) {
    if (!out.empty()) std::memcpy(out.data(), take(out.size_bytes()), out.size_bytes());
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  const std::byte* take(size_t n) {
    if (n > bytes_.size() - at_) throw Error("a message between ranks is shorter than its contents say");
    const std::byte* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

}  // namespace hetflow::exec
