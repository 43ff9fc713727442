// The handler only stores into a lock-free atomic (async-signal-safe); SA_RESETHAND puts the
// default action back as the handler runs, so the same signal a second time ends the process
// without any code of ours in between. One flag for the process: signals are per process too.
#include "exec/interrupt.hpp"

#include <signal.h>

namespace hetflow::exec {

namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch a lock-free atomic");

constexpr int kSignals[2] = {SIGINT, SIGTERM};
struct sigaction g_old[2] {};
bool g_installed[2] = {false, false};

extern "C" void on_interrupt(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // the first signal is the one the run names
}

}  // namespace

InterruptOnSignal::InterruptOnSignal() {
  g_signal.store(0);
  for (int i = 0; i < 2; ++i) {
    struct sigaction now {};
    if (::sigaction(kSignals[i], nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;
    struct sigaction handler {};
    handler.sa_handler = on_interrupt;
    handler.sa_flags = SA_RESETHAND;
    sigemptyset(&handler.sa_mask);
    g_installed[i] = ::sigaction(kSignals[i], &handler, &g_old[i]) == 0;
  }
}

InterruptOnSignal::~InterruptOnSignal() {
  for (int i = 0; i < 2; ++i) {
    if (g_installed[i]) ::sigaction(kSignals[i], &g_old[i], nullptr);
    g_installed[i] = false;
  }
  g_signal.store(0);
}

const std::atomic<int>& InterruptOnSignal::flag() const { return g_signal; }

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT (Ctrl-C)";
  if (sig == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(sig);
}

}  // namespace hetflow::exec
