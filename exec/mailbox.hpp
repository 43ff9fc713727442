#pragma once
// In-process messages between device threads: one FIFO per (sender, receiver, lane), so the
// k-th message posted meets the k-th take. A post copies the bytes; the sender may then wait
// until the receiver has taken them (a rendezvous, as NCCL's send returns once matched).
// Every wait ends with Stopped once the shared stop flag is set and wake() is called.
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

class Mailbox {
 public:
  struct Packet {
    std::vector<std::byte> data;
    bool taken = false;  // guarded by the mailbox's mutex
  };

  explicit Mailbox(const std::atomic<bool>& stop) : stop_(stop) {}
  // Posts a copy of `data` (zero-padded to `size_bytes` when shorter); never blocks.
  std::shared_ptr<Packet> post(std::span<const std::byte> data, size_t size_bytes);
  // Waits for the next packet, hands its bytes to `consume`, marks it taken.
  void take(const std::function<void(std::span<const std::byte>)>& consume);
  // Waits until the receiver has taken `packet`.
  void wait_taken(const Packet& packet);
  // After the stop flag is set: wakes every waiter (which then throws Stopped).
  void wake();

 private:
  const std::atomic<bool>& stop_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Packet>> queue_;
};

}  // namespace hetflow::exec
