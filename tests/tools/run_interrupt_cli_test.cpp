// Ctrl-C during `hetflow run`: every thread (and under mpirun every rank) stops, the run says
// so and exits 4, and the trace of what completed is written, marked partial, and reads back
// in `timeline` and `replay`. The signal is sent once the run's progress line (--progress)
// shows it past its first step: the test waits on the run, not on a time.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"
#include "traces/trace_io.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::slurp;

namespace {

#ifdef HETFLOW_SANITIZED
constexpr int kPatience_s = 300;
#else
constexpr int kPatience_s = 60;
#endif

constexpr int kSteps = 10000;  // far more than runs before the signal: the run cannot end first

// Starts argv[0] with its output in files; its own process, so a signal reaches it alone.
pid_t start(const std::vector<std::string>& argv, const std::filesystem::path& out, const std::filesystem::path& err) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
#ifdef HETFLOW_SANITIZED
  ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
  const int in = ::open("/dev/null", O_RDONLY);
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(in, STDIN_FILENO);
  ::dup2(o, STDOUT_FILENO);
  ::dup2(e, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

// Waits until the progress line says the run is in its third step (two whole steps done, so a
// replay has some); false when it never does.
bool wait_for_step_3(pid_t pid, const std::filesystem::path& err) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kPatience_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = slurp(err);
    for (size_t at = text.find("step "); at != std::string::npos; at = text.find("step ", at + 1)) {
      if (std::atoi(text.c_str() + at + 5) >= 3 && text.find('/', at) != std::string::npos) return true;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // it ended on its own
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int exit_status(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The iterations of which the trace holds every one of the plan's tasks.
int whole_iterations(const hetflow::traces::Trace& trace, size_t tasks) {
  std::vector<size_t> per_iteration;
  for (const auto& e : trace.events) {
    if (per_iteration.size() <= static_cast<size_t>(e.iteration)) per_iteration.resize(static_cast<size_t>(e.iteration) + 1);
    ++per_iteration[static_cast<size_t>(e.iteration)];
  }
  int whole = 0;
  while (static_cast<size_t>(whole) < per_iteration.size() && per_iteration[static_cast<size_t>(whole)] == tasks) ++whole;
  return whole;
}

// The processes `parent` started (mpirun's ranks).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) + "/children");
  for (pid_t child = 0; in >> child;) out.push_back(child);
  return out;
}

enum class Target { process, last_child };

// Interrupts a run of `plan` started with `prefix` (empty, or mpirun and its arguments),
// signalling the process started or its last child (an MPI rank), and checks what it
// leaves: the exit status (-1: any but 0), the message, the partial trace, timeline and
// replay of it.
void interrupt_and_check(const std::vector<std::string>& prefix, int sig, Target target, int status,
                         const std::string& said) {
  const auto dir = scratch_dir();
  const std::string plan = (dir / "plan.json").string(), csv = (dir / "partial.csv").string();
  ASSERT_EQ(run_hetflow("plan --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --pipeline 2 "
                        "--microbatches 4 --workspace 0 --out " + plan).status,
            0);
  std::vector<std::string> argv = prefix;
  for (const char* a : {HETFLOW_BIN, "run", "--compute", "proxy", "--progress", "--warmup", "0"}) argv.emplace_back(a);
  for (const std::string& a : {std::string("--plan"), plan, std::string("--steps"), std::to_string(kSteps),
                               std::string("--trace"), csv}) {
    argv.push_back(a);
  }
  const auto out = dir / "run.out", err = dir / "run.err";
  std::filesystem::remove(out);  // (a file left by an earlier test must not be read as this run's progress)
  std::filesystem::remove(err);
  std::filesystem::remove(csv);
  const pid_t pid = start(argv, out, err);
  ASSERT_GT(pid, 0);
  if (!wait_for_step_3(pid, err)) {
    ::kill(pid, SIGKILL);
    exit_status(pid);
    FAIL() << "no progress line past step 2 appeared:\n" << slurp(err) << slurp(out);
  }
  pid_t signalled = pid;
  if (target == Target::last_child) {
    const std::vector<pid_t> ranks = children_of(pid);
    ASSERT_FALSE(ranks.empty());
    signalled = ranks.back();
  }
  ASSERT_EQ(::kill(signalled, sig), 0);
  const int got = exit_status(pid);
  if (status >= 0) {
    EXPECT_EQ(got, status) << slurp(out) << slurp(err);
  } else {
    EXPECT_NE(got, 0) << slurp(out) << slurp(err);
  }
  const std::string report = slurp(out);
  EXPECT_NE(report.find("THE RUN DID NOT COMPLETE"), std::string::npos) << report;
  EXPECT_NE(report.find(said), std::string::npos) << report;
  EXPECT_NE(report.find("wrote the partial trace to " + csv), std::string::npos) << report;

  const hetflow::traces::Trace trace = hetflow::traces::read_trace_csv(slurp(csv), csv);
  EXPECT_NE(trace.partial.find(said), std::string::npos) << trace.partial;
  EXPECT_EQ(trace.planned_iterations, kSteps);
  const size_t tasks = nlohmann::json::parse(slurp(plan))["tasks"].size();
  const int whole = whole_iterations(trace, tasks);
  EXPECT_GE(whole, 2);  // the progress line said step 3 had begun
  EXPECT_LT(whole, kSteps);

  const auto timeline = run_hetflow("timeline " + csv + " -o " + (dir / "t.svg").string());
  EXPECT_EQ(timeline.status, 0) << timeline.err;
  EXPECT_NE(timeline.out.find("a partial trace (" + trace.partial + "): what completed is drawn"), std::string::npos)
      << timeline.out;
  const auto replay = run_hetflow("replay " + csv + " --plan " + plan);
  EXPECT_EQ(replay.status, 0) << replay.err << replay.out;
  const std::string iterations = std::to_string(whole) + " complete iterations of " + std::to_string(kSteps);
  EXPECT_NE(replay.out.find("a partial trace (" + trace.partial + "): its " + iterations), std::string::npos)
      << replay.out;
}

}  // namespace

TEST(RunInterrupt, CtrlCStopsTheThreadsExits4AndKeepsAPartialTrace) {
  interrupt_and_check({}, SIGINT, Target::process, 4, "interrupted by SIGINT (Ctrl-C) during step ");
}

TEST(RunInterrupt, SigtermDoesTheSame) {
  interrupt_and_check({}, SIGTERM, Target::process, 4, "interrupted by SIGTERM during step ");
}

// mpirun passes a Ctrl-C on to its ranks as SIGTERM (OpenMPI); every rank stops, rank 0
// gathers what all of them completed and writes it. mpirun's own status is then its own
// (OpenMPI 4.1 says 1 for a job it was told to end), not the ranks' 4.
TEST(RunInterrupt, CtrlCToMpirunStopsEveryRank) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI";
#else
  interrupt_and_check({HETFLOW_MPIEXEC, "--oversubscribe", "-np", "2"}, SIGINT, Target::process, -1,
                      "rank 0: interrupted by SIGTERM during step ");
#endif
}

// A signal to one rank alone (a scheduler ending one process): the others stop with it,
// rank 0 writes the whole partial trace and every rank exits 4, as mpirun then does.
TEST(RunInterrupt, SigtermToOneRankStopsEveryRank) {
#ifndef HETFLOW_MPIEXEC
  GTEST_SKIP() << "built without MPI";
#else
  interrupt_and_check({HETFLOW_MPIEXEC, "--oversubscribe", "-np", "2"}, SIGTERM, Target::last_child, 4,
                      "rank 1: interrupted by SIGTERM during step ");
#endif
}
