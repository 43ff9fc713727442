#pragma once
// Ctrl-C (SIGINT) and SIGTERM as a request to stop a run, not as the end of the process:
// while an InterruptOnSignal lives, the first such signal sets a flag the engine polls
// (EngineOptions::interrupt), so the run stops every thread (and, under mpirun, every rank),
// and its caller still writes what completed. A second signal ends the process as the
// signal would (its default action): a run that does not stop can still be ended.
#include <atomic>
#include <string>

namespace hetflow::exec {

class InterruptOnSignal {
 public:
  // Installs the handlers of SIGINT and SIGTERM where their action is the default (a caller's
  // own handler, or an ignored signal as a background job's SIGINT, is left alone).
  InterruptOnSignal();
  ~InterruptOnSignal();  // restores the actions it replaced; the flag is cleared
  InterruptOnSignal(const InterruptOnSignal&) = delete;
  InterruptOnSignal& operator=(const InterruptOnSignal&) = delete;

  // The signal received (SIGINT, SIGTERM), 0 while none was: what EngineOptions::interrupt points to.
  const std::atomic<int>& flag() const;
};

// "SIGINT (Ctrl-C)", "SIGTERM", "signal 10": how a message names a signal.
std::string signal_name(int sig);

}  // namespace hetflow::exec
