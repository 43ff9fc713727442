// simulate(): one child process per simulation, because SimGrid's engine lives once per
// process. The child runs simulate_here() and writes its result to a pipe as one line of
// JSON (the scalars) followed by the trace as CSV; the parent reads it back. The trace goes
// raw, not as a JSON string: escaping and lexing hundreds of megabytes char by char cost
// more than the CSV itself.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "sim/simulator.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::sim {

namespace {

// The result's scalars as one line of JSON (the trace follows it as CSV, written apart so
// that a large trace is not copied into one message).
std::string encode_scalars(const SimResult& r) {
  nlohmann::json j;
  j["completed"] = r.completed;
  j["stalls"] = r.stalls;
  j["simulated_s"] = r.simulated_s;
  j["wall_s"] = r.wall_s;
  j["activities"] = r.activities;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  return j.dump() + "\n";  // dump() escapes newlines
}

// The result from its scalars' line and the trace after it, which is read in place.
SimResult decode(std::string text) {
  const size_t newline = text.find('\n');
  if (newline == std::string::npos) throw Error("simulation process: malformed result");
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(newline));
  SimResult r;
  r.completed = j.at("completed").get<bool>();
  r.stalls = j.at("stalls").get<std::vector<std::string>>();
  r.simulated_s = j.at("simulated_s").get<double>();
  r.wall_s = j.at("wall_s").get<double>();
  r.activities = j.at("activities").get<long long>();
  r.peak_rss_bytes = j.at("peak_rss_bytes").get<long long>();
  text.erase(0, newline + 1);
  r.trace = traces::read_trace_csv(text, "<simulation>");
  return r;
}

// The child being waited for, for the signal handlers below.
std::atomic<pid_t> g_child{0};

// SIGINT/SIGTERM while a simulation runs: the child goes with the parent, at once (the
// child also has PR_SET_PDEATHSIG, for signals no handler sees), and the parent exits as a
// shell reports a signal: 128 + its number (130, 143).
extern "C" void stop_child_and_exit(int sig) {
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, SIGKILL);
  ::_exit(128 + sig);
}

// Installs the handlers for the lifetime of one simulate() call, where the signal would
// otherwise terminate the process (a caller's own handler is left alone).
class StopChildOnSignal {
 public:
  explicit StopChildOnSignal(pid_t child) {
    g_child.store(child);
    for (int i = 0; i < 2; ++i) {
      struct sigaction now {};
      ::sigaction(kSignals[i], nullptr, &now);
      if (now.sa_handler != SIG_DFL) continue;
      struct sigaction handler {};
      handler.sa_handler = stop_child_and_exit;
      sigemptyset(&handler.sa_mask);
      installed_[i] = ::sigaction(kSignals[i], &handler, &old_[i]) == 0;
    }
  }
  ~StopChildOnSignal() {
    for (int i = 0; i < 2; ++i) {
      if (installed_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
    }
    g_child.store(0);
  }
  StopChildOnSignal(const StopChildOnSignal&) = delete;
  StopChildOnSignal& operator=(const StopChildOnSignal&) = delete;

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction old_[2] {};
  bool installed_[2] = {false, false};
};

// What the child wrote on stderr, without SimGrid's backtrace blocks ("Backtrace (displayed
// in actor ...):" and its frames, up to a blank line): they read as a crash, and hetflow
// reports what went wrong itself.
std::string without_backtraces(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  bool in_block = false;
  while (std::getline(in, line)) {
    if (line.rfind("Backtrace (displayed in actor", 0) == 0) {
      in_block = true;
      continue;
    }
    if (in_block) {
      if (line.empty()) in_block = false;
      continue;
    }
    if (line.rfind("  -> ", 0) == 0) continue;  // a stray frame
    out += line + "\n";
  }
  return out;
}

std::string read_back(int fd) {
  std::string text;
  if (fd < 0 || ::lseek(fd, 0, SEEK_SET) != 0) return text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > (size_t{1} << 24)) break;  // 16 MiB of messages is plenty
  }
  return text;
}

// The first SimGrid "CRITICAL" line, for the message when the child died.
std::string critical_line(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("CRITICAL] ");
    if (at != std::string::npos) return line.substr(at + 10);
  }
  return {};
}

void write_all(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    written += static_cast<size_t>(n);
  }
}

// Progress crosses from the child as fixed-size records on a pipe of its own (a write of
// fewer than PIPE_BUF bytes is atomic). The child never blocks on it: a report the parent
// has not read yet is dropped.
struct ProgressPipe {
  int read_fd = -1, write_fd = -1;
  explicit ProgressPipe(bool wanted) {
    int fds[2];
    if (!wanted || ::pipe2(fds, O_CLOEXEC) != 0) return;
    read_fd = fds[0];
    write_fd = fds[1];
    ::fcntl(write_fd, F_SETFL, O_NONBLOCK);
  }
  ~ProgressPipe() {
    if (read_fd >= 0) ::close(read_fd);
    if (write_fd >= 0) ::close(write_fd);
  }
  ProgressPipe(const ProgressPipe&) = delete;
  ProgressPipe& operator=(const ProgressPipe&) = delete;
};

// Reads the child's result from `fd` until it closes, passing the progress records that
// arrive on `progress_fd` (-1: none) to `on_progress` meanwhile.
std::string read_result(int fd, int progress_fd, const std::function<void(const Progress&)>& on_progress) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    if (progress_fd >= 0) {
      pollfd polled[2] = {{fd, POLLIN, 0}, {progress_fd, POLLIN, 0}};
      if (::poll(polled, 2, -1) < 0) {
        if (errno == EINTR) continue;
        progress_fd = -1;
        continue;
      }
      if (polled[1].revents & POLLIN) {
        Progress p;
        if (::read(progress_fd, &p, sizeof p) == static_cast<ssize_t>(sizeof p)) on_progress(p);
      } else if (polled[1].revents & (POLLHUP | POLLERR)) {
        progress_fd = -1;
      }
      if (!(polled[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    }
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

SimResult simulate(const partition::Plan& plan, const SimOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(std::string("cannot create a pipe for the simulation: ") + std::strerror(errno));
  // The child's stderr goes to a memory file the parent reads afterwards (a pipe could fill
  // while the parent waits on the result pipe).
  const int err_fd = ::memfd_create("hetflow-sim-stderr", MFD_CLOEXEC);
  ProgressPipe progress(static_cast<bool>(options.on_progress));
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cannot fork the simulation process: ") + std::strerror(errno));
  if (pid == 0) {
    // Die with the parent, whatever kills it; and if it is already gone, do not start.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    // A caller's handlers are not the child's; an ignored signal (a background job's SIGINT)
    // stays ignored, as in the parent.
    for (const int sig : {SIGINT, SIGTERM}) {
      struct sigaction now {};
      if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_IGN) ::signal(sig, SIG_DFL);
    }
    if (err_fd >= 0) ::dup2(err_fd, STDERR_FILENO);
    ::close(fds[0]);
    std::string message;
    int status = 0;
    try {
      SimOptions child_options = options;
      if (progress.write_fd >= 0) {
        ::close(progress.read_fd);
        child_options.on_progress = [fd = progress.write_fd](const Progress& p) {
          [[maybe_unused]] const ssize_t n = ::write(fd, &p, sizeof p);
        };
      } else {
        child_options.on_progress = nullptr;
      }
      SimResult r = simulate_here(plan, child_options);
      struct rusage usage {};
      ::getrusage(RUSAGE_SELF, &usage);
      r.peak_rss_bytes = static_cast<long long>(usage.ru_maxrss) * 1024;
      const std::string trace = traces::write_trace_csv(r.trace);  // (before anything is written)
      write_all(fds[1], "R" + encode_scalars(r));
      write_all(fds[1], trace);
    } catch (const InputError& e) {
      message = "I" + nlohmann::json{{"file", e.file()}, {"line", e.line()}, {"field", e.field()}, {"message", e.message()}}.dump();
      status = 2;
    } catch (const PlanError& e) {
      message = std::string("P") + e.what();
      status = 3;
    } catch (const std::exception& e) {
      message = std::string("E") + e.what();
      status = 1;
    }
    write_all(fds[1], message);
    ::close(fds[1]);
    ::_exit(status);  // skip the parent's atexit handlers and static destructors
  }
  const StopChildOnSignal stop_child(pid);
  ::close(fds[1]);
  if (progress.write_fd >= 0) {
    ::close(progress.write_fd);
    progress.write_fd = -1;
  }
  std::string text = read_result(fds[0], progress.read_fd, options.on_progress);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string child_err = read_back(err_fd);
  if (err_fd >= 0) ::close(err_fd);
  if (text.empty()) {
    const std::string why = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status));
    const std::string critical = critical_line(child_err);
    throw Error("the simulation process died without a result (" + why + ")" +
                (critical.empty() ? std::string() : ": SimGrid says: " + critical));
  }
  if (const std::string rest = without_backtraces(child_err); !rest.empty()) {
    std::fwrite(rest.data(), 1, rest.size(), stderr);  // e.g. HETFLOW_SIM_PHASES timings
  }
  if (text[0] == 'I') {
    const nlohmann::json j = nlohmann::json::parse(text.substr(1));
    throw InputError(j["file"], j["line"], j["field"], j["message"]);
  }
  if (text[0] == 'P') throw PlanError(text.substr(1));
  if (text[0] == 'E') throw Error("simulation failed: " + text.substr(1));
  text.erase(0, 1);
  return decode(std::move(text));
}

}  // namespace hetflow::sim
