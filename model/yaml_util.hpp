#pragma once
// Reading YAML with errors that name the file, line and field (model/ internal helper).
#include <functional>
#include <optional>
#include <set>
#include <string>

#include <yaml-cpp/yaml.h>

namespace hetflow::model::yaml_util {

// Parses text; a syntax error becomes an InputError at its line. Text that is not UTF-8, or
// holds control characters other than tab and line ends, is refused at its line: YAML does
// not allow them, and yaml-cpp would read or write back other characters than were given
// (a cluster would not read back equal from the YAML a plan file embeds; a raw NUL became
// a lone 0x85 byte). A NUL in an escape ("\0") is refused where it is read.
YAML::Node load(const std::string& text, const std::string& file);

// 1-based line of a node (0 when unknown).
int line_of(const YAML::Node& node);

// Reads one YAML mapping, remembering which keys were used so finish() can reject unknown
// ones (a misspelt key is an error, not silently ignored). `path` is the field path of this
// mapping ("nodes[2].nic"), used in messages.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string file, std::string path);

  bool has(const std::string& key) const;
  YAML::Node get(const std::string& key) const;       // undefined node when absent
  YAML::Node required(const std::string& key) const;  // throws when absent

  std::string string(const std::string& key) const;  // required
  std::string string_or(const std::string& key, const std::string& fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  // Whole numbers are read as 64-bit and range-checked: nothing wraps silently.
  int positive_int(const std::string& key, int maximum = kMaxInt) const;  // required, 1..maximum
  int int_or(const std::string& key, int fallback, int minimum, int maximum = kMaxInt) const;
  // Finite numbers; `maximum` inclusive.
  double number(const std::string& key, double minimum_exclusive, double maximum = kMaxDouble) const;  // required
  double number_or(const std::string& key, double fallback, double minimum_inclusive,
                   double maximum = kMaxDouble) const;
  // A quantity with a unit, via `parse` (one of model/units.hpp); must be > 0 unless
  // allow_zero. Absent -> fallback when given, else an error.
  double quantity(const std::string& key, double (*parse)(std::string_view),
                  std::optional<double> fallback = std::nullopt, bool allow_zero = false) const;
  // The same, and a non-zero value must lie in [range.min, range.max].
  struct Range {
    double min;
    double max;
    std::string (*format)(double);  // how messages print the bounds (units::format_*)
  };
  double quantity_in(const std::string& key, double (*parse)(std::string_view), const Range& range,
                     std::optional<double> fallback = std::nullopt, bool allow_zero = false) const;

  static constexpr int kMaxInt = 2147483647;
  static constexpr double kMaxDouble = 1.7976931348623157e308;

  // Throws on any key that was never asked for, naming the nearest accepted keys.
  void finish() const;

  std::string field(const std::string& key) const;  // "path.key"
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  [[noreturn]] void fail_at(const YAML::Node& node, const std::string& field,
                            const std::string& message) const;
  const std::string& file() const { return file_; }

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
  mutable std::set<std::string> used_;
};

// Scalar text of a node, or an error naming the field when it is a list or a mapping.
std::string scalar(const YAML::Node& node, const std::string& file, const std::string& field);

// The text of a mapping key; a complex key (`? [a, b]`, a list or a mapping used as a key) is
// an error at its line. `path` is the mapping's field path.
std::string key_text(const YAML::Node& key, const std::string& file, const std::string& path);

}  // namespace hetflow::model::yaml_util
