// Waiting for the data loader, apart from the rest of idle time. The oracle: a trace made by
// hand whose loads, passes, communication and gaps are known exactly.
#include <gtest/gtest.h>

#include "traces/figures.hpp"

using namespace hetflow;
using partition::TaskKind;

namespace {

traces::Event event(int device, const char* stream, TaskKind kind, int microbatch, double start_s, double end_s, int stage = 0) {
  traces::Event e;
  e.device = device;
  e.stream = stream;
  e.kind = kind;
  e.purpose = kind == TaskKind::collective ? partition::Purpose::data_parallel : partition::Purpose::compute;
  e.microbatch = microbatch;
  e.stage = stage;
  e.start_s = start_s;
  e.end_s = end_s;
  return e;
}

}  // namespace

// Device 0 feeds its pipeline: loads of micro-batches 0-2 on its load stream, the stage-0
// forwards waiting for them on its compute stream, a collective that overlaps one wait (input
// wait: a faster loader, not faster communication, would hide it behind the forward), and a
// bubble that is not a wait for input. Device 1 has no loader.
TEST(InputWait, IsTheIdleTimeWhileTheNextForwardWaitsForItsLoad) {
  traces::Trace trace;
  trace.device_names = {"d0", "d1"};
  trace.events = {
      event(0, "load", TaskKind::load, 0, 0, 10),
      event(0, "compute", TaskKind::forward, 0, 10, 12),  // waited 0-10 for its load
      event(0, "load", TaskKind::load, 1, 10, 20),
      event(0, "compute", TaskKind::forward, 1, 20, 22),  // waited 12-20, communicating 14-16 meanwhile
      event(0, "comm", TaskKind::collective, -1, 14, 16),
      event(0, "load", TaskKind::load, 2, 20, 24),
      event(0, "compute", TaskKind::backward, 0, 22, 25),
      event(0, "compute", TaskKind::forward, 2, 25, 26),  // its load ended at 24: no wait
      event(0, "compute", TaskKind::backward, 1, 28, 30),  // 26-28: a bubble, not the loader's
      event(1, "compute", TaskKind::forward, 0, 12, 14, 1),
  };
  const std::vector<traces::DeviceTime> t = traces::device_times(trace, {0, 30});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_DOUBLE_EQ(t[0].compute_s, 2 + 2 + 3 + 1 + 2);
  EXPECT_DOUBLE_EQ(t[0].exposed_comm_s, 0);
  EXPECT_DOUBLE_EQ(t[0].idle_s, 20);
  EXPECT_DOUBLE_EQ(t[0].input_wait_s, 10 + 8);
  EXPECT_DOUBLE_EQ(t[1].input_wait_s, 0);
  // Clipped to a window, as the rest: 5-21 holds 5 s of the first wait and 8 of the second.
  EXPECT_DOUBLE_EQ(traces::device_times(trace, {5, 21})[0].input_wait_s, 5 + 8);
  // The windows themselves, by the forward's iteration (0 here).
  const std::vector<traces::InputWait> waits = traces::input_waits(trace);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].device, 0);
  EXPECT_DOUBLE_EQ(waits[0].window.from_s, 0);
  EXPECT_DOUBLE_EQ(waits[0].window.to_s, 10);
  EXPECT_DOUBLE_EQ(waits[1].window.from_s, 12);
  EXPECT_DOUBLE_EQ(waits[1].window.to_s, 20);
}
