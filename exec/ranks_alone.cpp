// Ranks in a build without MPI: one process owns every device. A process mpirun started as
// one of several ranks is refused (it would run every device on its own, as would the others).
#include <cstdlib>
#include <limits>

#include "exec/ranks.hpp"

namespace hetflow::exec {

struct Ranks::Mpi {};

Ranks& Ranks::world() {
  static Ranks* ranks = [] {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (size != nullptr && std::atoi(size) > 1) {
      throw Error("this hetflow was built without MPI (libopenmpi-dev was not found), so it cannot run as one of " +
                  std::string(size) + " ranks; run it without mpirun (devices as threads) or rebuild with MPI");
    }
    return new Ranks();
  }();
  return *ranks;
}

void Ranks::abort_job(int) {}

Ranks::~Ranks() = default;

int Ranks::owner(int, int) const { return 0; }
void Ranks::check_devices(int) const {}
int Ranks::max_tag() const { return std::numeric_limits<int>::max(); }

std::unique_ptr<Lane> Ranks::lane(int, int, int, const std::atomic<bool>&) const {
  throw Error("a lane between ranks in a build without MPI");
}

std::vector<std::vector<std::byte>> Ranks::exchange(std::span<const int>, std::span<const std::byte> mine,
                                                    const std::atomic<bool>&) const {
  return {std::vector<std::byte>(mine.begin(), mine.end())};
}

bool Ranks::poll_sum(std::span<const long long> mine, std::vector<long long>& total) {
  total.assign(mine.begin(), mine.end());
  return true;
}

std::vector<std::vector<std::byte>> Ranks::gather(std::span<const std::byte> mine) const {
  return {std::vector<std::byte>(mine.begin(), mine.end())};
}

std::vector<std::byte> Ranks::broadcast(std::span<const std::byte> from_root) const {
  return std::vector<std::byte>(from_root.begin(), from_root.end());
}

void Ranks::barrier() const {}
void Ranks::begin_run() {}
double Ranks::clock_offset_s(const std::function<double()>&) const { return 0; }

}  // namespace hetflow::exec
