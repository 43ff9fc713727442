#include "exec/mailbox.hpp"

#include <algorithm>
#include <cstring>

#include "exec/backend.hpp"

namespace hetflow::exec {

std::shared_ptr<Lane::Packet> Mailbox::post(std::span<const std::byte> data, size_t size_bytes) {
  auto packet = std::make_shared<Packet>();
  packet->data.assign(size_bytes, std::byte{0});
  const size_t n = std::min(size_bytes, data.size());
  if (n > 0) std::memcpy(packet->data.data(), data.data(), n);
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(packet);
  }
  changed_.notify_all();
  return packet;
}

void Mailbox::take(const std::function<void(std::span<const std::byte>)>& consume) {
  std::shared_ptr<Packet> packet;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return stop_.load() || !queue_.empty(); });
    if (stop_.load()) throw Stopped();
    packet = std::move(queue_.front());
    queue_.pop_front();
  }
  consume(packet->data);  // the sender no longer touches the bytes once posted
  {
    std::lock_guard lock(mutex_);
    packet->taken = true;
  }
  changed_.notify_all();
}

void Mailbox::wait_taken(Packet& packet) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return stop_.load() || packet.taken; });
  if (!packet.taken) throw Stopped();
}

void Mailbox::wake() {
  { std::lock_guard lock(mutex_); }
  changed_.notify_all();
}

}  // namespace hetflow::exec
