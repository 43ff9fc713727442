#include "model/yaml_util.hpp"

#include <charconv>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "model/error.hpp"
#include "model/gpu.hpp"

namespace hetflow::model::yaml_util {

namespace {
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    default: return "nothing";
  }
}
}  // namespace

YAML::Node load(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(file, e.mark.line >= 0 ? e.mark.line + 1 : 0, "syntax",
                     "not valid YAML/JSON: " + e.msg);
  }
}

int line_of(const YAML::Node& node) {
  if (!node.IsDefined()) return 0;
  const YAML::Mark m = node.Mark();
  return m.line >= 0 ? m.line + 1 : 0;
}

std::string scalar(const YAML::Node& node, const std::string& file, const std::string& field) {
  if (!node.IsScalar()) {
    throw InputError(file, line_of(node), field, "expected a value, found " + describe(node));
  }
  return node.Scalar();
}

MapReader::MapReader(const YAML::Node& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {
  if (!node_.IsMap()) {
    throw InputError(file_, line_of(node_), path_.empty() ? "document" : path_,
                     "expected a mapping of keys to values, found " + describe(node_));
  }
  // YAML forbids a key twice in one mapping, but the parser keeps both and lookups see the
  // first: the second would be silently ignored.
  std::set<std::string> keys;
  for (const auto& kv : node_) {
    const std::string key = scalar(kv.first, file_, path_.empty() ? "document" : path_);
    if (!keys.insert(key).second) fail_at(kv.first, field(key), "appears twice in one mapping; give it once");
  }
}

std::string MapReader::field(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void MapReader::fail(const std::string& key, const std::string& message) const {
  const YAML::Node n = node_[key];
  throw InputError(file_, n.IsDefined() ? line_of(n) : line_of(node_), field(key), message);
}

void MapReader::fail_at(const YAML::Node& node, const std::string& field_name,
                        const std::string& message) const {
  throw InputError(file_, line_of(node), field_name, message);
}

bool MapReader::has(const std::string& key) const {
  used_.insert(key);
  const YAML::Node n = node_[key];
  return n.IsDefined() && !n.IsNull();
}

YAML::Node MapReader::get(const std::string& key) const {
  used_.insert(key);
  return node_[key];
}

YAML::Node MapReader::required(const std::string& key) const {
  used_.insert(key);
  const YAML::Node n = node_[key];
  if (!n.IsDefined() || n.IsNull()) {
    throw InputError(file_, line_of(node_), field(key), "is required but missing");
  }
  return n;
}

std::string MapReader::string(const std::string& key) const {
  return scalar(required(key), file_, field(key));
}

std::string MapReader::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? scalar(node_[key], file_, field(key)) : fallback;
}

bool MapReader::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const std::string s = scalar(node_[key], file_, field(key));
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  fail(key, "expected true or false, found '" + s + "'");
}

namespace {
bool parse_double(const std::string& s, double& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(out);
}
}  // namespace

int MapReader::positive_int(const std::string& key) const {
  const std::string s = scalar(required(key), file_, field(key));
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) fail(key, "expected a whole number, found '" + s + "'");
  if (v < 1) fail(key, "expected a positive whole number, found " + s);
  return v;
}

int MapReader::int_or(const std::string& key, int fallback, int minimum) const {
  if (!has(key)) return fallback;
  const std::string s = scalar(node_[key], file_, field(key));
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) fail(key, "expected a whole number, found '" + s + "'");
  if (v < minimum) fail(key, "expected a whole number >= " + std::to_string(minimum) + ", found " + s);
  return v;
}

double MapReader::number(const std::string& key, double minimum_exclusive) const {
  const std::string s = scalar(required(key), file_, field(key));
  double v = 0;
  if (!parse_double(s, v)) fail(key, "expected a number, found '" + s + "'");
  if (!(v > minimum_exclusive)) {
    fail(key, "expected a number > " + std::to_string(minimum_exclusive) + ", found " + s);
  }
  return v;
}

double MapReader::number_or(const std::string& key, double fallback, double minimum_inclusive) const {
  if (!has(key)) return fallback;
  const std::string s = scalar(node_[key], file_, field(key));
  double v = 0;
  if (!parse_double(s, v)) fail(key, "expected a number, found '" + s + "'");
  if (v < minimum_inclusive) fail(key, "expected a number >= " + std::to_string(minimum_inclusive) + ", found " + s);
  return v;
}

double MapReader::quantity(const std::string& key, double (*parse)(std::string_view),
                           std::optional<double> fallback, bool allow_zero) const {
  if (!has(key)) {
    if (fallback) return *fallback;
    required(key);
  }
  const std::string s = scalar(node_[key], file_, field(key));
  double v = 0;
  try {
    v = parse(s);
  } catch (const std::invalid_argument& e) {
    fail(key, e.what());
  }
  if (v < 0 || (!allow_zero && v == 0)) {
    fail(key, std::string("expected a ") + (allow_zero ? "non-negative" : "positive") +
                  " quantity, found '" + s + "'");
  }
  return v;
}

void MapReader::finish() const {
  std::vector<std::string> known(used_.begin(), used_.end());
  for (const auto& kv : node_) {
    const std::string key = kv.first.Scalar();  // a scalar: the constructor checked
    if (used_.count(key) == 0) {
      std::string hint;
      for (const std::string& n : nearest_names(key, known, 2)) hint += (hint.empty() ? "" : ", ") + n;
      throw InputError(file_, line_of(kv.first), field(key),
                       "unknown key" + (hint.empty() ? std::string() : "; expected one of the known keys, nearest: " + hint));
    }
  }
}

}  // namespace hetflow::model::yaml_util
