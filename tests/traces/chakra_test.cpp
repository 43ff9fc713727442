// Plans as Chakra execution traces and back. The oracles: a plan read back from its own
// export has the same tasks, streams, transfers and collectives (in-task ones included: a
// pass written as parts of work with its messages between them joins back into one task) and
// the same analytic iteration time (the simulator's is compared in
// tests/tools/chakra_cli_test.cpp); the same files with hetflow's own attributes stripped (a
// trace as another tool writes it) still read, by Chakra's standard fields alone; and broken
// files are refused naming file, node and field.
#include "traces/chakra.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <functional>
#include <set>
#include <tuple>

#include "chakra/et_def.pb.h"
#include "model/error.hpp"
#include "model/io.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

Plan plan_of(const model::Cluster& cluster, partition::PlanOptions o) {
  const model::Network net = model::load_network("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256");
  o.precision = net.precision;
  o.workspace_bytes = 0;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

std::vector<std::pair<std::string, Plan>> plans() {
  const model::Cluster cpu4 = model::cpu_cluster(4);
  std::vector<std::pair<std::string, Plan>> out;
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 2;
  o.microbatches = 4;
  out.emplace_back("1f1b 2x2", plan_of(cpu4, o));
  o.data = 1;
  o.virtual_stages = 2;
  o.schedule = "interleaved";
  out.emplace_back("interleaved", plan_of(model::cpu_cluster(2), o));
  partition::PlanOptions tp;
  tp.tensor = 2;
  tp.pipeline = 2;
  tp.data = 1;
  tp.microbatches = 2;
  tp.sequence_parallel = true;
  tp.allreduce = partition::CollectiveAlgorithm::tree;
  out.emplace_back("tp2 sp pp2", plan_of(cpu4, tp));
  // Tensor parallelism beside data parallelism (in-task and ordinary collectives), the
  // backward re-running the forward's calls.
  partition::PlanOptions tp_dp;
  tp_dp.tensor = 2;
  tp_dp.data = 2;
  tp_dp.microbatches = 2;
  tp_dp.recompute = partition::Recompute::full;
  out.emplace_back("tp2 dp2 full recompute", plan_of(cpu4, tp_dp));
  partition::PlanOptions ps;
  ps.pipeline = 2;
  ps.data = 2;
  ps.microbatches = 2;
  ps.sync = partition::SyncKind::ps;
  out.emplace_back("parameter server", plan_of(cpu4, ps));
  return out;
}

struct Export {
  std::vector<traces::ChakraFile> ranks;
  std::string comm_group;
};

Export exported(const Plan& plan) {
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  Export e;
  for (traces::ChakraFile& f : traces::write_chakra(plan, cost)) {
    if (f.name == "comm_group.json") {
      e.comm_group = f.bytes;
    } else {
      e.ranks.push_back(std::move(f));
    }
  }
  return e;
}

double estimate_s(const Plan& plan) {
  return partition::estimate_plan(plan, partition::CostModel(plan.cluster, plan.layout.precision)).iteration_time_s;
}

// Rewrites each file with every node passed through `edit` (the metadata kept as it is).
std::string rewritten(const std::string& bytes, const std::function<void(ChakraProtoMsg::Node&)>& edit) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&in);
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream writer(&stream);
  for (int message = 0; coded.CurrentPosition() < static_cast<int>(bytes.size()); ++message) {
    uint64_t size = 0;
    EXPECT_TRUE(coded.ReadVarint64(&size));
    const auto limit = coded.PushLimit(static_cast<int>(size));
    if (message == 0) {
      ChakraProtoMsg::GlobalMetadata meta;
      EXPECT_TRUE(meta.ParseFromCodedStream(&coded));
      writer.WriteVarint64(meta.ByteSizeLong());
      meta.SerializeWithCachedSizes(&writer);
    } else {
      ChakraProtoMsg::Node node;
      EXPECT_TRUE(node.ParseFromCodedStream(&coded));
      edit(node);
      writer.WriteVarint64(node.ByteSizeLong());
      node.SerializeWithCachedSizes(&writer);
    }
    coded.PopLimit(limit);
  }
  writer.Trim();
  return out;
}

void strip_hetflow_attributes(ChakraProtoMsg::Node& node) {
  auto* attrs = node.mutable_attr();
  for (int i = attrs->size() - 1; i >= 0; --i) {
    if (attrs->Get(i).name().rfind("hetflow_", 0) == 0) attrs->DeleteSubrange(i, 1);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

namespace {

bool has_in_task_collectives(const Plan& plan) {
  return std::any_of(plan.collectives.begin(), plan.collectives.end(), [](const partition::Collective& c) { return c.in_task(); });
}

// Without hetflow's attributes a pass's parts of work and the messages between them read as
// tasks and collectives of their own: the same compute per device and the same bytes per
// group of devices, not the same tasks.
void expect_the_same_work(const Plan& back, const Plan& plan) {
  std::map<int, double> flops, back_flops;
  std::map<std::vector<int>, double> bytes, back_bytes;
  for (const partition::Task& t : plan.tasks) flops[t.device] += t.flops;
  for (const partition::Task& t : back.tasks) back_flops[t.device] += t.flops;
  for (const partition::Collective& c : plan.collectives) bytes[plan.members(c)] += c.bytes;
  for (const partition::Collective& c : back.collectives) back_bytes[back.members(c)] += c.bytes;
  ASSERT_EQ(back_flops.size(), flops.size());
  for (const auto& [d, f] : flops) EXPECT_NEAR(back_flops[d], f, 1e-9 * f + 1) << "device " << d;
  ASSERT_EQ(back_bytes.size(), bytes.size());
  for (const auto& [members, b] : bytes) EXPECT_NEAR(back_bytes[members], b, 1e-9 * b + 1);
}

// The same collectives, one for one: kind, algorithm, purpose, members, messages and their
// points alike, bytes within rounding (an in-task collective's come back as its messages').
void expect_the_same_collectives(const Plan& back, const Plan& plan) {
  using Key = std::tuple<std::vector<int>, int, int, int, int, int, std::vector<double>, std::vector<double>>;
  const auto key = [](const Plan& p, const partition::Collective& c) {
    return Key{p.members(c), static_cast<int>(c.kind), static_cast<int>(c.algorithm), static_cast<int>(c.purpose),
               c.root, c.messages, c.at, c.parts};
  };
  std::multimap<Key, double> bytes;
  for (const partition::Collective& c : plan.collectives) bytes.emplace(key(plan, c), c.bytes);
  ASSERT_EQ(back.collectives.size(), plan.collectives.size());
  for (const partition::Collective& c : back.collectives) {
    const auto [from, to] = bytes.equal_range(key(back, c));
    const auto it = std::find_if(from, to, [&](const auto& kb) { return std::abs(kb.second - c.bytes) <= 1e-12 * kb.second; });
    ASSERT_NE(it, to) << "a " << to_string(c.kind) << " of " << c.bytes << " bytes with " << c.at.size() << " points";
    bytes.erase(it);
  }
}

// Which task performs which in-task messages: per task its device, kind, stream and FLOPs,
// and its calls as (members, kind, message, point), in the order it performs them.
std::multiset<std::tuple<int, int, std::string, double, std::vector<std::tuple<std::vector<int>, int, int, double>>>> in_task_calls(
    const Plan& p) {
  std::multiset<std::tuple<int, int, std::string, double, std::vector<std::tuple<std::vector<int>, int, int, double>>>> out;
  for (size_t t = 0; t < p.tasks.size(); ++t) {
    const partition::Task& task = p.tasks[t];
    std::vector<std::tuple<std::vector<int>, int, int, double>> calls;
    for (const partition::InTaskCall& call : p.inside(static_cast<int>(t))) {
      const partition::Collective& c = p.collective(call.collective);
      calls.emplace_back(p.members(c), static_cast<int>(c.kind), call.message, call.at);
    }
    if (!calls.empty()) out.insert({task.device, static_cast<int>(task.kind), p.stream_name(task.stream), task.flops, calls});
  }
  return out;
}

}  // namespace

void expect_reads_back(const std::string& name, const Plan& plan) {
  {
    SCOPED_TRACE(name);
    partition::require_valid(plan);
    const Export e = exported(plan);
    ASSERT_EQ(e.ranks.size(), plan.device_names.size());
    const Plan back = traces::read_chakra(e.ranks, e.comm_group, plan.cluster, "chakra:dir");
    EXPECT_TRUE(partition::validate_plan(back).ok()) << partition::validate_plan(back).problems.front();
    ASSERT_EQ(back.tasks.size(), plan.tasks.size());
    EXPECT_EQ(back.channels.size(), plan.channels.size());
    expect_the_same_collectives(back, plan);
    EXPECT_EQ(has_in_task_collectives(plan), name.rfind("tp", 0) == 0);
    EXPECT_EQ(in_task_calls(back), in_task_calls(plan));
    // Tasks come back device by device in the files' order: compare them as multisets.
    auto signature = [](const Plan& p) {
      std::multiset<std::tuple<int, std::string, std::string, double, double, double>> s;
      for (const partition::Task& t : p.tasks) {
        s.insert({t.device, std::string(to_string(t.kind)), p.stream_name(t.stream), t.flops, t.memory_bytes, t.bytes});
      }
      return s;
    };
    EXPECT_EQ(signature(back), signature(plan));
    EXPECT_NEAR(estimate_s(back), estimate_s(plan), 1e-9 * estimate_s(plan));
  }
}

TEST(Chakra, APlanReadBackFromItsExportIsTheSameWork) {
  for (const auto& [name, plan] : plans()) expect_reads_back(name, plan);
  // Offload's copies as memory stores and loads, its host step a compute node of its own kind.
  partition::PlanOptions offload;
  offload.data = 2;
  offload.zero_stage = 1;
  offload.offload_optimizer = true;
  expect_reads_back("offloaded", plan_of(model::cpu_cluster(2), offload));
  // An all-to-all with uneven parts (the expert axis's dispatch) comes back with them.
  partition::PlanOptions tp;
  tp.tensor = 2;
  Plan all_to_all = plan_of(model::cpu_cluster(2), tp);
  for (partition::Collective& c : all_to_all.collectives) {
    if (!c.in_task()) continue;
    c.kind = partition::CollectiveKind::all_to_all;
    c.algorithm = partition::CollectiveAlgorithm::pairwise;
    c.parts = {0.75, 0.25};
  }
  expect_reads_back("tp all-to-all", all_to_all);
}

// What another tool writes: Chakra's own fields only. Compute goes to one stream per rank,
// transfers to one per peer and tag, collectives to one per process group; the work is the
// same, and so is the critical path here (these plans never overlap two compute tasks).
TEST(Chakra, StandardFieldsAloneGiveTheSameWork) {
  for (const auto& [name, plan] : plans()) {
    SCOPED_TRACE(name);
    Export e = exported(plan);
    for (traces::ChakraFile& f : e.ranks) f.bytes = rewritten(f.bytes, strip_hetflow_attributes);
    const Plan back = traces::read_chakra(e.ranks, e.comm_group, plan.cluster, "chakra:dir");
    EXPECT_TRUE(partition::validate_plan(back).ok()) << partition::validate_plan(back).problems.front();
    if (has_in_task_collectives(plan)) {
      expect_the_same_work(back, plan);
      continue;
    }
    ASSERT_EQ(back.tasks.size(), plan.tasks.size());
    double flops = 0, back_flops = 0, bytes = 0, back_bytes = 0;
    for (const partition::Task& t : plan.tasks) flops += std::round(t.flops), bytes += std::round(t.bytes);
    for (const partition::Task& t : back.tasks) back_flops += t.flops, back_bytes += t.bytes;
    EXPECT_EQ(back_flops, flops);
    EXPECT_EQ(back_bytes, bytes);
    for (const partition::Task& t : back.tasks) {
      if (t.kind != TaskKind::send && t.kind != TaskKind::recv && t.kind != TaskKind::collective) {
        EXPECT_EQ(t.kind, TaskKind::forward);  // Chakra does not say which pass
      }
    }
    // Chakra's own fields say one collective per node: a node of m messages (hetflow_messages)
    // reads back as one collective of all its bytes, its per-message latencies lost.
    Plan one_message = plan;
    for (partition::Collective& c : one_message.collectives) c.messages = 1;
    EXPECT_NEAR(estimate_s(back), estimate_s(one_message), 0.01 * estimate_s(plan));
  }
}

TEST(Chakra, RefusesBrokenFilesNamingFileAndField) {
  const Plan plan = plans().front().second;
  const Export good = exported(plan);
  auto read = [&](const Export& e) { traces::read_chakra(e.ranks, e.comm_group, plan.cluster, "chakra:dir"); };
  auto with_rank0 = [&](std::string bytes) {
    Export e = good;
    e.ranks[0].bytes = std::move(bytes);
    return e;
  };
  // Truncated inside a message, and bytes that are no protobuf message.
  std::string msg = error_of([&] { read(with_rank0(good.ranks[0].bytes.substr(0, good.ranks[0].bytes.size() - 7))); });
  EXPECT_NE(msg.find("hetflow.0.et"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  msg = error_of([&] { read(with_rank0("\x05\xff\xff\xff\xff\xff")); });
  EXPECT_NE(msg.find("hetflow.0.et"), std::string::npos) << msg;
  msg = error_of([&] { read(with_rank0("")); });
  EXPECT_NE(msg.find("hetflow.0.et: metadata.version: empty"), std::string::npos) << msg;
  // A send to a rank that does not exist; a dependency on a node the file lacks.
  msg = error_of([&] {
    read(with_rank0(rewritten(good.ranks[0].bytes, [](ChakraProtoMsg::Node& n) {
      for (auto& a : *n.mutable_attr()) {
        if (a.name() == "comm_dst") a.set_int64_val(9);
      }
    })));
  });
  EXPECT_NE(msg.find(".comm_dst: rank 9 does not exist"), std::string::npos) << msg;
  msg = error_of([&] { read(with_rank0(rewritten(good.ranks[0].bytes, [](ChakraProtoMsg::Node& n) { n.add_ctrl_deps(123456); }))); });
  EXPECT_NE(msg.find("depends on node 123456"), std::string::npos) << msg;
  // One send too many: the channel does not pair up.
  msg = error_of([&] {
    Export e = good;
    ChakraProtoMsg::Node extra;
    extra.set_id(999999);
    extra.set_type(ChakraProtoMsg::COMM_SEND_NODE);
    for (const auto& [k, v] : {std::pair{"comm_dst", 1}, std::pair{"comm_size", 8}, std::pair{"comm_tag", 0}}) {
      auto* a = extra.add_attr();
      a->set_name(k);
      a->set_int64_val(v);
    }
    google::protobuf::io::StringOutputStream stream(&e.ranks[0].bytes);
    google::protobuf::io::CodedOutputStream w(&stream);
    w.WriteVarint64(extra.ByteSizeLong());
    extra.SerializeWithCachedSizes(&w);
    w.Trim();
    read(e);
  });
  EXPECT_NE(msg.find("comm_tag: rank 0 sends"), std::string::npos) << msg;
  // comm_group.json that is not JSON, or names a rank that does not exist.
  msg = error_of([&] {
    Export e = good;
    e.comm_group = "{";
    read(e);
  });
  EXPECT_NE(msg.find("chakra:dir/comm_group.json: comm_group: not JSON"), std::string::npos) << msg;
  msg = error_of([&] {
    Export e = good;
    e.comm_group = R"({"0": [0, 17]})";
    read(e);
  });
  EXPECT_NE(msg.find("expected ranks 0 to 3"), std::string::npos) << msg;
  // Fewer devices than ranks.
  msg = error_of([&] { traces::read_chakra(good.ranks, good.comm_group, model::cpu_cluster(2), "chakra:dir"); });
  EXPECT_NE(msg.find("chakra:dir: ranks: 4 ranks, but the cluster"), std::string::npos) << msg;
}

// WSP's edges across iterations survive the round trip in hetflow's attribute: the plan run
// for several iterations has the same critical path.
TEST(Chakra, EdgesAcrossIterationsComeBack) {
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 2;
  o.microbatches = 2;
  o.sync = partition::SyncKind::wsp;
  o.staleness = 1;
  o.iterations = 4;
  const Plan plan = plan_of(model::cpu_cluster(4), o);
  const Export e = exported(plan);
  Plan back = traces::read_chakra(e.ranks, e.comm_group, plan.cluster, "chakra:dir");
  back.layout.iterations = plan.layout.iterations;
  std::multiset<int> offsets, back_offsets;
  for (const partition::OrderEdge& edge : plan.order) offsets.insert(edge.offset);
  for (const partition::OrderEdge& edge : back.order) back_offsets.insert(edge.offset);
  EXPECT_EQ(offsets.count(0) > 0, true);
  EXPECT_EQ(back_offsets.count(2), offsets.count(2));  // staleness 1: offset D + 1
  EXPECT_GT(offsets.count(2), 0u);
  EXPECT_NEAR(estimate_s(back), estimate_s(plan), 1e-9 * estimate_s(plan));
}

namespace {

ChakraProtoMsg::AttributeProto* attribute(ChakraProtoMsg::Node& n, const std::string& name) {
  for (auto& a : *n.mutable_attr()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

void add_attribute(ChakraProtoMsg::Node& n, const std::string& name, int64_t v) {
  auto* a = n.add_attr();
  a->set_name(name);
  a->set_int64_val(v);
}

void add_double(ChakraProtoMsg::Node& n, const std::string& name, double v) {
  auto* a = n.add_attr();
  a->set_name(name);
  a->set_double_val(v);
}

// A rank file of these nodes after Chakra's metadata.
std::string file_of(const std::vector<ChakraProtoMsg::Node>& nodes) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream w(&stream);
  ChakraProtoMsg::GlobalMetadata meta;
  meta.set_version("0.0.4");
  w.WriteVarint64(meta.ByteSizeLong());
  meta.SerializeWithCachedSizes(&w);
  for (const ChakraProtoMsg::Node& n : nodes) {
    w.WriteVarint64(n.ByteSizeLong());
    n.SerializeWithCachedSizes(&w);
  }
  w.Trim();
  return out;
}

// One rank's forward pass as two parts of 100 FLOPs, [0, 0.5] and [0.5, `end`], with a
// 64-byte all-reduce between them, written by hand as another tool would mark it.
std::vector<traces::ChakraFile> pass_in_two_parts(double end) {
  ChakraProtoMsg::Node first, message, last;
  for (const auto& [n, id, begin, stop] : {std::tuple{&first, 10, 0.0, 0.5}, std::tuple{&last, 12, 0.5, end}}) {
    n->set_id(static_cast<uint64_t>(id));
    n->set_type(ChakraProtoMsg::COMP_NODE);
    add_attribute(*n, "num_ops", 100);
    add_attribute(*n, "hetflow_part_of", 12);
    add_double(*n, "hetflow_part_begin", begin);
    add_double(*n, "hetflow_part_end", stop);
  }
  message.set_id(11);
  message.set_type(ChakraProtoMsg::COMM_COLL_NODE);
  add_attribute(message, "comm_type", ChakraProtoMsg::ALL_REDUCE);
  add_attribute(message, "comm_size", 64);
  add_attribute(message, "hetflow_collective", 0);
  add_attribute(message, "hetflow_message", 0);
  add_double(message, "hetflow_at", 0.5);
  message.add_ctrl_deps(10);
  last.add_ctrl_deps(11);
  return {{"hand.0.et", file_of({first, message, last})}};
}

}  // namespace

// A pass written as parts of work and in-task messages whose marks do not fit together is
// refused naming the rank's file, the node and the field: never joined into another plan.
TEST(Chakra, RefusesBrokenInTaskNodesNamingFileNodeAndField) {
  const auto all = plans();
  const auto plan_named = [&](const std::string& name) -> const Plan& {
    return std::find_if(all.begin(), all.end(), [&](const auto& p) { return p.first == name; })->second;
  };
  const Plan& plan = plan_named("tp2 sp pp2");
  const Export good = exported(plan);
  auto error_with = [&](int rank, const std::function<void(ChakraProtoMsg::Node&)>& edit, const Export& from) {
    Export e = from;
    e.ranks[static_cast<size_t>(rank)].bytes = rewritten(e.ranks[static_cast<size_t>(rank)].bytes, edit);
    return error_of([&] { traces::read_chakra(e.ranks, e.comm_group, plan.cluster, "chakra:dir"); });
  };
  // The first pass of rank 0 written in parts: its node id (its last part's), and its first
  // in-task collective.
  int64_t task = -1, collective = -1, messages = 0;
  rewritten(good.ranks[0].bytes, [&](ChakraProtoMsg::Node& n) {
    if (const auto* a = attribute(n, "hetflow_part_of"); a != nullptr && task < 0) task = a->int64_val();
    if (const auto* a = attribute(n, "hetflow_collective"); a != nullptr && collective < 0) collective = a->int64_val();
    if (const auto* a = attribute(n, "hetflow_collective"); a != nullptr && a->int64_val() == collective) ++messages;
  });
  ASSERT_GE(task, 0);
  ASSERT_GE(collective, 0);
  ASSERT_GE(messages, 2);
  const auto expect = [](const std::string& msg, const std::string& file, const std::string& field, const std::string& what) {
    EXPECT_NE(msg.find(file + ": node "), std::string::npos) << field << ": " << msg;
    EXPECT_NE(msg.find("." + field + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  // Its parts name a node the file does not have: no last part comes.
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (auto* a = attribute(n, "hetflow_part_of"); a != nullptr && a->int64_val() == task) a->set_int64_val(999999);
         }, good),
         "hetflow.0.et", "hetflow_part_of", "node 999999's parts end at 1 without its last part");
  // A pass's parts that do not add up to its work, and ones that do (written by hand).
  expect(error_of([] { traces::read_chakra(pass_in_two_parts(0.9), "", model::cpu_cluster(1), "hand"); }), "hand.0.et",
         "hetflow_part_end", "node 12's last part ends at 0.9: its parts do not add up to its work (1)");
  const Plan hand = traces::read_chakra(pass_in_two_parts(1), "", model::cpu_cluster(1), "hand");
  EXPECT_TRUE(partition::validate_plan(hand).ok()) << partition::validate_plan(hand).problems.front();
  ASSERT_EQ(hand.tasks.size(), 1u);
  EXPECT_EQ(hand.tasks[0].flops, 200);
  ASSERT_EQ(hand.collectives.size(), 1u);
  EXPECT_EQ(hand.collectives[0].at, std::vector<double>{0.5});
  EXPECT_EQ(hand.collectives[0].bytes, 64);
  EXPECT_EQ(hand.collectives[0].tasks, std::vector<int>{0});
  // Its exact FLOPs disagree with its parts'.
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (auto* a = attribute(n, "hetflow_task_flops"); a != nullptr && n.id() == static_cast<uint64_t>(task)) {
             a->set_double_val(2 * a->double_val());
           }
         }, good),
         "hetflow.0.et", "hetflow_task_flops", "but the task's parts sum to");
  // A message at another point than where the part before it ends, and one out of order.
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (auto* a = attribute(n, "hetflow_at"); a != nullptr && attribute(n, "hetflow_message")->int64_val() == 0) {
             a->set_double_val(a->double_val() / 2 + 0.25);
           }
         }, good),
         "hetflow.0.et", "hetflow_at", "but the parts of node");
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (auto* a = attribute(n, "hetflow_message"); a != nullptr && a->int64_val() == 0) a->set_int64_val(1);
         }, good),
         "hetflow.0.et", "hetflow_message", "where its message 0 was expected");
  // In-task messages on a node that is no collective, and inside a task that is no pass.
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (n.type() != ChakraProtoMsg::COMM_SEND_NODE && n.type() != ChakraProtoMsg::COMM_RECV_NODE) return;
           add_attribute(n, "hetflow_collective", 0);
           add_attribute(n, "hetflow_message", 0);
         }, good),
         "hetflow.0.et", "type", "not COMM_COLL_NODE");
  expect(error_with(0, [&](ChakraProtoMsg::Node& n) {
           if (auto* a = attribute(n, "hetflow_part_of"); a != nullptr && a->int64_val() == task) {
             attribute(n, "hetflow_kind")->set_string_val("optimizer");
           }
         }, good),
         "hetflow.0.et", "hetflow_collective", "inside a task of kind optimizer: only forward and backward passes");
  // Rank 0 performs one message fewer of the collective than its peer: its last message is
  // another collective's, which the peer does not perform.
  const std::string msg = error_with(0, [&](ChakraProtoMsg::Node& n) {
    auto* c = attribute(n, "hetflow_collective");
    if (c == nullptr || c->int64_val() != collective || attribute(n, "hetflow_message")->int64_val() != messages - 1) return;
    c->set_int64_val(1 << 30);
    attribute(n, "hetflow_message")->set_int64_val(0);
  }, good);
  EXPECT_NE(msg.find(".hetflow_message: " + std::to_string(messages) + " messages of in-task collective " +
                     std::to_string(collective) + ", on rank 0 " + std::to_string(messages - 1)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(".et: node "), std::string::npos) << msg;
}
