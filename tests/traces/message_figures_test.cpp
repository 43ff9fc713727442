// In-task messages in the figures: a message that holds its task's work is cut out of the
// compute and counted as exposed communication; one beside the work (a ring's sendrecv,
// Event::overlap_s) only for what the work waited for. The oracle: a trace made by hand.
#include <gtest/gtest.h>

#include "traces/figures.hpp"

using namespace hetflow;
using partition::TaskKind;

TEST(MessageFigures, AMessageBesideTheWorkExposesOnlyWhatTheWorkWaitedFor) {
  traces::Trace trace;
  trace.device_names = {"d0"};
  traces::Event forward;
  forward.task = 0, forward.device = 0, forward.stream = "compute", forward.kind = TaskKind::forward;
  forward.start_s = 0, forward.end_s = 10;
  traces::Event held = forward;  // 2-4: the work waits throughout
  held.kind = TaskKind::collective, held.purpose = partition::Purpose::tensor_parallel, held.message = 0;
  held.start_s = 2, held.end_s = 4;
  traces::Event beside = held;  // 5-9: the work goes on for 3 s, then waits 1 s
  beside.purpose = partition::Purpose::context_parallel, beside.message = 1;
  beside.start_s = 5, beside.end_s = 9, beside.overlap_s = 3;
  trace.events = {forward, held, beside};
  const std::vector<traces::DeviceTime> t = traces::device_times(trace, {0, 12});
  ASSERT_EQ(t.size(), 1u);
  EXPECT_DOUBLE_EQ(t[0].compute_s, 10 - 2 - 1);
  EXPECT_DOUBLE_EQ(t[0].exposed_comm_s, 2 + 1);
  EXPECT_DOUBLE_EQ(t[0].exposed_comm_by_purpose_s.at("tensor_parallel"), 2);
  EXPECT_DOUBLE_EQ(t[0].exposed_comm_by_purpose_s.at("context_parallel"), 1);
  EXPECT_DOUBLE_EQ(t[0].idle_s, 2);
  // Without its overlap the same message is exposed whole, as before rings existed.
  trace.events[2].overlap_s = 0;
  EXPECT_DOUBLE_EQ(traces::device_times(trace, {0, 12})[0].exposed_comm_s, 2 + 4);
}
