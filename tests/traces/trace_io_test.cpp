// Oracles: CSV must round-trip exactly; bad files must name file, line and column; no input
// may crash the reader; the Chrome JSON must say what the trace says (checked by parsing it).
#include "traces/trace_io.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {
namespace {

Event event(int task, int device, std::string stream, std::string kind, double start_s, double end_s) {
  Event e;
  e.task = task;
  e.device = device;
  e.stream = std::move(stream);
  e.kind = partition::parse_task_kind(kind);
  e.purpose = partition::Purpose::compute;
  e.start_s = start_s;
  e.end_s = end_s;
  return e;
}

// Two devices (the second holds stages 1 and 2), a message of an in-task collective within
// a forward, a transfer, an all-reduce, awkward numbers and names that need quoting.
Trace sample_trace() {
  Trace t;
  t.source = "sim";
  t.plan = "gpt, \"small\"\non 3 GPUs";
  t.device_names = {"A100-80GB", "V100, 32 GB", "odd \"name\""};
  const double third = 1.0 / 3;

  Event f = event(0, 0, "compute", "forward", 0, third);
  f.stage = 0, f.microbatch = 3, f.flops = 1e12;
  Event m = event(0, 0, "compute", "collective", 0.125, 0.25);
  m.purpose = partition::Purpose::tensor_parallel, m.stage = 0, m.microbatch = 3, m.group = 2, m.message = 1, m.bytes = 4096;
  Event send = event(1, 0, "send>1:act", "send", third, third + 1e-9);
  send.purpose = partition::Purpose::activation, send.stage = 0, send.microbatch = 3, send.peer = 1, send.group = 7, send.bytes = 2.1e6;
  Event recv = send;
  recv.task = 2, recv.device = 1, recv.stream = "recv<0:act", recv.kind = partition::TaskKind::recv, recv.peer = 0;
  Event b1 = event(3, 1, "compute", "backward", 0.5, 0.75);
  b1.stage = 1, b1.microbatch = 3, b1.flops = 2e12;
  Event b2 = b1;
  b2.task = 4, b2.stage = 2, b2.start_s = 0.75, b2.end_s = 1;
  Event ar0 = event(5, 0, "comm,dp", "collective", 1, 1.25);
  ar0.purpose = partition::Purpose::data_parallel, ar0.group = 0, ar0.bytes = 64e6;
  Event ar1 = ar0;
  ar1.task = 6, ar1.device = 1, ar1.stream = "x\"y\r\nz";
  Event opt = event(7, 2, "", "optimizer", 5e-324, 1e300);
  opt.iteration = 2, opt.flops = 1.7976931348623157e308, opt.bytes = 0.1 + 0.2;
  t.events = {f, m, send, recv, b1, b2, ar0, ar1, opt};
  return t;
}

TEST(SortEvents, OrdersByStartDeviceStreamTaskKindAndIsStable) {
  Trace t;
  Event a = event(5, 1, "s", "send", 1, 2);
  Event b = event(4, 1, "s", "send", 1, 2);
  Event c = event(9, 0, "s", "recv", 1, 2);
  Event d = event(1, 0, "z", "forward", 0, 1);
  Event e1 = event(2, 0, "a", "recv", 1, 3);
  Event e2 = e1;
  e2.bytes = 1;  // equal on every key: must keep its place after e1
  t.events = {a, b, e2, c, d, e1};
  sort_events(t);
  EXPECT_EQ(t.events, (std::vector<Event>{d, e2, e1, c, b, a}));
}

TEST(TraceCsv, RoundTripIsExact) {
  Trace t = sample_trace();
  std::string text = write_trace_csv(t);
  Trace back = read_trace_csv(text, "t.csv");
  EXPECT_EQ(back.source, t.source);
  EXPECT_EQ(back.plan, t.plan);
  EXPECT_EQ(back.device_names, t.device_names);
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) EXPECT_EQ(back.events[i], t.events[i]) << "event " << i;
  EXPECT_EQ(write_trace_csv(back), text);
}

// A run that stopped short says so, and how many iterations it was to have; a complete
// trace writes neither line (so files written before both existed read as they did).
TEST(TraceCsv, APartialTraceSaysWhyAndItsPlannedIterations) {
  Trace t = sample_trace();
  const std::string complete = write_trace_csv(t);
  EXPECT_EQ(complete.find("# partial"), std::string::npos);
  EXPECT_EQ(complete.find("# planned iterations"), std::string::npos);
  t.partial = "interrupted by SIGINT (Ctrl-C), during step 2 of 4";
  t.planned_iterations = 4;
  const std::string text = write_trace_csv(t);
  EXPECT_NE(text.find("\n# partial: \"interrupted by SIGINT (Ctrl-C), during step 2 of 4\"\n# planned iterations: 4\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(read_trace_csv(text, "t.csv"), t);
}

TEST(TraceCsv, EmptyTraceRoundTrips) {
  Trace t;
  EXPECT_EQ(read_trace_csv(write_trace_csv(t), "t.csv"), t);
}

TEST(TraceCsv, StartsWithTheDocumentedHeader) {
  std::string text = write_trace_csv(sample_trace());
  EXPECT_EQ(text.substr(0, text.find("# plan")), "# hetflow trace v2\n# source: sim\n");
  EXPECT_NE(text.find("\n# device 0 A100-80GB\n# device 1 \"V100, 32 GB\"\n"), std::string::npos);
  EXPECT_NE(text.find("\ntask,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,"
                      "start_s,end_s,bytes,flops,message\n0,0,compute,forward,compute,0,0,3,-1,-1,0,"
                      "0.3333333333333333,0,1e+12,-1\n0,0,compute,collective,tensor_parallel,0,0,3,-1,2,0.125,0.25,"
                      "4096,0,1\n"),
            std::string::npos);
}

// A message beside its task's work (a ring's sendrecv) writes version 3, its overlap_s the
// last column, and reads back the same; a trace without one stays version 2 (above).
TEST(TraceCsv, AMessageBesideTheWorkWritesVersionThree) {
  Trace t = sample_trace();
  t.events[1].overlap_s = 0.0625;
  const std::string text = write_trace_csv(t);
  EXPECT_EQ(text.substr(0, text.find("\n")), "# hetflow trace v3");
  EXPECT_NE(text.find(",bytes,flops,message,overlap_s\n"), std::string::npos) << text;
  EXPECT_NE(text.find(",4096,0,1,0.0625\n"), std::string::npos) << text;
  EXPECT_EQ(read_trace_csv(text, "t.csv"), t);
  // More than the message's time, or on a task's own event, is refused naming the column.
  for (const auto& [from, to] : {std::pair{std::string(",4096,0,1,0.0625\n"), std::string(",4096,0,1,0.5\n")},
                                 {std::string("1e+12,-1,0\n"), std::string("1e+12,-1,0.1\n")}}) {
    std::string broken = text;
    ASSERT_NE(broken.find(from), std::string::npos) << from;
    broken.replace(broken.find(from), from.size(), to);
    try {
      read_trace_csv(broken, "t.csv");
      ADD_FAILURE() << "read " << to;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "overlap_s") << e.what();
    }
  }
}

// A version 1 file (before in-task messages had events) reads as it did: every event a task's.
TEST(TraceCsv, ReadsVersionOneFiles) {
  const std::string text =
      "# hetflow trace v1\n"
      "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops\n"
      "3,0,comm,collective,data_parallel,0,-1,-1,-1,0,1,2,64,0\n";
  const Trace t = read_trace_csv(text, "t.csv");
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].message, -1);
  EXPECT_EQ(t.events[0].group, 0);
  EXPECT_EQ(t.events[0].bytes, 64);
}

TEST(TraceCsv, ReadsCrlfLineEnds) {
  Trace t = sample_trace();
  t.plan = "plain";
  t.events.resize(7);  // the last ones hold line breaks in their names
  std::string text = write_trace_csv(t), crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  EXPECT_EQ(read_trace_csv(crlf, "t.csv"), t);
}

TEST(TraceCsv, ReadsWithoutDeviceListAndSkipsNotesAndBlankLines) {
  std::string text =
      "# hetflow trace v1\n# a note\n\n# device\n"
      "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops\n"
      "0,7,compute,forward,compute,0,0,0,-1,-1,0,1e-9,0,5\n\n";
  Trace t = read_trace_csv(text, "t.csv");
  EXPECT_TRUE(t.device_names.empty());
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].device, 7);
  EXPECT_EQ(t.events[0].end_s, 1e-9);
}

const std::string kPrefix =
    "# hetflow trace v1\n# source: sim\n# plan: p\n# device 0 A\n# device 1 B\n"
    "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops\n";
const std::string kRow = "0,0,compute,forward,compute,0,0,0,-1,-1,0,1,0,0";

// kRow with column k replaced.
std::string row_with(size_t k, const std::string& value) {
  std::vector<std::string> cols;
  size_t start = 0;
  for (size_t comma; (comma = kRow.find(',', start)) != std::string::npos; start = comma + 1) {
    cols.push_back(kRow.substr(start, comma - start));
  }
  cols.push_back(kRow.substr(start));
  cols.at(k) = value;
  std::string out;
  for (size_t i = 0; i < cols.size(); ++i) out += (i ? "," : "") + cols[i];
  return out;
}

struct BadCase {
  std::string text;
  int line;
  std::string field;
  std::string message;
};

TEST(TraceCsv, BadInputsNameFileLineAndColumn) {
  const std::string header = "task,device,stream,kind,purpose,iteration,stage,microbatch,peer,group,start_s,end_s,bytes,flops";
  const std::vector<BadCase> cases = {
      {kPrefix + row_with(10, "abc") + "\n", 7, "start_s", "expected a number, found 'abc'"},
      {kPrefix + row_with(0, "x") + "\n", 7, "task", "expected an integer, found 'x'"},
      {kPrefix + row_with(0, "-2") + "\n", 7, "task", "expected a task id >= 0, found '-2'"},
      {kPrefix + row_with(5, "1.5") + "\n", 7, "iteration", "expected an integer, found '1.5'"},
      {kPrefix + row_with(9, "99999999999") + "\n", 7, "group", "expected an integer, found '99999999999'"},
      {kPrefix + row_with(7, "") + "\n", 7, "microbatch", "expected an integer, found ''"},
      {kPrefix + row_with(6, " 1") + "\n", 7, "stage", "expected an integer, found ' 1'"},
      {kPrefix + row_with(10, "2") + "\n", 7, "end_s", "expected end_s >= start_s (2), found '1'"},
      {kPrefix + row_with(10, "nan") + "\n", 7, "start_s", "expected a finite number, found 'nan'"},
      {kPrefix + row_with(10, "-inf") + "\n", 7, "start_s", "expected a finite number, found '-inf'"},
      {kPrefix + row_with(11, "1e400") + "\n", 7, "end_s", "expected a number within double range, found '1e400'"},
      {kPrefix + row_with(13, "0x10") + "\n", 7, "flops", "expected a number, found '0x10'"},
      {kPrefix + row_with(1, "2") + "\n", 7, "device", "expected a device in 0..1, found '2'"},
      {kPrefix + row_with(1, "-1") + "\n", 7, "device", "expected a device in 0..1, found '-1'"},
      {kPrefix + row_with(8, "5") + "\n", 7, "peer", "expected -1 or a device in 0..1, found '5'"},
      {kPrefix + row_with(12, "-1") + "\n", 7, "bytes", "expected a number >= 0, found '-1'"},
      {kPrefix + kRow + "\n" + kRow.substr(0, kRow.rfind(',')) + "\n", 8, "columns", "expected 14 columns, found 13"},
      {kPrefix + kRow + ",0\n", 7, "columns", "expected 14 columns, found 15"},
      {kPrefix + "0,0,\"compute,forward\n", 7, "stream", "unterminated quoted field"},
      {kPrefix + row_with(2, "\"comp\"x") + "\n", 7, "stream",
       "expected ',' or a line end after the closing quote, found 'x'"},
      {kPrefix + row_with(2, "com\"pute") + "\n", 7, "stream", "unexpected '\"' in an unquoted field"},
      // A quoted line break: the bad row after it is on line 9.
      {kPrefix + row_with(2, "\"a\nb\"") + "\n" + row_with(11, "x") + "\n", 9, "end_s",
       "expected a number, found 'x'"},
      {kPrefix + row_with(3, "\tx\x01") + "\n", 7, "kind",
       "expected a task kind (forward, backward, backward_weight, optimizer, send, recv, collective, load, to_host, "
       "host_optimizer, to_device), found '\\x09x\\x01'"},
      {kPrefix + row_with(4, "dp") + "\n", 7, "purpose",
       "expected a purpose (compute, activation, gradient, tensor_parallel, sequence_parallel, data_parallel, embedding, "
       "ps_push, ps_pull, gradient_norm, offload, context_parallel, expert_parallel), found 'dp'"},
      {"# hetflow trace v4\n", 1, "format",
       "expected '# hetflow trace v3' (or '# hetflow trace v2', '# hetflow trace v1'), found '# hetflow trace v4'"},
      {"", 1, "format", "expected '# hetflow trace v3' (or '# hetflow trace v2', '# hetflow trace v1'), found ''"},
      {"\x7f" "ELF\x02\x01", 1, "format",
       "expected '# hetflow trace v3' (or '# hetflow trace v2', '# hetflow trace v1'), found '\\x7fELF\\x02\\x01'"},
      // Version 2: the message column.
      {"# hetflow trace v2\n" + header + ",message\n" + kRow + "\n", 3, "columns", "expected 15 columns, found 14"},
      {"# hetflow trace v2\n" + header + "\n", 2, "header", "expected '" + header + ",message', found 'task,device,stream,kind,purpose,iteratio...'"},
      {"# hetflow trace v2\n" + header + ",message\n" + kRow + ",x\n", 3, "message", "expected an integer, found 'x'"},
      {"# hetflow trace v2\n" + header + ",message\n" + kRow + ",-2\n", 3, "message",
       "expected -1 or a message index >= 0, found '-2'"},
      {"# hetflow trace v2\n" + header + ",message\n" + kRow + ",0\n", 3, "message",
       "expected -1 for an event of kind forward (only a collective's message has an index), found '0'"},
      {kPrefix.substr(0, kPrefix.find("task")), 6, "header",
       "expected the column header '" + header + "', found the end of the file"},
      {"# hetflow trace v1\ntask,device\n", 2, "header", "expected '" + header + "', found 'task,device'"},
      {"# hetflow trace v1\n# device 1 B\n" + header + "\n", 2, "device", "expected device 0, found '1'"},
      {"# hetflow trace v1\n# device 0 A\n# device x B\n", 3, "device", "expected device 1, found 'x'"},
      {"# hetflow trace v1\n# source: sim\n# plan: \"p\n\n", 3, "plan", "unterminated quoted field"},
      {"# hetflow trace v1\n# partial: stopped\n# planned iterations: 0\n", 3, "planned iterations",
       "expected a whole number from 1 to 2000000, found '0'"},
      {"# hetflow trace v1\n# planned iterations: 3x\n", 2, "planned iterations",
       "expected a whole number from 1 to 2000000, found '3x'"},
      {"# hetflow trace v1\n# planned iterations: 2000001\n", 2, "planned iterations",
       "expected a whole number from 1 to 2000000, found '2000001'"},
      {"# hetflow trace v1\n# device 0 A\n" + header + "\n" + kRow + "\n" + row_with(1, "1") + "\n", 5, "device",
       "expected a device in 0..0, found '1'"},
      {"# hetflow trace v1\n" + header + "\n" + row_with(1, "-1") + "\n", 3, "device",
       "expected a device in 0..999999, found '-1'"},
      // Found while fuzzing: without a device list any id was read, and the Chrome trace's
      // process number (device + 1) overflowed at 2147483647. Ids are bounded as clusters are.
      {"# hetflow trace v1\n" + header + "\n" + row_with(1, "2147483647") + "\n", 3, "device",
       "expected a device in 0..999999, found '2147483647'"},
      {"# hetflow trace v1\n" + header + "\n" + row_with(8, "1000000") + "\n", 3, "peer",
       "expected -1 or a device in 0..999999, found '1000000'"},
      {"# hetflow trace v1\r\n# source: x\r\n" + header + "\r\n" + kRow + "\r\n" + row_with(12, "b") + "\r\n", 5,
       "bytes", "expected a number, found 'b'"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      read_trace_csv(c.text, "trace.csv");
      ADD_FAILURE() << "no error";
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), "trace.csv");
      EXPECT_EQ(e.line(), c.line);
      EXPECT_EQ(e.field(), c.field);
      EXPECT_EQ(e.message(), c.message);
    }
  }
}

TEST(TraceCsv, ErrorTextReadsFileLineFieldMessage) {
  try {
    read_trace_csv(kPrefix + row_with(10, "abc") + "\n", "trace.csv");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "trace.csv:7: start_s: expected a number, found 'abc'");
  }
}

TEST(TraceCsv, LongFoundTextIsCutShort) {
  try {
    read_trace_csv(kPrefix + row_with(10, std::string(1000, '7') + "x") + "\n", "t.csv");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_LT(e.message().size(), 100u);
  }
}

// Returns true when it parsed; fails the test on anything but InputError.
bool parses_or_input_error(const std::string& text) {
  try {
    read_trace_csv(text, "fuzz.csv");
    return true;
  } catch (const InputError& e) {
    EXPECT_GE(e.line(), 1);
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InputError: " << e.what() << " on " << ::testing::PrintToString(text);
  } catch (...) {
    ADD_FAILURE() << "not an InputError on " << ::testing::PrintToString(text);
  }
  return false;
}

TEST(TraceCsv, GarbageGivesOnlyInputErrors) {
  const std::string valid = write_trace_csv(sample_trace());
  int parsed = 0, rejected = 0;
  auto count = [&](const std::string& text) { parses_or_input_error(text) ? ++parsed : ++rejected; };

  for (size_t n = 0; n <= valid.size(); ++n) count(valid.substr(0, n));  // every truncation

  std::mt19937 rng(20240601);
  const std::string spicy = ",\"\n\r#-+.e0123456789 \t";
  auto random_byte = [&] {
    return rng() % 2 ? spicy[rng() % spicy.size()] : static_cast<char>(rng() % 256);
  };
  for (int i = 0; i < 3000; ++i) {  // a few bytes of the valid file changed, dropped or added
    std::string text = valid;
    for (int m = 0, edits = 1 + static_cast<int>(rng() % 3); m < edits; ++m) {
      size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[at] = random_byte(); break;
        case 1: text.erase(at, 1 + rng() % 8); break;
        default: text.insert(at, 1, random_byte());
      }
    }
    count(text);
  }
  for (int i = 0; i < 2000; ++i) {  // random bytes, half behind a valid header
    std::string text = i % 2 ? kPrefix : std::string();
    for (size_t n = rng() % 300; n > 0; --n) text += random_byte();
    count(text);
  }
  EXPECT_GT(parsed, 100);  // the fuzz reached past the header, not only the first line
  EXPECT_GT(rejected, 1000);
}

// ---------------------------------------------------------------- Chrome trace

using nlohmann::json;

std::vector<json> events_with_ph(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

TEST(ChromeTrace, HasProcessesThreadsAndCompleteEvents) {
  Trace t = sample_trace();
  json doc = json::parse(write_chrome_trace(t));
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  EXPECT_EQ(doc.at("otherData").at("source"), "sim");
  EXPECT_EQ(doc.at("otherData").at("plan"), t.plan);

  std::map<int, std::string> process_names;    // pid -> name
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  for (const json& m : events_with_ph(doc, "M")) {
    if (m.at("name") == "process_name") {
      EXPECT_TRUE(process_names.emplace(m.at("pid"), m.at("args").at("name")).second) << "twice: " << m;
    } else if (m.at("name") == "thread_name") {
      EXPECT_TRUE(threads.emplace(std::pair{m.at("pid"), m.at("tid")}, m.at("args").at("name")).second);
    }
  }
  ASSERT_EQ(process_names.size(), t.device_names.size());
  for (size_t d = 0; d < t.device_names.size(); ++d) EXPECT_EQ(process_names.at(static_cast<int>(d) + 1), t.device_names[d]);
  std::set<std::pair<int, std::string>> streams;
  for (const Event& e : t.events) streams.insert({e.device, e.stream});
  EXPECT_EQ(threads.size(), streams.size());

  std::vector<json> slices = events_with_ph(doc, "X");
  ASSERT_EQ(slices.size(), t.events.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const Event& e = t.events[i];
    const json& x = slices[i];
    SCOPED_TRACE(x.dump());
    EXPECT_EQ(x.at("ts").get<double>(), e.start_s * 1e6);
    EXPECT_EQ(x.at("dur").get<double>(), (e.end_s - e.start_s) * 1e6);
    EXPECT_EQ(x.at("cat"), std::string(partition::to_string(e.kind)));
    EXPECT_EQ(x.at("pid"), e.device + 1);
    EXPECT_EQ(threads.at({x.at("pid"), x.at("tid")}), e.stream);
    EXPECT_EQ(x.at("args").at("task"), e.task);
    EXPECT_EQ(x.at("args").at("iteration"), e.iteration);
    EXPECT_EQ(x.at("args").at("microbatch"), e.microbatch);
    EXPECT_EQ(x.at("args").at("bytes").get<double>(), e.bytes);
    EXPECT_EQ(x.at("args").at("flops").get<double>(), e.flops);
    EXPECT_EQ(x.at("args").at("purpose"), std::string(partition::to_string(e.purpose)));
    if (e.message >= 0) {
      EXPECT_EQ(x.at("args").at("message"), e.message);  // (within its task's slice)
    }
  }
  std::vector<std::string> names;
  for (const json& x : slices) names.push_back(x.at("name"));
  EXPECT_EQ(names, (std::vector<std::string>{"F3", "tensor_parallel 4 KiB", "send 2 MiB", "recv 2 MiB", "B3.1", "B3.2", "data_parallel 61 MiB",
                                             "data_parallel 61 MiB", "optimizer"}));
}

TEST(ChromeTrace, EachTransferHasMatchingFlowEvents) {
  Trace t = sample_trace();
  Event send2 = event(8, 1, "send>0:grad", "send", 2, 3);
  send2.group = 9, send2.peer = 0, send2.bytes = 1500;
  Event recv2 = send2;  // posted before its send: the arrow must not point back in time
  recv2.task = 9, recv2.device = 0, recv2.stream = "recv<1:grad", recv2.kind = partition::TaskKind::recv, recv2.start_s = 1.5;
  t.events.push_back(recv2);
  t.events.push_back(send2);
  json doc = json::parse(write_chrome_trace(t));

  auto slice_of = [&](int task) {
    for (const json& x : events_with_ph(doc, "X")) {
      if (x.at("args").at("task") == task) return x;
    }
    throw std::runtime_error("no slice");
  };
  std::vector<json> starts = events_with_ph(doc, "s"), finishes = events_with_ph(doc, "f");
  ASSERT_EQ(starts.size(), 2u);
  ASSERT_EQ(finishes.size(), 2u);
  const std::vector<std::pair<int, int>> pairs = {{1, 2}, {8, 9}};  // (send task, recv task)
  for (size_t k = 0; k < pairs.size(); ++k) {
    json send = slice_of(pairs[k].first), recv = slice_of(pairs[k].second);
    const json &s = starts[k], &f = finishes[k];
    EXPECT_EQ(s.at("id"), send.at("args").at("group"));
    EXPECT_EQ(f.at("id"), s.at("id"));
    EXPECT_EQ(f.at("cat"), s.at("cat"));
    EXPECT_EQ(f.at("name"), s.at("name"));
    EXPECT_EQ(f.at("bp"), "e");
    EXPECT_EQ(s.at("pid"), send.at("pid"));
    EXPECT_EQ(s.at("tid"), send.at("tid"));
    EXPECT_EQ(s.at("ts"), send.at("ts"));
    EXPECT_EQ(f.at("pid"), recv.at("pid"));
    EXPECT_EQ(f.at("tid"), recv.at("tid"));
    double f_ts = f.at("ts"), r_ts = recv.at("ts"), r_dur = recv.at("dur");
    EXPECT_GE(f_ts, r_ts);
    EXPECT_LE(f_ts, r_ts + r_dur);
    EXPECT_GE(f_ts, s.at("ts").get<double>());
  }
  EXPECT_EQ(finishes[0].at("ts"), slice_of(2).at("ts"));  // the plain case: at the recv's start
}

TEST(ChromeTrace, IsDeterministicAndSurvivesBadUtf8) {
  Trace t = sample_trace();
  t.device_names[2] = "bad \xff utf8";
  std::string a = write_chrome_trace(t);
  Trace copy = t;
  EXPECT_EQ(write_chrome_trace(copy), a);
  json parsed;
  EXPECT_NO_THROW(parsed = json::parse(a));
}

}  // namespace
}  // namespace hetflow::traces
