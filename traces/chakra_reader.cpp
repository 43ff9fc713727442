#include "traces/chakra_reader.hpp"

#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::traces::chakra_reader {

namespace {

// A message larger than this is corruption.
constexpr uint64_t kMaxMessageBytes = 64u << 20;

partition::CollectiveKind collective_kind(const NodeReader& r) {
  const int64_t t = r.required_integer("comm_type");
  switch (t) {
    case et::ALL_REDUCE: return partition::CollectiveKind::all_reduce;
    case et::ALL_GATHER: return partition::CollectiveKind::all_gather;
    case et::REDUCE_SCATTER: return partition::CollectiveKind::reduce_scatter;
    case et::BROADCAST: return partition::CollectiveKind::broadcast;
    case et::REDUCE: return partition::CollectiveKind::reduce;
    case et::ALL_TO_ALL: return partition::CollectiveKind::all_to_all;
    default:
      r.fail("comm_type", "collective type " + std::to_string(t) +
                              " is not one hetflow runs (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, "
                              "ALL_TO_ALL)");
  }
}

}  // namespace

Reader::Reader(const ChakraFile& f) : file(f), array(f.bytes.data(), static_cast<int>(f.bytes.size())), coded(&array) {
  // A malformed message is this reader's to report (naming the file); protobuf would also
  // print its own complaint (invalid UTF-8 in a string) to stderr.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
}

void Reader::fail(const std::string& field, const std::string& what) const {
  throw InputError(file.name, 0, (message == 0 ? std::string("metadata") : "node " + std::to_string(message)) + "." + field,
                   what);
}

bool Reader::next(google::protobuf::MessageLite& m) {
  if (coded.CurrentPosition() >= static_cast<int>(file.bytes.size())) return false;
  uint64_t size = 0;
  if (!coded.ReadVarint64(&size)) fail("size", "truncated: the file ends inside a message's length");
  if (size > kMaxMessageBytes) fail("size", "a message of " + std::to_string(size) + " bytes: not a Chakra trace");
  if (size > file.bytes.size() - static_cast<size_t>(coded.CurrentPosition())) {
    fail("size", "truncated: the message says " + std::to_string(size) + " bytes, the file has " +
                     std::to_string(file.bytes.size() - static_cast<size_t>(coded.CurrentPosition())));
  }
  const auto limit = coded.PushLimit(static_cast<int>(size));
  if (!m.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) fail("bytes", "not a Chakra message");
  coded.PopLimit(limit);
  return true;
}

const et::AttributeProto* NodeReader::find(const char* name) const {
  for (const et::AttributeProto& a : node.attr()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

bool NodeReader::integer(const char* name, int64_t& out) const {
  const et::AttributeProto* a = find(name);
  if (a == nullptr) return false;
  switch (a->value_case()) {
    case et::AttributeProto::kInt32Val: out = a->int32_val(); return true;
    case et::AttributeProto::kInt64Val: out = a->int64_val(); return true;
    case et::AttributeProto::kUint32Val: out = a->uint32_val(); return true;
    case et::AttributeProto::kUint64Val:
      if (a->uint64_val() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(name, "out of range");
      out = static_cast<int64_t>(a->uint64_val());
      return true;
    default: fail(name, "expected an integer");
  }
}

int64_t NodeReader::required_integer(const char* name) const {
  int64_t v = 0;
  if (!integer(name, v)) fail(name, "missing");
  return v;
}

double NodeReader::size(const char* exact, const char* name, bool required) const {
  if (const et::AttributeProto* a = find(exact); a != nullptr) {
    if (a->value_case() != et::AttributeProto::kDoubleVal || !std::isfinite(a->double_val()) || a->double_val() < 0) {
      fail(exact, "expected a finite number >= 0");
    }
    return a->double_val();
  }
  int64_t v = 0;
  if (!integer(name, v)) {
    if (required) fail(name, "missing");
    return 0;
  }
  if (v < 0) fail(name, "expected a size >= 0, found " + std::to_string(v));
  return static_cast<double>(v);
}

std::string NodeReader::text(const char* name, const std::string& otherwise) const {
  const et::AttributeProto* a = find(name);
  if (a == nullptr) return otherwise;
  if (a->value_case() != et::AttributeProto::kStringVal) fail(name, "expected a string");
  return a->string_val();
}

double NodeReader::fraction(const char* name) const {
  const et::AttributeProto* a = find(name);
  if (a == nullptr) fail(name, "missing");
  if (a->value_case() != et::AttributeProto::kDoubleVal || !(a->double_val() >= 0 && a->double_val() <= 1)) {
    fail(name, "expected a number from 0 to 1");
  }
  return a->double_val();
}

int NodeReader::rank(const char* name, int ranks, int self) const {
  const int64_t r = required_integer(name);
  if (r < 0 || r >= ranks) fail(name, "rank " + std::to_string(r) + " does not exist (" + std::to_string(ranks) + " files)");
  if (r == self) fail(name, "a transfer to its own rank");
  return static_cast<int>(r);
}

std::string read_collective(const NodeReader& n, CollectiveNode& c, int ranks) {
  c.kind = collective_kind(n);
  c.bytes = n.size("hetflow_bytes", "comm_size", true);
  // An all-to-all from elsewhere is pairwise, NCCL's.
  const std::string algorithm =
      n.text("hetflow_algorithm", c.kind == partition::CollectiveKind::all_to_all ? "pairwise" : "ring");
  try {
    c.algorithm = partition::parse_collective_algorithm(algorithm);
  } catch (const std::exception&) {
    n.fail("hetflow_algorithm", "expected ring, tree, hierarchical or pairwise, found '" + algorithm.substr(0, 40) + "'");
  }
  if (const std::string parts = n.text("hetflow_parts", ""); !parts.empty()) {
    for (size_t at = 0; at <= parts.size();) {
      const size_t comma = std::min(parts.find(',', at), parts.size());
      double x = -1;
      const auto [end, ec] = std::from_chars(parts.data() + at, parts.data() + comma, x);
      if (ec != std::errc() || end != parts.data() + comma || !(x >= 0) || x > 1 || c.parts.size() >= (1u << 20)) {
        n.fail("hetflow_parts", "expected shares in [0, 1] separated by commas, found '" + parts.substr(0, 40) + "'");
      }
      c.parts.push_back(x);
      at = comma + 1;
    }
  }
  int64_t root = 0;
  n.integer("hetflow_root", root);
  c.root = static_cast<int>(std::clamp<int64_t>(root, 0, ranks));
  int64_t messages = 1;
  n.integer("hetflow_messages", messages);
  if (messages < 1 || messages > (1 << 20)) n.fail("hetflow_messages", "expected 1 to 1048576 back-to-back collectives");
  c.messages = static_cast<int>(messages);
  return n.text("pg_name", "all");
}

partition::Purpose read_purpose(const NodeReader& n, partition::Purpose otherwise) {
  const std::string purpose = n.text("hetflow_purpose", std::string(to_string(otherwise)));
  try {
    return partition::parse_purpose(purpose);
  } catch (const std::exception&) {
    n.fail("hetflow_purpose", "expected a purpose, found '" + purpose.substr(0, 40) + "'");
  }
}

std::string describe(const CollectiveNode& c, const std::string& pg) {
  return std::string(to_string(c.kind)) + " of " + model::units::format_number(c.bytes) + " bytes (" +
         std::string(to_string(c.algorithm)) + ", root " + std::to_string(c.root) + ", " + std::string(to_string(c.purpose)) +
         ") on process group " + pg;
}

std::map<std::string, std::vector<int>> read_comm_groups(const std::string& text, const std::string& file, int ranks) {
  std::map<std::string, std::vector<int>> groups;
  if (text.empty()) return groups;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(file, 0, "comm_group", "not JSON (at byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) throw InputError(file, 0, "comm_group", "expected an object {\"<pg_name>\": [ranks]}");
  for (const auto& [pg, members] : j.items()) {
    if (!members.is_array() || members.empty()) throw InputError(file, 0, pg, "expected a non-empty list of ranks");
    std::set<int> seen;
    for (const auto& m : members) {
      if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() >= ranks) {
        throw InputError(file, 0, pg, "expected ranks 0 to " + std::to_string(ranks - 1) + ", found " + m.dump());
      }
      if (!seen.insert(m.get<int>()).second) throw InputError(file, 0, pg, "lists rank " + m.dump() + " twice");
      groups[pg].push_back(m.get<int>());
    }
  }
  return groups;
}

}  // namespace hetflow::traces::chakra_reader
