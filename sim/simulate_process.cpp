// simulate(): one child process per simulation, because SimGrid's engine lives once per
// process. The child runs simulate_here() and writes its result to a pipe as one line of
// JSON (the scalars) followed by the trace as CSV; the parent reads it back. The trace goes
// raw, not as a JSON string: escaping and lexing hundreds of megabytes char by char cost
// more than the CSV itself.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "sim/simulator.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::sim {

namespace {

std::string encode(const SimResult& r) {
  nlohmann::json j;
  j["completed"] = r.completed;
  j["stalls"] = r.stalls;
  j["simulated_s"] = r.simulated_s;
  j["wall_s"] = r.wall_s;
  j["activities"] = r.activities;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  return j.dump() + "\n" + traces::write_trace_csv(r.trace);  // dump() escapes newlines
}

SimResult decode(const std::string& text) {
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
  r.trace = traces::read_trace_csv(text.substr(newline + 1), "<simulation>");
  return r;
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

}  // namespace

SimResult simulate(const partition::Plan& plan, const SimOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(std::string("cannot create a pipe for the simulation: ") + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("cannot fork the simulation process: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    std::string message;
    int status = 0;
    try {
      SimResult r = simulate_here(plan, options);
      struct rusage usage {};
      ::getrusage(RUSAGE_SELF, &usage);
      r.peak_rss_bytes = static_cast<long long>(usage.ru_maxrss) * 1024;
      message = "R" + encode(r);
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
  ::close(fds[1]);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (text.empty()) {
    const std::string why = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status));
    throw Error("the simulation process died without a result (" + why + ")");
  }
  if (text[0] == 'I') {
    const nlohmann::json j = nlohmann::json::parse(text.substr(1));
    throw InputError(j["file"], j["line"], j["field"], j["message"]);
  }
  if (text[0] == 'P') throw PlanError(text.substr(1));
  if (text[0] == 'E') throw Error("simulation failed: " + text.substr(1));
  return decode(text.substr(1));
}

}  // namespace hetflow::sim
