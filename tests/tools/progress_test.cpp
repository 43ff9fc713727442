// The progress line: what it says, when it shows, and that it leaves no trace behind.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tools/progress.hpp"

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
