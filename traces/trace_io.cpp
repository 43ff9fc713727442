#include "traces/trace_io.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"

namespace hetflow::traces {

// Shortest text that reads back (std::from_chars) to exactly the same double.
std::string format_double(double v) {
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

namespace {

// Version 2 added the column `message` (in-task collectives' messages); a version 1 file,
// without it, reads as one with -1 there. Version 3 added `overlap_s` (a message beside its
// task's work, Event::overlap_s), written only by a trace that has one: the others are
// written as version 2, as before, and read with 0 there.
constexpr std::string_view kMagic = "# hetflow trace v3";
constexpr std::string_view kMagicV2 = "# hetflow trace v2";
constexpr std::string_view kMagicV1 = "# hetflow trace v1";
constexpr std::array<std::string_view, 16> kColumns = {
    "task",       "device", "stream", "kind",    "purpose", "iteration", "stage",  "microbatch",
    "peer",       "group",  "start_s", "end_s",  "bytes",   "flops",     "message", "overlap_s"};

// Whether the trace needs version 3 (a message beside its task's work).
bool has_overlap(const Trace& trace) {
  return std::any_of(trace.events.begin(), trace.events.end(), [](const Event& e) { return e.overlap_s > 0; });
}

// The header of a file of `columns` columns (16, or version 2's 15, or version 1's 14).
std::string column_header(size_t columns = kColumns.size()) {
  std::string out;
  for (size_t k = 0; k < columns; ++k) out += (out.empty() ? "" : ",") + std::string(kColumns[k]);
  return out;
}


// ---------------------------------------------------------------- CSV reading

// The found text of an error: quoted, control bytes escaped (the input may be binary), cut
// short so one bad line cannot make a huge message.
std::string found(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out = "'";
  for (char c : text.substr(0, kMax)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + (text.size() > kMax ? "...'" : "'");
}

struct Field {
  std::string text;
  int line = 0;
};

// A cursor over the text that knows its line. Line ends are "\n" or "\r\n"; quoted fields
// may span lines.
class Scanner {
 public:
  Scanner(std::string_view text, const std::string& file) : s_(text), file_(file) {}

  bool eof() const { return pos_ >= s_.size(); }
  int line() const { return line_; }
  bool starts_with(std::string_view p) const { return s_.substr(pos_).starts_with(p); }
  void skip(size_t n) { pos_ += n; }  // callers skip only text without line ends
  bool eat(std::string_view p) { return starts_with(p) ? (skip(p.size()), true) : false; }
  bool at_line_end() const {
    return eof() || s_[pos_] == '\n' || (s_[pos_] == '\r' && (pos_ + 1 == s_.size() || s_[pos_ + 1] == '\n'));
  }
  void end_line() {
    if (!eof() && s_[pos_] == '\r') ++pos_;
    if (!eof() && s_[pos_] == '\n') ++pos_, ++line_;
  }
  // Text up to the next space or line end.
  std::string_view word() {
    size_t start = pos_;
    while (!at_line_end() && s_[pos_] != ' ') ++pos_;
    return s_.substr(start, pos_ - start);
  }
  // The rest of the line, line end consumed.
  std::string_view raw_line() {
    size_t start = pos_;
    while (!at_line_end()) ++pos_;
    std::string_view out = s_.substr(start, pos_ - start);
    end_line();
    return out;
  }

  // One field, quoted or not. An unquoted field ends at a line end, or at a comma when
  // comma_ends (header values run to the line end).
  Field field(std::string_view column, bool comma_ends) {
    Field f{{}, line_};
    auto ends_here = [&] { return at_line_end() || (comma_ends && s_[pos_] == ','); };
    if (eof() || s_[pos_] != '"') {
      size_t start = pos_;
      for (; !ends_here(); ++pos_) {
        if (s_[pos_] == '"') fail(line_, column, "unexpected '\"' in an unquoted field");
      }
      f.text = s_.substr(start, pos_ - start);
      return f;
    }
    for (++pos_;; ++pos_) {
      if (eof()) fail(f.line, column, "unterminated quoted field");
      char c = s_[pos_];
      if (c == '"' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '"') {
        f.text += '"';
        ++pos_;
      } else if (c == '"') {
        ++pos_;
        break;
      } else {
        if (c == '\n') ++line_;
        f.text += c;
      }
    }
    if (!ends_here()) {
      fail(line_, column, "expected ',' or a line end after the closing quote, found " + found(s_.substr(pos_, 1)));
    }
    return f;
  }

  // One data row: its fields and the line it starts on.
  std::vector<Field> record() {
    std::vector<Field> fields;
    for (;;) {
      size_t k = fields.size();
      fields.push_back(field(k < kColumns.size() ? kColumns[k] : "columns", true));
      if (eof() || s_[pos_] != ',') break;
      ++pos_;
    }
    end_line();
    return fields;
  }

  [[noreturn]] void fail(int line, std::string_view field, const std::string& message) const {
    throw InputError(file_, line, std::string(field), message);
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1;
  const std::string& file_;
};

int parse_int(const Scanner& in, const Field& f, std::string_view column) {
  int v = 0;
  const char* end = f.text.data() + f.text.size();
  auto r = std::from_chars(f.text.data(), end, v);
  if (f.text.empty() || r.ec != std::errc() || r.ptr != end) {
    in.fail(f.line, column, "expected an integer, found " + found(f.text));
  }
  return v;
}

double parse_double(const Scanner& in, const Field& f, std::string_view column) {
  double v = 0;
  const char* end = f.text.data() + f.text.size();
  auto r = std::from_chars(f.text.data(), end, v);
  if (f.text.empty() || r.ptr != end || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range)) {
    in.fail(f.line, column, "expected a number, found " + found(f.text));
  }
  if (r.ec != std::errc()) in.fail(f.line, column, "expected a number within double range, found " + found(f.text));
  if (!std::isfinite(v)) in.fail(f.line, column, "expected a finite number, found " + found(f.text));
  return v;
}

// "# source: x", "# plan: x", "# fingerprint: x", "# device 3 x"; other comment lines are
// notes and skipped.
void read_comment(Scanner& in, Trace& trace) {
  auto value = [&](std::string_view key) {  // the rest of the line, after one space
    if (in.starts_with(" ")) in.skip(1);
    std::string text = in.field(key, false).text;
    in.end_line();
    return text;
  };
  if (in.eat("# source:")) {
    trace.source = value("source");
  } else if (in.eat("# plan:")) {
    trace.plan = value("plan");
  } else if (in.eat("# fingerprint:")) {
    trace.fingerprint = value("fingerprint");
  } else if (in.eat("# compute:")) {
    trace.compute = value("compute");
  } else if (in.eat("# partial:")) {
    trace.partial = value("partial");
  } else if (int at = in.line(); in.eat("# planned iterations:")) {
    const std::string n = value("planned iterations");
    int v = 0;
    const auto r = std::from_chars(n.data(), n.data() + n.size(), v);
    if (r.ec != std::errc() || r.ptr != n.data() + n.size() || v < 1 || v > 2'000'000) {  // run's --warmup + --steps at most
      in.fail(at, "planned iterations", "expected a whole number from 1 to 2000000, found " + found(n));
    }
    trace.planned_iterations = v;
  } else if (int line = in.line(); in.eat("# device ")) {
    std::string_view id = in.word();
    std::string want = std::to_string(trace.device_names.size());
    if (id != want) in.fail(line, "device", "expected device " + want + ", found " + found(id));
    trace.device_names.push_back(value("device"));  // "# device 3" (no name) reads as ""
  } else {
    in.raw_line();
  }
}

// A column of names (kind, purpose) as its enum; the error lists the names accepted.
template <typename Parse>
auto enum_field(const Scanner& in, const Field& f, std::string_view column, Parse parse) {
  try {
    return parse(f.text);
  } catch (const std::invalid_argument& error) {
    const std::string accepted = error.what();  // "expected ... (names), found '...'"
    in.fail(f.line, column, accepted.substr(0, accepted.rfind(", found ")) + ", found " + found(f.text));
  }
}

Event read_event(const Scanner& in, const std::vector<Field>& f, int devices, size_t columns) {
  if (f.size() != columns) {
    in.fail(f[0].line, "columns", "expected " + std::to_string(columns) + " columns, found " + std::to_string(f.size()));
  }
  Event e;
  e.task = parse_int(in, f[0], "task");
  e.device = parse_int(in, f[1], "device");
  e.stream = f[2].text;
  // Parsed once, here: everything downstream compares enums.
  e.kind = enum_field(in, f[3], "kind", partition::parse_task_kind);
  e.purpose = enum_field(in, f[4], "purpose", partition::parse_purpose);
  e.iteration = parse_int(in, f[5], "iteration");
  e.stage = parse_int(in, f[6], "stage");
  e.microbatch = parse_int(in, f[7], "microbatch");
  e.peer = parse_int(in, f[8], "peer");
  e.group = parse_int(in, f[9], "group");
  e.start_s = parse_double(in, f[10], "start_s");
  e.end_s = parse_double(in, f[11], "end_s");
  e.bytes = parse_double(in, f[12], "bytes");
  e.flops = parse_double(in, f[13], "flops");
  if (columns > 14) e.message = parse_int(in, f[14], "message");
  if (columns > 15) e.overlap_s = parse_double(in, f[15], "overlap_s");

  if (e.task < 0) in.fail(f[0].line, "task", "expected a task id >= 0, found " + found(f[0].text));
  // Without a device list, ids are bounded as clusters are (the Chrome trace numbers
  // processes from device + 1).
  const int bound = devices > 0 ? devices : model::limits::kMaxGpus;
  std::string range = "a device in 0.." + std::to_string(bound - 1);
  if (e.device < 0 || e.device >= bound) {
    in.fail(f[1].line, "device", "expected " + range + ", found " + found(f[1].text));
  }
  if (e.peer < -1 || e.peer >= bound) {
    in.fail(f[8].line, "peer", "expected -1 or " + range + ", found " + found(f[8].text));
  }
  if (e.end_s < e.start_s) {
    in.fail(f[11].line, "end_s", "expected end_s >= start_s (" + f[10].text + "), found " + found(f[11].text));
  }
  if (e.bytes < 0) in.fail(f[12].line, "bytes", "expected a number >= 0, found " + found(f[12].text));
  if (e.flops < 0) in.fail(f[13].line, "flops", "expected a number >= 0, found " + found(f[13].text));
  if (e.message < -1) in.fail(f[14].line, "message", "expected -1 or a message index >= 0, found " + found(f[14].text));
  if (e.message >= 0 && e.kind != partition::TaskKind::collective) {
    in.fail(f[14].line, "message", "expected -1 for an event of kind " + f[3].text + " (only a collective's message has an index), found " +
                                       found(f[14].text));
  }
  if (columns > 15 && !(e.overlap_s >= 0 && e.overlap_s <= e.end_s - e.start_s && (e.overlap_s == 0 || e.message >= 0))) {
    in.fail(f[15].line, "overlap_s",
            "expected 0, or for an in-task message a part of its time (0 to end_s - start_s), found " + found(f[15].text));
  }
  return e;
}

// ---------------------------------------------------------------- Chrome trace

using Json = nlohmann::ordered_json;

std::string slice_name(const Event& e, bool several_stages) {
  using partition::TaskKind;
  if (partition::is_pass(e.kind)) {
    std::string name = e.kind == TaskKind::forward ? "F" : e.kind == TaskKind::backward ? "B" : "W";
    if (e.microbatch >= 0) name += std::to_string(e.microbatch);
    if (several_stages && e.stage >= 0) name += "." + std::to_string(e.stage);
    return name;
  }
  const std::string kind(partition::to_string(e.kind));
  if (e.kind == TaskKind::send || e.kind == TaskKind::recv) return kind + " " + model::units::human_bytes(e.bytes);
  if (e.kind == TaskKind::collective) return std::string(partition::to_string(e.purpose)) + " " + model::units::human_bytes(e.bytes);
  return kind;
}

Json metadata(const char* name, int pid, int tid, Json args) {
  return Json{{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

std::string write_trace_csv(const Trace& trace) {
  const bool v3 = has_overlap(trace);
  std::string out = std::string(v3 ? kMagic : kMagicV2) + "\n";
  out += "# source: " + csv_field(trace.source) + "\n";
  out += "# plan: " + csv_field(trace.plan) + "\n";
  if (!trace.fingerprint.empty()) out += "# fingerprint: " + csv_field(trace.fingerprint) + "\n";
  if (!trace.compute.empty()) out += "# compute: " + csv_field(trace.compute) + "\n";
  if (!trace.partial.empty()) out += "# partial: " + csv_field(trace.partial) + "\n";
  if (trace.planned_iterations > 0) out += "# planned iterations: " + std::to_string(trace.planned_iterations) + "\n";
  for (size_t d = 0; d < trace.device_names.size(); ++d) {
    out += "# device " + std::to_string(d) + " " + csv_field(trace.device_names[d]) + "\n";
  }
  out += column_header(v3 ? kColumns.size() : kColumns.size() - 1) + "\n";
  for (const Event& e : trace.events) {
    for (int v : {e.task, e.device}) out += std::to_string(v) + ",";
    out += csv_field(e.stream) + ",";
    out += csv_field(std::string(partition::to_string(e.kind))) + ",";
    out += csv_field(std::string(partition::to_string(e.purpose))) + ",";
    for (int v : {e.iteration, e.stage, e.microbatch, e.peer, e.group}) out += std::to_string(v) + ",";
    out += format_double(e.start_s) + "," + format_double(e.end_s) + "," + format_double(e.bytes) + "," +
           format_double(e.flops) + "," + std::to_string(e.message) + (v3 ? "," + format_double(e.overlap_s) : "") + "\n";
  }
  return out;
}

Trace read_trace_csv(const std::string& text, const std::string& file) {
  Scanner in(text, file);
  if (in.starts_with("\xEF\xBB\xBF")) in.skip(3);  // a UTF-8 byte-order mark from an editor
  std::string_view first = in.raw_line();
  if (first != kMagic && first != kMagicV2 && first != kMagicV1) {
    in.fail(1, "format", "expected '" + std::string(kMagic) + "' (or '" + std::string(kMagicV2) + "', '" +
                             std::string(kMagicV1) + "'), found " + found(first));
  }
  const size_t columns = kColumns.size() - (first == kMagic ? 0 : first == kMagicV2 ? 1 : 2);

  Trace trace;
  while (!in.eof() && (in.at_line_end() || in.starts_with("#"))) {
    if (in.at_line_end()) {
      in.end_line();
    } else {
      read_comment(in, trace);
    }
  }
  std::string header = column_header(columns);
  if (in.eof()) in.fail(in.line(), "header", "expected the column header '" + header + "', found the end of the file");
  int header_line = in.line();
  std::string_view got = in.raw_line();
  if (got != header) in.fail(header_line, "header", "expected '" + header + "', found " + found(got));

  const int devices = static_cast<int>(trace.device_names.size());
  while (!in.eof()) {
    if (in.at_line_end()) {  // blank lines are harmless
      in.end_line();
      continue;
    }
    trace.events.push_back(read_event(in, in.record(), devices, columns));
  }
  return trace;
}

std::string write_chrome_trace(const Trace& trace) {
  // Devices: every listed one, plus any an event names beyond the list.
  std::set<int> devices;
  for (int d = 0; d < static_cast<int>(trace.device_names.size()); ++d) devices.insert(d);
  std::map<int, std::set<int>> stages;  // device -> stages of its compute events
  for (const Event& e : trace.events) {
    if (e.device >= 0) devices.insert(e.device);
    if (partition::is_pass(e.kind)) stages[e.device].insert(e.stage);
  }
  std::vector<Json> out;
  for (int d : devices) {
    bool listed = d < static_cast<int>(trace.device_names.size());
    std::string name = listed ? trace.device_names[d] : "device " + std::to_string(d);
    out.push_back(metadata("process_name", d + 1, 0, {{"name", name}}));
    out.push_back(metadata("process_sort_index", d + 1, 0, {{"sort_index", d}}));
  }
  std::map<std::pair<int, std::string>, int> tids;  // (device, stream) -> tid, first appearance
  for (const Event& e : trace.events) {
    auto [it, added] = tids.try_emplace({e.device, e.stream}, static_cast<int>(tids.size()) + 1);
    if (!added) continue;
    out.push_back(metadata("thread_name", e.device + 1, it->second, {{"name", e.stream}}));
    out.push_back(metadata("thread_sort_index", e.device + 1, it->second, {{"sort_index", it->second}}));
  }

  // Transfers pair up by group: the k-th send of a group with its k-th recv.
  std::vector<int> groups;  // in order of first appearance
  std::map<int, std::array<std::vector<size_t>, 2>> sides;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    const bool send = e.kind == partition::TaskKind::send;
    if (!send && e.kind != partition::TaskKind::recv) continue;
    if (!sides.contains(e.group)) groups.push_back(e.group);
    sides[e.group][send ? 0 : 1].push_back(i);
  }

  for (const Event& e : trace.events) {
    Json args{{"task", e.task}, {"iteration", e.iteration}, {"stage", e.stage}, {"microbatch", e.microbatch},
              {"purpose", partition::to_string(e.purpose)}, {"bytes", e.bytes}, {"flops", e.flops}};
    if (e.kind == partition::TaskKind::send || e.kind == partition::TaskKind::recv) {
      args["peer"] = e.peer;
      args["group"] = e.group;
    } else if (e.kind == partition::TaskKind::collective) {
      args["group"] = e.group;
      if (e.message >= 0) args["message"] = e.message;  // inside task e.task's slice
      if (e.overlap_s > 0) args["overlap_s"] = e.overlap_s;
    }
    out.push_back(Json{{"name", slice_name(e, stages[e.device].size() > 1)},
                       {"cat", partition::to_string(e.kind)},
                       {"ph", "X"},
                       {"ts", e.start_s * 1e6},
                       {"dur", (e.end_s - e.start_s) * 1e6},
                       {"pid", e.device + 1},
                       {"tid", tids.at({e.device, e.stream})},
                       {"args", std::move(args)}});
  }

  // Flow events come after every slice: viewers bind them to the slice open on their thread at
  // their timestamp, and at equal timestamps they take events in file order.
  for (int g : groups) {
    const auto& [sends, recvs] = sides[g];
    for (size_t k = 0; k < std::min(sends.size(), recvs.size()); ++k) {
      const Event& s = trace.events[sends[k]];
      const Event& r = trace.events[recvs[k]];
      // A recv posted before its send ends the arrow where the data can start arriving, so it
      // never points back in time.
      double f_ts = (s.start_s > r.start_s && s.start_s <= r.end_s) ? s.start_s : r.start_s;
      auto flow = [&](const char* ph, const Event& e, double ts) {
        return Json{{"name", "transfer"}, {"cat", "transfer"}, {"ph", ph}, {"id", g},
                    {"ts", ts * 1e6}, {"pid", e.device + 1}, {"tid", tids.at({e.device, e.stream})}};
      };
      out.push_back(flow("s", s, s.start_s));
      Json f = flow("f", r, f_ts);
      f["bp"] = "e";
      out.push_back(std::move(f));
    }
  }

  // One event per line: diffable, and still one JSON document.
  auto dump = [](const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
  std::string text = "{\"traceEvents\":[";
  for (size_t i = 0; i < out.size(); ++i) text += (i == 0 ? "\n" : ",\n") + dump(out[i]);
  Json other{{"format", std::string((has_overlap(trace) ? kMagic : kMagicV2).substr(2))}, {"source", trace.source}, {"plan", trace.plan},
             {"fingerprint", trace.fingerprint}};
  if (!trace.compute.empty()) other["compute"] = trace.compute;
  return text + "\n],\"displayTimeUnit\":\"ms\",\"otherData\":" + dump(other) + "}\n";
}

}  // namespace hetflow::traces
