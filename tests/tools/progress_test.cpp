// The progress line: what it says, when it shows, and that it leaves no trace behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "tools/progress.hpp"
#include "tools/run_progress.hpp"

using namespace hetflow;

namespace {

std::string contents(std::FILE* f) {
  std::rewind(f);
  std::string text;
  for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
  return text;
}

sim::Progress at(double elapsed_s) {
  sim::Progress p;
  p.simulated_s = 3.2;
  p.fraction_done = 0.417;
  p.activities = 1200000;
  p.elapsed_s = elapsed_s;
  return p;
}

}  // namespace

TEST(ProgressLine, SaysWhereTheSimulationStands) {
  EXPECT_EQ(tools::progress_text(at(4)),
            "simulating: 41% of tasks, 3.2 s simulated, 1.2 M activities (300 K/s), 4 s elapsed");
}

TEST(ProgressLine, QuietOffATerminalAndDuringTheFirstSecond) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    tools::ProgressLine line(file);  // a file is not a terminal
    EXPECT_FALSE(line.reporter());
  }
  EXPECT_EQ(contents(file), "");
  {
    tools::ProgressLine line(file, /*force=*/true);
    const auto report = line.reporter();
    ASSERT_TRUE(report);
    report(at(0.5));
    EXPECT_EQ(contents(file), "");  // short runs show nothing
    report(at(4));
    EXPECT_EQ(contents(file), "\r\033[K" + tools::progress_text(at(4)));
  }
  // Erased when the run ends, so the report that follows starts on a clean line.
  EXPECT_EQ(contents(file), "\r\033[K" + tools::progress_text(at(4)) + "\r\033[K");
  std::fclose(file);
}

// The search's line while it simulates: which plan, its estimate, the best so far, how far.
TEST(SearchProgressLine, SaysWhichPlanItSimulatesAndTheBestSoFar) {
  search::SimulationProgress p;
  p.index = 3;
  p.plan = "balanced t2 p8 d1";
  p.estimate = 23.2;
  p.best = 24.7;
  p.simulation = at(4);
  EXPECT_EQ(tools::search_progress_text(p, false), "simulating plan 3 (estimate 23.2 s, best so far 24.7 s): 41% of tasks, 4 s elapsed");
  p.best = 0;
  EXPECT_EQ(tools::search_progress_text(p, false), "simulating plan 3 (estimate 23.2 s): 41% of tasks, 4 s elapsed");
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    tools::SearchProgressLine line(false, file);  // a file is not a terminal
    EXPECT_FALSE(line.scoring());
    EXPECT_FALSE(line.simulation());
  }
  EXPECT_EQ(contents(file), "");
  std::fclose(file);
}

namespace {

exec::RunProgress step(int iteration, long long done, double elapsed_s) {
  exec::RunProgress p;
  p.iteration = iteration;
  p.iterations = 4;
  p.iteration_done = done;
  p.iteration_tasks = 120;
  p.completed = 120LL * iteration + done;
  p.elapsed_s = elapsed_s;
  p.last_iteration_s = iteration > 0 ? 2.4 : 0;
  return p;
}

}  // namespace

// Inside a step: which step, its tasks done of its tasks, elapsed against the prediction,
// and once a step has ended how long it took (and its loss, under real math).
TEST(RunProgressLine, SaysTheStepItsTasksAndTheTimeAgainstThePrediction) {
  EXPECT_EQ(tools::run_progress_text(step(0, 37, 1.5), 12, std::nan("")), "step 1/4: 37/120 tasks, 1.5 s of 12 s predicted");
  EXPECT_EQ(tools::run_progress_text(step(1, 3, 5.1), 12, 5.4321), "step 2/4: 3/120 tasks, 5.1 s of 12 s predicted; step 1 took 2.4 s, loss 5.432100");
  EXPECT_EQ(tools::run_progress_text(step(1, 3, 5.1), 0, std::nan("")), "step 2/4: 3/120 tasks, 5.1 s elapsed; step 1 took 2.4 s");
  EXPECT_EQ(tools::run_progress_text(step(4, 0, 9), 12, std::nan("")), "all 4 steps done, 9 s of 12 s predicted; step 4 took 2.4 s");
}

// Off a terminal: nothing unless asked (--progress); asked, a line of its own at most once a
// second, nothing to erase at the end.
TEST(RunProgressLine, OffATerminalOnlyWhenAskedAndALineASecond) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    tools::RunProgressLine line(12, nullptr, true, false, file);
    EXPECT_FALSE(line.reporter());
  }
  {
    tools::RunProgressLine line(12, nullptr, false, true, file);  // not rank 0
    EXPECT_FALSE(line.reporter());
  }
  EXPECT_EQ(contents(file), "");
  {
    tools::RunProgressLine line(12, nullptr, true, true, file);
    const auto report = line.reporter();
    ASSERT_TRUE(report);
    report(step(0, 10, 0.1));
    report(step(0, 50, 0.6));  // within the second: not written
    report(step(1, 3, 1.2));
  }
  EXPECT_EQ(contents(file), tools::run_progress_text(step(0, 10, 0.1), 12, std::nan("")) + "\n" +
                                tools::run_progress_text(step(1, 3, 1.2), 12, std::nan("")) + "\n");
  std::fclose(file);
}
