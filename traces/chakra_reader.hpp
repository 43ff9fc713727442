#pragma once
// What reading a Chakra execution trace is made of (traces/chakra_read.cpp's, not an interface
// of its own): one rank file's length-delimited messages, one node's attributes, and a
// collective node's fields, each failing with an InputError that names the file, the node (its
// place in the file, 1 for the first after the metadata) and the field.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "chakra/et_def.pb.h"  // generated from traces/chakra/et_def.proto
#include "partition/plan.hpp"
#include "traces/chakra.hpp"

namespace hetflow::traces::chakra_reader {

namespace et = ChakraProtoMsg;

// One rank file, message by message.
struct Reader {
  const ChakraFile& file;
  google::protobuf::io::ArrayInputStream array;
  google::protobuf::io::CodedInputStream coded;
  int message = 0;  // the message read last: 0 the metadata, k the k-th node

  explicit Reader(const ChakraFile& f);
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;
  // The next length-delimited message; false at the end of the file. Throws InputError for a
  // truncated or corrupt one, or one over 64 MiB.
  bool next(google::protobuf::MessageLite& m);
};

// One node's attributes, by name.
struct NodeReader {
  const Reader& file;
  const et::Node& node;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const { file.fail(field, what); }
  const et::AttributeProto* find(const char* name) const;
  // An integer attribute in any of the integer encodings writers use; false when absent.
  bool integer(const char* name, int64_t& out) const;
  int64_t required_integer(const char* name) const;
  // A size: `exact` (hetflow's double) when present, else the integer attribute, >= 0.
  double size(const char* exact, const char* name, bool required) const;
  std::string text(const char* name, const std::string& otherwise) const;
  // A required point of a task's work: a double in [0, 1].
  double fraction(const char* name) const;
  // A peer's rank: 0 to ranks - 1, not `self`.
  int rank(const char* name, int ranks, int self) const;
};

// A collective node's fields as read, before the process group's members are joined.
struct CollectiveNode {
  int task = -1;
  partition::CollectiveKind kind{};
  double bytes = 0;
  partition::CollectiveAlgorithm algorithm{};
  int root = 0;
  int messages = 1;
  partition::Purpose purpose{};
  std::vector<double> parts;  // an all_to_all's shares (hetflow_parts); empty: even
  bool operator==(const CollectiveNode&) const = default;
};

// A collective node's own fields (its task and purpose are the caller's); returns its process
// group (pg_name, "all" when absent). `ranks` bounds the root.
std::string read_collective(const NodeReader& n, CollectiveNode& c, int ranks);
// hetflow_purpose, or `otherwise` when absent.
partition::Purpose read_purpose(const NodeReader& n, partition::Purpose otherwise);
// "all_reduce of 4096 bytes (ring, root 0, tensor_parallel) on process group 3", for messages.
std::string describe(const CollectiveNode& c, const std::string& pg);

// comm_group.json: {"<pg_name>": [ranks]}; empty text, no groups. `file` names it in errors.
std::map<std::string, std::vector<int>> read_comm_groups(const std::string& text, const std::string& file, int ranks);

}  // namespace hetflow::traces::chakra_reader
