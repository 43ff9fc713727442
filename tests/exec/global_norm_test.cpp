// The global norm's meeting: threads that add their devices' parts in any order each get
// the root of the parts summed in device order, bit for bit; a meeting a part never reaches
// ends on stop.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "exec/global_norm.hpp"
#include "exec_test_util.hpp"

namespace hetflow {
namespace {

TEST(GlobalNorm, EveryDeviceGetsTheRootOfThePartsSummedInDeviceOrder) {
  constexpr int kDevices = 4, kIterations = 20;
  exec::GlobalNorm norm(kDevices, kDevices, nullptr, {});
  const auto part = [](int device, int iteration) { return 1.0 / (3 + device) + 1e-3 * iteration * (device + 1); };
  std::vector<std::vector<double>> got(kDevices, std::vector<double>(kIterations));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int d = 0; d < kDevices; ++d) {
    threads.emplace_back([&, d] {
      for (int i = 0; i < kIterations; ++i) {
        if ((i + d) % 3 == 0) std::this_thread::yield();  // vary who comes first
        test_support::StubTask task(-1, i);
        got[static_cast<size_t>(d)][static_cast<size_t>(i)] = norm.meet(task, stop, d, part(d, i));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kIterations; ++i) {
    double sum = 0;
    for (int d = 0; d < kDevices; ++d) sum += part(d, i);
    for (int d = 0; d < kDevices; ++d) EXPECT_EQ(got[static_cast<size_t>(d)][static_cast<size_t>(i)], std::sqrt(sum));
  }
  EXPECT_EQ(norm.in_flight(), 0u);
}

TEST(GlobalNorm, AMeetingAPartNeverReachesEndsOnStop) {
  exec::GlobalNorm norm(2, 2, nullptr, {});
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop = true;
  });
  test_support::StubTask task;
  EXPECT_THROW(norm.meet(task, stop, 0, 1.0), exec::Stopped);
  stopper.join();
}

}  // namespace
}  // namespace hetflow
