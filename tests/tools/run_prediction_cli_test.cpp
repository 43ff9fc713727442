// hetflow run at a terminal: the predicted wall time before it starts, and --yes asked for a
// run predicted past ten minutes. `script` (util-linux) gives the command a terminal.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;

namespace {
bool have_script() { return std::system("command -v script >/dev/null 2>&1") == 0; }

// The hetflow command line run with a terminal as its stdin, stdout and stderr; what the
// terminal showed comes back as `out`.
hetflow::test_support::RunResult at_a_terminal(const std::string& args) {
  const auto out = hetflow::test_support::scratch_dir() / "terminal";
  const std::string cmd = "script -qec '" + std::string(HETFLOW_BIN) + " " + args + "' /dev/null </dev/null >" + out.string();
  const int raw = std::system(cmd.c_str());
  hetflow::test_support::RunResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = hetflow::test_support::slurp(out);
  return r;
}
}  // namespace

// GPT-2 124M for 1,001 iterations on two CPU devices: hours (each iteration is 4 samples x
// 1024 tokens x 6 x 124M FLOPs, hundreds of GFLOP, on this host's cores). Refused at a
// terminal without --yes, before anything runs.
TEST(RunPrediction, ALongRunAtATerminalAsksForYes) {
  if (!have_script()) GTEST_SKIP() << "no `script` command to give hetflow a terminal";
  const auto r = at_a_terminal("run --cluster cpu-2 --model gpt2-124m --steps 1000");
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  const std::regex refusal(
      "hetflow: <command line>: --yes: this run is predicted to take about [0-9.]+ (h|min) for 1001 iterations on this "
      "machine; give --yes to start it \\(or fewer --steps, a smaller model, or --flop-scale\\)\\s*");
  EXPECT_TRUE(std::regex_match(r.out, refusal)) << r.out;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
}

// A short run says its prediction and starts; without a terminal nothing is said or asked.
TEST(RunPrediction, AShortRunSaysItsPredictionAndStarts) {
  const std::string run = "run --cluster cpu-2 --model llama:layers=2,hidden=64,heads=4,kv_heads=2,seq=64,vocab=256 "
                          "--pipeline 2 --steps 1";
  if (have_script()) {
    const auto r = at_a_terminal(run);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("hetflow: predicted wall time about \\S+ \\S+ for 2 iterations on "
                                                    "this machine\r?\n")))
        << r.out;
    EXPECT_NE(r.out.find("ran llama:"), std::string::npos) << r.out;
  }
  const auto quiet = run_hetflow(run);
  EXPECT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}
