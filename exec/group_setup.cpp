#include "exec/group_setup.hpp"

#include <algorithm>
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
  std::string failure;  // this process's first failure, or the first it heard of
  std::exception_ptr mine;
  const auto remember = [&](const std::exception& e) {
    failure = e.what();
    mine = std::current_exception();
  };
  for (size_t g = 0; g < setup.groups; ++g) {
    const std::vector<int> among = setup.processes(g);
    if (std::find(among.begin(), among.end(), me) == among.end()) continue;
    const bool maker = setup.id_maker(g) == me;
    std::vector<std::byte> id;
    if (failure.empty() && maker) {
      try {
        id = setup.make_id(g);
      } catch (const Stopped&) {
        throw;
      } catch (const std::exception& e) {
        remember(e);
      }
    }
    if (among.size() > 1) {
      std::vector<std::byte> sent{failure.empty() ? (maker ? kId : kNothing) : kFailure};
      if (failure.empty()) {
        sent.insert(sent.end(), id.begin(), id.end());
      } else {
        const auto why = std::as_bytes(std::span<const char>(failure.data(), failure.size()));
        sent.insert(sent.end(), why.begin(), why.end());
      }
      const auto all = processes->exchange(among, sent, stop);
      if (!failure.empty()) continue;
      for (size_t i = 0; i < all.size() && failure.empty(); ++i) {
        if (!all[i].empty() && all[i][0] == kFailure) {
          failure = "rank " + std::to_string(among[i]) + " failed before " + setup.what(g) + ": " +
                    text(std::span<const std::byte>(all[i]).subspan(1));
        }
      }
      if (!failure.empty()) continue;
      const auto from = static_cast<size_t>(std::find(among.begin(), among.end(), setup.id_maker(g)) - among.begin());
      if (from == among.size() || all[from].empty() || all[from][0] != kId) {
        failure = setup.what(g) + ": rank " + std::to_string(setup.id_maker(g)) + " sent no id";
        continue;
      }
      id.assign(all[from].begin() + 1, all[from].end());
    }
    if (!failure.empty()) continue;
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
  const auto verdicts = processes->exchange(everyone, std::as_bytes(std::span<const char>(failure.data(), failure.size())), stop);
  if (mine) std::rethrow_exception(mine);
  if (!failure.empty()) throw Error(failure);
  for (size_t r = 0; r < verdicts.size(); ++r) {
    if (!verdicts[r].empty()) throw Error("rank " + std::to_string(r) + " failed: " + text(verdicts[r]));
  }
}

}  // namespace hetflow::exec
