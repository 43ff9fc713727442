// Ranks over MPI (OpenMPI). Two communicators duplicated from the world: `data` for lanes
// and exchanges (the stream threads, concurrently: MPI_THREAD_MULTIPLE; a new one each run),
// `control` for the engine's rounds, gathers and clock (only the thread that runs the plan).
// Waits poll with MPI_Test / MPI_Improbe and a short sleep, so a stop is seen within a
// millisecond and an idle rank leaves the cores to the others (mpirun --oversubscribe runs 8
// ranks on 2 cores).
#include <dlfcn.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <thread>

#include "exec/backend.hpp"
#include "exec/ranks.hpp"

namespace hetflow::exec {

namespace {

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  throw Error(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(n)));
}

// Polls `done` until it says so, sleeping a little longer each time (up to 500 us).
template <class Done>
void poll(const std::atomic<bool>& stop, Done done) {
  int idle = 0;
  while (!done()) {
    if (stop.load(std::memory_order_relaxed)) throw Stopped();
    if (++idle < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(500, 10 * (idle - 15))));
    }
  }
}

int count_of(size_t bytes) {
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw Error("a message between ranks of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  }
  return static_cast<int>(bytes);
}

// SimGrid defines MPI's functions too (SMPI); a program linked with it before libmpi would
// call SimGrid's MPI_Init, which aborts. Said plainly instead.
void check_mpi_is_mpi() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname != nullptr &&
      std::string(info.dli_fname).find("simgrid") != std::string::npos) {
    throw Error(std::string("MPI_Init_thread resolves to ") + info.dli_fname +
                " (SimGrid's SMPI), not to libmpi: link libmpi before SimGrid");
  }
}

// Set once this process has joined several ranks (MPI initialised by world()).
std::atomic<bool> joined_several{false};

bool launched_by_mpirun() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size != nullptr && std::atoi(size) > 1;
}

}  // namespace

struct Ranks::Mpi {
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
  int max_tag = 0;
  MPI_Request round = MPI_REQUEST_NULL;
  std::vector<long long> round_in, round_out;
};

namespace {

// A send the run stopped before its receiver took it: MPI cannot take it back (OpenMPI's
// MPI_Cancel leaves sends be), so its request is let go and its bytes kept alive until exit
// in case a receiver still takes them; Ranks::begin_run keeps it from a later run's lanes.
void abandon(MPI_Request& request, std::vector<std::byte>& data) {
  if (request == MPI_REQUEST_NULL) return;
  MPI_Cancel(&request);
  MPI_Request_free(&request);
  static std::mutex mutex;
  // Never destroyed: static destructors run before world()'s MPI_Finalize at exit.
  static auto* kept = new std::vector<std::vector<std::byte>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(data));
}

struct MpiPacket final : Lane::Packet {
  MPI_Request request = MPI_REQUEST_NULL;
  // A packet dropped unfinished (its task threw before waiting for it) is abandoned, not
  // freed under MPI's feet.
  ~MpiPacket() override { abandon(request, data); }
};

class MpiLane final : public Lane {
 public:
  MpiLane(MPI_Comm comm, int from, int to, int tag, const std::atomic<bool>& stop)
      : comm_(comm), from_(from), to_(to), tag_(tag), stop_(stop) {}

  std::shared_ptr<Packet> post(std::span<const std::byte> data, size_t size_bytes) override {
    auto packet = std::make_shared<MpiPacket>();
    packet->data.assign(size_bytes, std::byte{0});
    const size_t n = std::min(size_bytes, data.size());
    if (n > 0) std::memcpy(packet->data.data(), data.data(), n);
    // Synchronous: complete once the receiver has matched it, as the Mailbox's rendezvous.
    check(MPI_Issend(packet->data.data(), count_of(size_bytes), MPI_BYTE, to_, tag_, comm_, &packet->request), "MPI_Issend");
    return packet;
  }

  void take(const std::function<void(std::span<const std::byte>)>& consume) override {
    MPI_Message message;
    MPI_Status status;
    poll(stop_, [&] {
      int found = 0;
      check(MPI_Improbe(from_, tag_, comm_, &found, &message, &status), "MPI_Improbe");
      return found != 0;
    });
    int bytes = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
    std::vector<std::byte> data(static_cast<size_t>(bytes));
    check(MPI_Mrecv(data.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
    consume(data);
  }

  void wait_taken(Packet& packet) override {
    auto& p = static_cast<MpiPacket&>(packet);
    try {
      poll(stop_, [&] {
        int done = 0;
        check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
      });
      p.taken = true;
    } catch (const Stopped&) {
      abandon(p.request, p.data);
      throw;
    }
  }

  void wake() override {}  // waits poll the stop flag

 private:
  MPI_Comm comm_;
  int from_, to_, tag_;
  const std::atomic<bool>& stop_;
};

}  // namespace

Ranks& Ranks::world() {
  static Ranks* ranks = [] {
    auto* r = new Ranks();  // lives until exit, when MPI is finalised
    if (!launched_by_mpirun()) return r;
    check_mpi_is_mpi();
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_MULTIPLE) {
      throw Error("this MPI gives no MPI_THREAD_MULTIPLE (the executor's stream threads all send and receive)");
    }
    r->mpi_ = std::make_unique<Mpi>();
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size_);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &r->mpi_->data), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &r->mpi_->control), "MPI_Comm_dup");
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    r->mpi_->max_tag = found != 0 && ub != nullptr ? *ub : 32767;
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized == 0) MPI_Finalize();
    });
    joined_several = r->size_ > 1;
    return r;
  }();
  return *ranks;
}

void Ranks::abort_job(int status) {
  if (!joined_several.load()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status);
}

Ranks::~Ranks() = default;

int Ranks::owner(int device, int devices) const {
  return static_cast<int>(static_cast<long long>(device) * size_ / std::max(1, devices));
}

void Ranks::check_devices(int devices) const {
  if (size_ > devices) {
    throw PlanError("mpirun started " + std::to_string(size_) + " ranks for a plan of " + std::to_string(devices) +
                    " devices: at most one rank per device (use -np " + std::to_string(devices) + " or fewer)");
  }
}

int Ranks::max_tag() const { return mpi_ ? mpi_->max_tag : std::numeric_limits<int>::max(); }

std::unique_ptr<Lane> Ranks::lane(int from, int to, int tag, const std::atomic<bool>& stop) const {
  if (!mpi_) throw Error("a lane between ranks in a process that runs alone");
  if (tag < 1 || tag > mpi_->max_tag) {
    throw PlanError("the plan needs more message lanes between ranks (" + std::to_string(tag) + ") than MPI has tags (" +
                    std::to_string(mpi_->max_tag) + ")");
  }
  return std::make_unique<MpiLane>(mpi_->data, from, to, tag, stop);
}

std::vector<std::vector<std::byte>> Ranks::exchange(std::span<const int> among, std::span<const std::byte> mine,
                                                    const std::atomic<bool>& stop) const {
  std::vector<std::vector<std::byte>> out(among.size());
  std::vector<std::unique_ptr<Lane>> to;
  std::vector<std::shared_ptr<Lane::Packet>> posted;
  for (size_t i = 0; i < among.size(); ++i) {
    if (among[i] == rank_) {
      out[i].assign(mine.begin(), mine.end());
      continue;
    }
    // Tag 0 is the exchange's: messages between two ranks on it keep their order, and a rank
    // runs one exchange at a time.
    to.push_back(std::make_unique<MpiLane>(mpi_->data, rank_, among[i], 0, stop));
    posted.push_back(to.back()->post(mine, mine.size()));
  }
  for (size_t i = 0; i < among.size(); ++i) {
    if (among[i] == rank_) continue;
    MpiLane(mpi_->data, among[i], rank_, 0, stop).take([&](std::span<const std::byte> b) { out[i].assign(b.begin(), b.end()); });
  }
  for (size_t i = 0; i < posted.size(); ++i) to[i]->wait_taken(*posted[i]);
  return out;
}

bool Ranks::poll_sum(std::span<const long long> mine, std::vector<long long>& total) {
  if (!mpi_) {
    total.assign(mine.begin(), mine.end());
    return true;
  }
  Mpi& m = *mpi_;
  if (m.round == MPI_REQUEST_NULL) {
    m.round_in.assign(mine.begin(), mine.end());
    m.round_out.assign(mine.size(), 0);
    check(MPI_Iallreduce(m.round_in.data(), m.round_out.data(), static_cast<int>(mine.size()), MPI_LONG_LONG, MPI_SUM,
                         m.control, &m.round),
          "MPI_Iallreduce");
  }
  int done = 0;
  check(MPI_Test(&m.round, &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done == 0) return false;
  total = m.round_out;  // MPI_Test set the request to MPI_REQUEST_NULL: the next call starts a round
  return true;
}

// Gathers and broadcasts move their bytes in pieces of at most this many (MPI counts are int).
constexpr size_t kPieceBytes = size_t{1} << 30;
constexpr int kGatherTag = 2;  // on `control`; the clock's trips use tag 1

std::vector<std::vector<std::byte>> Ranks::gather(std::span<const std::byte> mine) const {
  if (!mpi_) return {std::vector<std::byte>(mine.begin(), mine.end())};
  // Every rank learns every size (64-bit), so what one rank cannot take is not a surprise to
  // the others; then each rank's bytes go to rank 0 in pieces, rank after rank.
  const long long n = static_cast<long long>(mine.size());
  std::vector<long long> sizes(static_cast<size_t>(size_));
  check(MPI_Allgather(&n, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, mpi_->control), "MPI_Allgather");
  std::vector<std::vector<std::byte>> out;
  if (rank_ != 0) {
    for (size_t at = 0; at < mine.size(); at += kPieceBytes) {
      const size_t piece = std::min(kPieceBytes, mine.size() - at);
      check(MPI_Send(mine.data() + at, static_cast<int>(piece), MPI_BYTE, 0, kGatherTag, mpi_->control), "MPI_Send");
    }
    return out;
  }
  out.resize(sizes.size());
  out[0].assign(mine.begin(), mine.end());
  for (size_t r = 1; r < sizes.size(); ++r) {
    out[r].resize(static_cast<size_t>(sizes[r]));
    for (size_t at = 0; at < out[r].size(); at += kPieceBytes) {
      const size_t piece = std::min(kPieceBytes, out[r].size() - at);
      check(MPI_Recv(out[r].data() + at, static_cast<int>(piece), MPI_BYTE, static_cast<int>(r), kGatherTag, mpi_->control,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
    }
  }
  return out;
}

std::vector<std::byte> Ranks::broadcast(std::span<const std::byte> from_root) const {
  std::vector<std::byte> out(from_root.begin(), from_root.end());
  if (!mpi_) return out;
  long long n = static_cast<long long>(out.size());
  check(MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, mpi_->control), "MPI_Bcast");
  out.resize(static_cast<size_t>(n));
  for (size_t at = 0; at < out.size(); at += kPieceBytes) {
    const size_t piece = std::min(kPieceBytes, out.size() - at);
    check(MPI_Bcast(out.data() + at, static_cast<int>(piece), MPI_BYTE, 0, mpi_->control), "MPI_Bcast");
  }
  return out;
}

void Ranks::barrier() const {
  if (mpi_) check(MPI_Barrier(mpi_->control), "MPI_Barrier");
}

void Ranks::begin_run() {
  if (!mpi_) return;
  MPI_Comm fresh = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &fresh), "MPI_Comm_dup");
  // (Freed once nothing is pending on it: a left-over send keeps the old one alive.)
  check(MPI_Comm_free(&mpi_->data), "MPI_Comm_free");
  mpi_->data = fresh;
}

double Ranks::clock_offset_s(const std::function<double()>& now_s) const {
  if (!mpi_) return 0;
  constexpr int kTrips = 8;
  double offset = 0;
  for (int r = 1; r < size_; ++r) {  // rank 0 answers each rank in turn
    if (rank_ == 0) {
      for (int k = 0; k < kTrips; ++k) {
        double ping = 0;
        check(MPI_Recv(&ping, 1, MPI_DOUBLE, r, 1, mpi_->control, MPI_STATUS_IGNORE), "MPI_Recv");
        const double t = now_s();
        check(MPI_Send(&t, 1, MPI_DOUBLE, r, 1, mpi_->control), "MPI_Send");
      }
    } else if (rank_ == r) {
      double best_delay = std::numeric_limits<double>::infinity();
      for (int k = 0; k < kTrips; ++k) {
        const double sent = now_s();
        double root = 0;
        check(MPI_Send(&sent, 1, MPI_DOUBLE, 0, 1, mpi_->control), "MPI_Send");
        check(MPI_Recv(&root, 1, MPI_DOUBLE, 0, 1, mpi_->control, MPI_STATUS_IGNORE), "MPI_Recv");
        const double back = now_s();
        if (back - sent < best_delay) {  // rank 0 read its clock about halfway through the trip
          best_delay = back - sent;
          offset = root - (sent + back) / 2;
        }
      }
    }
  }
  return offset;
}

}  // namespace hetflow::exec
