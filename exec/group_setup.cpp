#include "exec/group_setup.hpp"

#include <algorithm>
#include <charconv>
#include <exception>

#include "exec/backend.hpp"
#include "model/error.hpp"

namespace hetflow::exec {

namespace {

// What a process sends in a group's exchange; a tag byte says which.
constexpr std::byte kId{'I'}, kNothing{'-'}, kFailure{'F'};

std::string text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

void set_up_groups(const GroupSetup& setup, int me, const Ranks* processes, const std::atomic<bool>& stop) {
  if (processes == nullptr) {
    for (size_t g = 0; g < setup.groups; ++g) {
      const std::vector<int> among = setup.processes(g);
      if (among.empty()) continue;
      if (among.size() > 1 || among[0] != me) throw Error(setup.what(g) + " spans processes, but there are no MPI ranks");
      setup.create(g, setup.make_id(g));
    }
    return;
  }
  // This process's first failure, or the first it heard of, with the rank it happened on:
  // relayed as it was, so every process names where it happened.
  int origin = -1;
  std::string failure;
  std::exception_ptr mine;
  const auto remember = [&](const std::exception& e) {
    origin = me;
    failure = e.what();
    mine = std::current_exception();
  };
  // A failure travels as the tag, "ORIGIN\n" and its message.
  const auto failure_bytes = [&] {
    const std::string body = static_cast<char>(kFailure) + std::to_string(origin) + "\n" + failure;
    const auto bytes = std::as_bytes(std::span<const char>(body.data(), body.size()));
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  };
  const auto heard = [&](std::span<const std::byte> bytes, int sender) {
    const std::string body = text(bytes.subspan(1));
    const size_t cut = body.find('\n');
    int from = sender;  // (unless it names another)
    if (cut != std::string::npos) std::from_chars(body.data(), body.data() + cut, from);
    origin = from >= 0 ? from : sender;
    failure = cut == std::string::npos ? body : body.substr(cut + 1);
  };
  for (size_t g = 0; g < setup.groups; ++g) {
    const std::vector<int> among = setup.processes(g);
    if (std::find(among.begin(), among.end(), me) == among.end()) continue;
    const bool maker = setup.id_maker(g) == me;
    std::vector<std::byte> id;
    if (origin < 0 && maker) {
      try {
        id = setup.make_id(g);
      } catch (const Stopped&) {
        throw;
      } catch (const std::exception& e) {
        remember(e);
      }
    }
    if (among.size() > 1) {
      std::vector<std::byte> sent;
      if (origin >= 0) {
        sent = failure_bytes();
      } else {
        sent.reserve(1 + id.size());
        sent.push_back(maker ? kId : kNothing);
        sent.insert(sent.end(), id.begin(), id.end());
      }
      const auto all = processes->exchange(among, sent, stop);
      if (origin >= 0) continue;
      for (size_t i = 0; i < all.size() && origin < 0; ++i) {
        if (!all[i].empty() && all[i][0] == kFailure) heard(all[i], among[i]);
      }
      if (origin >= 0) continue;
      const auto from = static_cast<size_t>(std::find(among.begin(), among.end(), setup.id_maker(g)) - among.begin());
      if (from == among.size() || all[from].empty() || all[from][0] != kId) {
        origin = me;
        failure = setup.what(g) + ": rank " + std::to_string(setup.id_maker(g)) + " sent no id";
        continue;
      }
      id.assign(all[from].begin() + 1, all[from].end());
    }
    if (origin >= 0) continue;
    try {
      setup.create(g, id);
    } catch (const Stopped&) {
      throw;
    } catch (const std::exception& e) {
      remember(e);
    }
  }
  std::vector<int> everyone(static_cast<size_t>(processes->size()));
  for (int r = 0; r < processes->size(); ++r) everyone[static_cast<size_t>(r)] = r;
  const auto verdicts = processes->exchange(everyone, origin >= 0 ? failure_bytes() : std::vector<std::byte>{}, stop);
  if (mine) std::rethrow_exception(mine);
  for (size_t r = 0; r < verdicts.size() && origin < 0; ++r) {
    if (!verdicts[r].empty()) heard(verdicts[r], static_cast<int>(r));
  }
  if (origin >= 0) throw Error("rank " + std::to_string(origin) + " failed: " + failure);
}

}  // namespace hetflow::exec
