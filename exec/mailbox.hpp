#pragma once
// Messages between device threads: one FIFO per (sender, receiver, lane), so the k-th message
// posted meets the k-th take. A post copies the bytes; the sender may then wait until the
// receiver has taken them (a rendezvous, as NCCL's send returns once matched). Every wait
// ends with Stopped once the shared stop flag is set and wake() is called.
//
// `Lane` is that promise; `Mailbox` keeps it between threads of this process, and
// exec/ranks.hpp's lanes between processes (MPI ranks).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace hetflow::exec {

class Lane {
 public:
  struct Packet {
    virtual ~Packet() = default;
    std::vector<std::byte> data;
    bool taken = false;  // guarded by the lane
  };

  virtual ~Lane() = default;
  // Posts a copy of `data` (zero-padded to `size_bytes` when shorter); never blocks.
  virtual std::shared_ptr<Packet> post(std::span<const std::byte> data, size_t size_bytes) = 0;
  // Waits for the next packet, hands its bytes to `consume`, marks it taken.
  virtual void take(const std::function<void(std::span<const std::byte>)>& consume) = 0;
  // Waits until the receiver has taken `packet` (one this lane's post returned).
  virtual void wait_taken(Packet& packet) = 0;
  // After the stop flag is set: wakes every waiter (which then throws Stopped).
  virtual void wake() = 0;
};

class Mailbox final : public Lane {
 public:
  explicit Mailbox(const std::atomic<bool>& stop) : stop_(stop) {}
  std::shared_ptr<Packet> post(std::span<const std::byte> data, size_t size_bytes) override;
  void take(const std::function<void(std::span<const std::byte>)>& consume) override;
  void wait_taken(Packet& packet) override;
  void wake() override;

 private:
  const std::atomic<bool>& stop_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Packet>> queue_;
};

}  // namespace hetflow::exec
