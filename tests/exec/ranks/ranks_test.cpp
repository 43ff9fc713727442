// The executor across MPI ranks. CTest runs this program under `mpirun -np 4`: every rank
// runs every test in the same order (each test makes the same collective calls everywhere;
// assertions come after them, so a failing check never leaves a rank behind). Rank 0
// prints; the exit status is every rank's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <cstring>

#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "exec/group_setup.hpp"
#include "exec/ranks.hpp"
#include "exec/training.hpp"
#include "model/zoo.hpp"
#include "partition/traffic.hpp"
#include "tests/exec/exec_test_util.hpp"
#include "tests/exec/odd_networks.hpp"
#include "traces/traffic.hpp"

namespace hetflow {
namespace {

using partition::Plan;
using partition::TaskKind;

exec::Ranks& ranks() { return exec::Ranks::world(); }

model::Network gpt(int layers, int heads) {
  return model::network_from_spec("gpt:layers=" + std::to_string(layers) + ",hidden=" + std::to_string(16 * heads) +
                                      ",heads=" + std::to_string(heads) + ",seq=16,vocab=97",
                                  model::Precision::fp32);
}

partition::PlanOptions options(int pipeline, int data, int microbatches, const char* schedule) {
  partition::PlanOptions o = test_support::pipeline_options(pipeline, data, microbatches, schedule);
  o.bucket_bytes = 4096;  // several buckets a layer range
  return o;
}

struct Trained {
  exec::RunResult result;
  std::vector<double> losses;
  exec::SafetensorsFile weights;
  std::vector<double> balances;  // a mixture of experts' load-balancing losses
  exec::TrainingState state;     // a training checkpoint's (rank 0's)
};

// The plan's training, its devices as threads here (`with` null) or over the ranks.
Trained train(const Plan& plan, exec::Ranks* with) {
  exec::OptimizerOptions o;
  o.lr = 1e-2;
  o.clip_grad = 0.5;  // low enough to clip: the norm's exchange between ranks runs
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), o, 42, nullptr, "", with);
  exec::CpuBackend backend({}, &training, with);
  exec::EngineOptions e;
  e.iterations = 3;
  e.watchdog_s = 30;
  e.ranks = with;
  Trained t;
  t.result = exec::run_plan(plan, backend, e);
  training.collect_at_root(true);
  t.losses = training.losses();
  t.balances = training.balance_losses();
  t.weights = training.weights();
  if (with == nullptr || with->rank() == 0) t.state = training.state();
  return t;
}

bool bitwise_equal(const exec::SafetensorsFile& a, const exec::SafetensorsFile& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.shape != y.shape || x.data.size() != y.data.size()) return false;
    if (std::memcmp(x.data.data(), y.data.data(), x.data.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

TEST(Ranks, MeetAndShareOneClock) {
  exec::Ranks& r = ranks();
  ASSERT_EQ(r.size(), 4) << "run under mpirun -np 4";
  EXPECT_EQ(r.owner(0, 8), 0);
  EXPECT_EQ(r.owner(7, 8), 3);
  EXPECT_EQ(r.owner(2, 3), 2);  // one device a rank at most: blocks of one
  const std::vector<int> among{0, 1, 2, 3};
  std::vector<std::byte> mine;
  exec::put(mine, r.rank() * 10);
  const std::atomic<bool> stop{false};
  const auto all = r.exchange(among, mine, stop);
  ASSERT_EQ(all.size(), 4u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(exec::ByteReader(all[i]).get<int>(), static_cast<int>(i) * 10);
  const auto gathered = r.gather(mine);
  EXPECT_EQ(gathered.size(), r.rank() == 0 ? 4u : 0u);
  std::vector<std::byte> root;
  exec::put_string(root, "from rank 0");
  const std::vector<std::byte> got = r.broadcast(r.rank() == 0 ? root : std::vector<std::byte>{});
  EXPECT_EQ(exec::ByteReader(got).get_string(), "from rank 0");
  // The ranks share this host's monotonic clock, so the offset of a clock started at the same
  // instant everywhere is the measurement's own error: half a round trip.
  const auto epoch = std::chrono::steady_clock::time_point{};
  const double offset = r.clock_offset_s([&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count(); });
  EXPECT_LT(std::abs(offset), 0.05);
  std::vector<long long> total;
  const long long round[] = {r.rank(), 1};
  while (!r.poll_sum(round, total)) {
  }
  EXPECT_EQ(total, (std::vector<long long>{0 + 1 + 2 + 3, 4}));
}

struct Case {
  const char* name;
  int devices;
  partition::PlanOptions options;
  bool moe = false;  // a mixture of experts rather than the GPT
  bool two_memories = false;  // CPU devices of 16 and 24 GiB in turn, a node each, rather than cpu-N
  bool deepseek = false;      // the mixture routed by DeepSeek-V3's sigmoid router, balanced per sequence
};

// Threads against ranks, bitwise: the same plan trained both ways (the threaded run on every
// rank, alone) gives the same losses and weights, and rank 0's merged trace has every task
// instance.
TEST(Ranks, TrainBitwiseAsThreadsDo) {
  std::vector<Case> cases;
  cases.push_back({"pipeline 4 x data 2, 1F1B", 8, options(4, 2, 4, "1f1b")});
  cases.push_back({"interleaved, 2 devices a rank", 8, [] {
                     auto o = options(2, 4, 4, "interleaved");
                     o.virtual_stages = 2;
                     return o;
                   }()});
  cases.push_back({"tensor 2 + sequence parallel x pipeline 2", 4, [] {
                     auto o = options(2, 1, 2, "1f1b");
                     o.tensor = 2;
                     o.sequence_parallel = true;
                     return o;
                   }()});
  cases.push_back({"tensor 2 + sequence parallel, the LM head a stage alone", 4, [] {
                     auto o = options(2, 1, 2, "1f1b");
                     o.tensor = 2;
                     o.sequence_parallel = true;
                     o.stage_layers = {5, 1};  // the embedding and 4 blocks; the head
                     return o;
                   }()});
  cases.push_back({"parameter server", 4, [] {
                     auto o = options(2, 2, 2, "1f1b");
                     o.sync = partition::SyncKind::ps;
                     return o;
                   }()});
  cases.push_back({"wsp staleness 1", 4, [] {
                     auto o = options(2, 2, 2, "gpipe");
                     o.sync = partition::SyncKind::wsp;
                     o.staleness = 1;
                     return o;
                   }()});
  // ZeRO on one stage (its tied head beside its embedding): the shards' collectives, a
  // norm met over every device, weights gathered from the replicas' shards at rank 0.
  cases.push_back({"zero 3 x data 4", 4, [] {
                     auto o = options(1, 4, 2, "1f1b");
                     o.zero_stage = 3;
                     o.bucket_bytes = 4096;
                     return o;
                   }()});
  cases.push_back({"zero 1 x data 2 x tensor 2", 4, [] {
                     auto o = options(1, 2, 2, "1f1b");
                     o.tensor = 2;
                     o.zero_stage = 1;
                     o.bucket_bytes = 4096;
                     return o;
                   }()});
  // A tied embedding between two stages from ZeRO 2: each end's rows of the table shared
  // member by member, the two ends (ranks apart) summing their rows in place.
  cases.push_back({"zero 2 x pipeline 2 x data 2, the embedding tied between the stages", 4, [] {
                     auto o = options(2, 2, 2, "1f1b");
                     o.zero_stage = 2;
                     o.bucket_bytes = 4096;
                     return o;
                   }()});
  // Offload over a pipeline: each device's step on its own host stream, the copies' bytes.
  cases.push_back({"offload x zero 1 x pipeline 2 x data 2", 4, [] {
                     auto o = options(2, 2, 2, "1f1b");
                     o.zero_stage = 1;
                     o.offload_optimizer = true;
                     o.bucket_bytes = 4096;
                     return o;
                   }()});
  // A mixture of experts (every expert on every worker): the router's choices and the copies'
  // order are each device's own, the same bits over ranks as over threads.
  cases.push_back({"mixture of experts x pipeline 2 x data 2", 4, options(2, 2, 2, "1f1b"), true});
  // Expert parallelism: each rank's experts, the copies traded by all-to-alls between ranks
  // of sizes the routers chose, the norm met over the expert group, the experts gathered at
  // rank 0 from their holders.
  cases.push_back({"mixture of experts x tensor 2 + sequence parallel x data 2", 4, [] {
                     auto o = options(1, 2, 2, "1f1b");
                     o.tensor = 2;
                     o.sequence_parallel = true;
                     return o;
                   }(),
                   true});
  cases.push_back({"expert parallel 2 x pipeline 2", 4, [] {
                     auto o = options(2, 2, 2, "1f1b");
                     o.experts.parallel = 2;
                     return o;
                   }(),
                   true});
  for (const int staleness : {0, 1}) {  // parameter servers, and WSP's workers a step behind
    cases.push_back({staleness == 0 ? "expert parallel 2 with parameter servers" : "expert parallel 2 with wsp staleness 1", 4,
                     [staleness] {
                       auto o = options(1, 4, 2, "1f1b");
                       o.experts.parallel = 2;
                       o.sync = staleness == 0 ? partition::SyncKind::ps : partition::SyncKind::wsp;
                       o.staleness = staleness;
                       return o;
                     }(),
                     true});
  }
  // ZeRO 1 to 3 under expert parallelism: the dense part sharded over 4 replicas, each expert
  // rank's experts over its 2 holders (stage 3: gathered in those two pieces for every pass),
  // every shard gathered at rank 0 by its expert rank.
  static const char* const kExpertZero[] = {"expert parallel 2 x zero 1 x data 4", "expert parallel 2 x zero 2 x data 4",
                                            "expert parallel 2 x zero 3 x data 4"};
  for (const int stage : {1, 2, 3}) {
    cases.push_back({kExpertZero[stage - 1], 4,
                     [stage] {
                       auto o = options(1, 4, 2, "1f1b");
                       o.experts.parallel = 2;
                       o.zero_stage = stage;
                       o.bucket_bytes = 4096;
                       return o;
                     }(),
                     true});
  }
  // DeepSeek-V3's router: the balancing bias's loads summed over ranks as gradients are, the
  // sequence-wise balance loss over micro-batches of 2 sequences, each split over a context
  // group of 2 (its statistics all-reduced per sequence) beside expert groups of 2.
  Case deepseek{"deepseek router x expert parallel 2 x context 2 x zero 1", 4, [] {
                  auto o = options(1, 2, 2, "1f1b");
                  o.micro_batch = 2;
                  o.experts.parallel = 2;
                  o.context = 2;
                  o.zero_stage = 1;
                  o.bucket_bytes = 4096;
                  return o;
                }(),
                true};
  deepseek.deepseek = true;
  cases.push_back(deepseek);
  // Context parallelism: keys and values all-gathered and their gradients reduce-scattered
  // inside the passes, or passed around a ring block by block with the work in flight.
  cases.push_back({"context 2 x data 2, all-gather", 4, [] {
                     auto o = options(1, 2, 2, "1f1b");
                     o.context = 2;
                     return o;
                   }()});
  cases.push_back({"context 2 x data 2, ring", 4, [] {
                     auto o = options(1, 2, 2, "1f1b");
                     o.context = 2;
                     o.context_comm = partition::ContextComm::ring;
                     return o;
                   }()});
  cases.push_back({"context 4, ring", 4, [] {
                     auto o = options(1, 1, 2, "1f1b");
                     o.context = 4;
                     o.context_comm = partition::ContextComm::ring;
                     return o;
                   }()});
  // ZeRO 3 with shares by memory: uneven reduce-scatters and all-gathers between ranks.
  Case memory{"zero 3 by memory x data 4", 4, [] {
                auto o = options(1, 4, 2, "1f1b");
                o.zero_stage = 3;
                o.zero_shares = partition::ZeroShares::memory;
                o.bucket_bytes = 4096;
                return o;
              }()};
  memory.two_memories = true;
  cases.push_back(memory);
  for (const Case& c : cases) {
    model::Network net =
        c.moe ? model::network_from_spec("llama:layers=4,hidden=32,heads=2,kv_heads=2,ffn=40,seq=16,vocab=97,experts=4,"
                                         "experts_per_token=2,expert_ffn=24,shared_experts=1",
                                         model::Precision::fp32)
              : gpt(4, c.options.tensor > 1 ? 4 : 2);
    if (c.deepseek) {
      model::TransformerConfig d = *test_support::odd_deepseek(2, 16).architecture;
      d.moe.sequence_aux_loss = true;
      net = model::make_transformer(d, model::Precision::fp32);
    }
    const Plan plan = test_support::planned(c.two_memories ? test_support::cpus_of_two_memories(c.devices) : model::cpu_cluster(c.devices),
                                            net, c.options);
    const Trained threads = train(plan, nullptr);
    const Trained over_ranks = train(plan, &ranks());
    ASSERT_TRUE(threads.result.completed) << c.name << ": " << threads.result.error;
    EXPECT_TRUE(over_ranks.result.completed) << c.name << ": " << over_ranks.result.error;
    if (ranks().rank() != 0) continue;
    EXPECT_EQ(over_ranks.losses, threads.losses) << c.name;
    EXPECT_EQ(over_ranks.balances, threads.balances) << c.name;
    EXPECT_EQ(threads.balances.empty(), !c.moe) << c.name;
    EXPECT_TRUE(bitwise_equal(over_ranks.weights, threads.weights)) << c.name;
    // A checkpoint gathered over the ranks holds the threads' moments and counters.
    EXPECT_TRUE(bitwise_equal(over_ranks.state.exp_avg, threads.state.exp_avg)) << c.name;
    EXPECT_TRUE(bitwise_equal(over_ranks.state.exp_avg_sq, threads.state.exp_avg_sq)) << c.name;
    EXPECT_EQ(exec::training_progress_json(over_ranks.state.progress), exec::training_progress_json(threads.state.progress)) << c.name;
    size_t messages = 0;  // in-task collectives' messages: an event each, from the rank that ran it
    for (size_t t = 0; t < plan.tasks.size(); ++t) messages += plan.inside(static_cast<int>(t)).size();
    EXPECT_EQ(over_ranks.result.trace.events.size(), (plan.tasks.size() + messages) * 3) << c.name;
    EXPECT_EQ(over_ranks.result.task_instances, static_cast<long long>(plan.tasks.size()) * 3) << c.name;
    // Conservation: the ranks' transfers and collectives (in-task ones included) carried,
    // communicator by communicator, what the threads' did and what the plan says.
    const std::vector<double> by_ranks = traces::carried_bytes_per_communicator(plan, over_ranks.result.trace);
    EXPECT_EQ(by_ranks, traces::carried_bytes_per_communicator(plan, threads.result.trace)) << c.name;
    std::vector<double> planned = partition::planned_bytes_per_communicator(plan);
    for (double& b : planned) b *= 3;
    // (Expert parallelism's all-to-alls carry what the routers chose, not the routing model's
    // bytes: there the ranks must equal the threads alone.)
    if (c.options.experts.parallel == 1) {
      EXPECT_EQ(by_ranks, planned) << c.name;
    }
  }
}

// One time axis: a message is received after it was sent, whichever ranks the two ends ran on.
TEST(Ranks, MergedTraceIsOnOneClock) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), gpt(4, 2), options(4, 1, 4, "1f1b"));
  exec::CpuBackend backend({1, 64 * 1024}, nullptr, &ranks());
  exec::EngineOptions e;
  e.iterations = 2;
  e.ranks = &ranks();
  const exec::RunResult r = exec::run_plan(plan, backend, e);
  EXPECT_TRUE(r.completed) << r.error;
  if (ranks().rank() != 0) return;
  std::map<std::pair<int, int>, const traces::Event*> by_task;
  for (const traces::Event& ev : r.trace.events) by_task[{ev.task, ev.iteration}] = &ev;
  int checked = 0;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    if (plan.tasks[t].kind != TaskKind::recv) continue;
    const int send = plan.peer(static_cast<int>(t));
    for (int i = 0; i < 2; ++i) {
      const auto* recv_event = by_task.at({static_cast<int>(t), i});
      const auto* send_event = by_task.at({send, i});
      // Both start when both sides are there (the engine's rule); the receive ends after the
      // send began, on any rank's clock, within the offset's error.
      EXPECT_GE(recv_event->end_s, send_event->start_s - 1e-3);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(r.memory.size(), 4u);
  for (const auto& m : r.memory) EXPECT_GT(m.peak_allocated_bytes, 0);  // every rank's devices reported
}

// A task that throws on one rank stops every rank promptly; each learns the error, rank 0
// has the partial trace of all of them.
TEST(Ranks, AFailureOnOneRankStopsThemAll) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), gpt(4, 2), options(4, 1, 4, "1f1b"));
  int victim = -1;
  for (size_t t = 0; t < plan.tasks.size() && victim < 0; ++t) {
    if (plan.tasks[t].kind == TaskKind::backward && plan.tasks[t].device == 2) victim = static_cast<int>(t);
  }
  ASSERT_GE(victim, 0);
  test_support::ThrowingBackend backend(victim, &ranks());
  exec::EngineOptions e;
  e.iterations = 3;
  e.watchdog_s = 30;
  e.ranks = &ranks();
  const auto start = std::chrono::steady_clock::now();
  const exec::RunResult r = exec::run_plan(plan, backend, e);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
  EXPECT_FALSE(r.completed);
  EXPECT_FALSE(r.stalled);
  EXPECT_NE(r.error.find("rank 2: backward #" + std::to_string(victim)), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("injected failure"), std::string::npos) << r.error;
  if (ranks().rank() != 0) return;
  std::set<int> devices;
  for (const traces::Event& ev : r.trace.events) devices.insert(ev.device);
  EXPECT_EQ(devices.size(), 4u);  // iteration 0 completed everywhere
  EXPECT_LT(r.trace.events.size(), plan.tasks.size() * 3);
}

// The plan with its first receive on device 1 removed (`removed` says which task it was),
// validation bypassed.
Plan without_a_receive(int& removed) {
  Plan plan = test_support::planned(model::cpu_cluster(4), gpt(4, 2), options(4, 1, 2, "1f1b"));
  removed = -1;
  for (partition::StreamProgram& s : plan.programs[1]) {  // rank 1's device: the sender is rank 0's
    for (size_t k = 0; k < s.tasks.size() && removed < 0; ++k) {
      if (plan.tasks[static_cast<size_t>(s.tasks[k])].kind != TaskKind::recv) continue;
      removed = s.tasks[k];
      s.tasks.erase(s.tasks.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return plan;
}

// The plan's proxies over the ranks.
exec::RunResult run_proxies(const Plan& plan, double watchdog_s) {
  exec::CpuBackend backend({1, 64 * 1024}, nullptr, &ranks());
  exec::EngineOptions e;
  e.watchdog_s = watchdog_s;
  e.ranks = &ranks();
  return exec::run_plan(plan, backend, e);
}

// Without the receive, its sender on one rank waits for ever, and so do the ranks after it.
// Every rank reports where its streams are.
TEST(Ranks, AStallIsReportedByEveryRank) {
  int removed = -1;
  const Plan plan = without_a_receive(removed);
  ASSERT_GE(removed, 0);
  const auto start = std::chrono::steady_clock::now();
  const exec::RunResult r = run_proxies(plan, 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15);
  EXPECT_FALSE(r.completed);
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.error.find("watchdog"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("device 0 (host/gpu0)"), std::string::npos) << r.error;  // the sender, rank 0
  EXPECT_NE(r.error.find("to receive on channel"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("device 1 (host/gpu1)"), std::string::npos) << r.error;  // the waiter, rank 1
  EXPECT_NE(r.error.find("recv #" + std::to_string(removed)), std::string::npos) << r.error;
}

// A stalled run leaves a message its receiver never took: MPI cannot withdraw a send. The
// next run in this process must not take it for one of its own (every later receive would
// then be one message behind, and the last send never taken).
TEST(Ranks, ARunAfterAStalledOneMeetsOnlyItsOwnMessages) {
  int removed = -1;
  ASSERT_TRUE(run_proxies(without_a_receive(removed), 1).stalled);
  const exec::RunResult r =
      run_proxies(test_support::planned(model::cpu_cluster(4), gpt(4, 2), options(4, 1, 2, "1f1b")), 5);
  EXPECT_TRUE(r.completed) << r.error;
}

// The CUDA back end's communicator set-up without a GPU: four ranks walk a ring of pair groups
// and one of all four, ids made by each group's first process. Unharmed, every rank creates
// each of its groups from its maker's id. When one rank fails (making an id, or creating its
// ranks), every rank ends with an error naming it, none waits for ever, and no rank creates
// a group after it has heard.
struct SetupRun {
  std::vector<std::pair<size_t, std::string>> created;  // (group, the id it was given)
  std::string error;                                    // "" when it succeeded
  bool own = false;                                     // the error is this rank's own (not an Error naming another)
};

SetupRun set_up_ring(int failing_rank, size_t failing_group, bool in_make_id) {
  const std::vector<std::vector<int>> groups{{0, 1}, {1, 2}, {2, 3}, {0, 3}, {0, 1, 2, 3}, {2}};
  SetupRun run;
  exec::GroupSetup setup;
  setup.groups = groups.size();
  setup.processes = [&](size_t g) { return groups[g]; };
  setup.id_maker = [&](size_t g) { return groups[g].front(); };
  setup.what = [](size_t g) { return "group " + std::to_string(g); };
  const auto injected = [&](size_t g, bool making) {
    if (ranks().rank() == failing_rank && g == failing_group && making == in_make_id) {
      throw std::runtime_error("injected failure in group " + std::to_string(g));
    }
  };
  setup.make_id = [&](size_t g) {
    injected(g, true);
    const std::string id = "id of " + std::to_string(g) + " from rank " + std::to_string(ranks().rank());
    const auto bytes = std::as_bytes(std::span<const char>(id.data(), id.size()));
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  };
  setup.create = [&](size_t g, std::span<const std::byte> id) {
    injected(g, false);
    run.created.emplace_back(g, std::string(reinterpret_cast<const char*>(id.data()), id.size()));
  };
  const std::atomic<bool> stop{false};
  try {
    exec::set_up_groups(setup, ranks().rank(), &ranks(), stop);
  } catch (const Error& e) {
    run.error = e.what();
  } catch (const std::exception& e) {
    run.error = e.what();
    run.own = true;
  }
  return run;
}

TEST(Ranks, CommunicatorSetUpCreatesEveryGroupFromItsMakersId) {
  const SetupRun run = set_up_ring(-1, 0, false);
  EXPECT_EQ(run.error, "");
  std::vector<std::pair<size_t, std::string>> want;
  const int me = ranks().rank();
  const std::vector<std::vector<int>> groups{{0, 1}, {1, 2}, {2, 3}, {0, 3}, {0, 1, 2, 3}, {2}};
  for (size_t g = 0; g < groups.size(); ++g) {
    if (std::find(groups[g].begin(), groups[g].end(), me) == groups[g].end()) continue;
    want.emplace_back(g, "id of " + std::to_string(g) + " from rank " + std::to_string(groups[g].front()));
  }
  EXPECT_EQ(run.created, want);
}

TEST(Ranks, ACommunicatorSetUpFailureReachesEveryRank) {
  // Rank 1 fails creating group 0 (rank 0 has created it: it hears at group 3, from rank 3).
  {
    const auto start = std::chrono::steady_clock::now();
    const SetupRun run = set_up_ring(1, 0, false);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
    EXPECT_NE(run.error.find("injected failure in group 0"), std::string::npos) << run.error;
    EXPECT_EQ(run.own, ranks().rank() == 1) << run.error;
    std::vector<size_t> created;
    for (const auto& [g, id] : run.created) created.push_back(g);
    const std::map<int, std::vector<size_t>> want{{0, {0}}, {1, {}}, {2, {}}, {3, {}}};
    EXPECT_EQ(created, want.at(ranks().rank())) << "rank " << ranks().rank();
    if (ranks().rank() != 1) {  // (rank 0 hears it from rank 3, who heard it from rank 2)
      EXPECT_EQ(run.error, "rank 1 failed: injected failure in group 0");
    }
  }
  // Rank 2 fails making group 2's id: rank 3 hears at once, rank 0 from rank 3 (group 3),
  // rank 1 in the group of all four.
  {
    const SetupRun run = set_up_ring(2, 2, true);
    EXPECT_NE(run.error.find("injected failure in group 2"), std::string::npos) << run.error;
    EXPECT_EQ(run.own, ranks().rank() == 2) << run.error;
    for (const auto& [g, id] : run.created) EXPECT_LT(g, 2u) << "rank " << ranks().rank() << " created group " << g;
    if (ranks().rank() != 2) {
      EXPECT_EQ(run.error, "rank 2 failed: injected failure in group 2");
    }
  }
  // Rank 2 fails creating its group alone, the last: only the last exchange tells the others.
  {
    const SetupRun run = set_up_ring(2, 5, false);
    EXPECT_NE(run.error.find("injected failure in group 5"), std::string::npos) << run.error;
    if (ranks().rank() != 2) {
      EXPECT_EQ(run.error, "rank 2 failed: injected failure in group 5");
    }
  }
}

}  // namespace
}  // namespace hetflow

// Other ranks print only their failures, each line saying which rank.
class FailuresOnly final : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, r.file_name() != nullptr ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }

 private:
  int rank_;
};

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  hetflow::exec::Ranks& ranks = hetflow::exec::Ranks::world();
  if (ranks.rank() != 0) {  // one report, rank 0's; a failure anywhere still fails the status
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(ranks.rank()));
  }
  return RUN_ALL_TESTS();
}
