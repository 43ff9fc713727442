#pragma once
// Runs the built `hetflow` binary as a user would, capturing exit status, stdout and stderr.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/scratch.hpp"

namespace hetflow::test_support {

struct RunResult {
  int status = -1;
  std::string out, err;
};

// `args` is appended to the command line as is (quote it yourself). `shell_prefix` runs in
// the same shell first, e.g. "ulimit -v 4000000;" to bound the address space.
inline RunResult run_hetflow(const std::string& args, const std::string& shell_prefix = "") {
  const auto dir = scratch_dir();
  const auto out = dir / "stdout", err = dir / "stderr";
  const std::string cmd = shell_prefix + " " + std::string(HETFLOW_BIN) + " " + args + " </dev/null >" + out.string() +
                          " 2>" + err.string();
  const int raw = std::system(cmd.c_str());
  RunResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

#ifdef HETFLOW_MPIEXEC
// The shell prefix that runs `hetflow` as `ranks` MPI processes (run_hetflow's second
// argument). CI runs as root, which OpenMPI refuses unless told. Under AddressSanitizer
// OpenMPI's own allocations are still held when the ranks exit, in plugins it has unloaded
// by then (so no suppression can name them): not this program's leaks, and without turning
// leak detection off every rank would exit non-zero.
inline std::string under_mpirun(int ranks) {
#ifdef HETFLOW_SANITIZED
  const std::string leaks = "ASAN_OPTIONS=detect_leaks=0 ";
#else
  const std::string leaks;
#endif
  return leaks + "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " HETFLOW_MPIEXEC " --oversubscribe -np " +
         std::to_string(ranks);
}
#endif

// The loss of each step in a run's text report: from "  loss " to the end of its line.
inline std::string loss_lines(const std::string& out) {
  std::string lines;
  for (size_t at = out.find("  loss "); at != std::string::npos; at = out.find("  loss ", at + 1)) {
    lines += out.substr(at, out.find('\n', at) - at) + "\n";
  }
  return lines;
}

}  // namespace hetflow::test_support
