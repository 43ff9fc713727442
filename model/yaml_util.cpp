#include "model/yaml_util.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <yaml-cpp/depthguard.h>

#include "model/error.hpp"
#include "model/gpu.hpp"
#include "model/units.hpp"

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
// Where `text` stops being what YAML reads: UTF-8 (no overlong forms, surrogates or code
// points beyond U+10FFFF) without control characters other than tab, line feed and carriage
// return (YAML's printable set); text.size() if it never does.
size_t first_not_yaml_text(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return i;
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;   // overlong
      if (c == 0xED) high = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;   // overlong
      if (c == 0xF4) high = 0x8F;  // beyond U+10FFFF
    } else {
      return i;
    }
    if (i + length > n || s[i + 1] < low || s[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return n;
}

}  // namespace

YAML::Node load(const std::string& text, const std::string& file) {
  if (const size_t bad = first_not_yaml_text(text); bad < text.size()) {
    const size_t newline = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t column = bad - (newline == std::string::npos ? 0 : newline + 1) + 1;
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(bad), '\n'));
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[bad]));
    const bool control = static_cast<unsigned char>(text[bad]) < 0x80;
    throw InputError(file, line, "syntax",
                     control ? "a control character at column " + std::to_string(column) + " (byte " + byte +
                                   "); YAML takes them only as escapes in double quotes (\"\\t\")"
                             : "not UTF-8 text at column " + std::to_string(column) + " (byte " + byte +
                                   "); save the file as UTF-8");
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw InputError(file, e.mark.line >= 0 ? e.mark.line + 1 : 0, "syntax",
                     "nested deeper than " + std::to_string(e.depth()) + " levels");
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

namespace {
// yaml-cpp reads a NUL character (raw, or "\0" in double quotes) into a string but writes
// it back as U+FFFD, so nothing read may hold one.
const std::string& without_nul(const std::string& text, const YAML::Node& node, const std::string& file,
                               const std::string& field) {
  if (text.find('\0') != std::string::npos) {
    throw InputError(file, line_of(node), field, "holds a NUL character (\\0); names and values are text");
  }
  return text;
}
}  // namespace

std::string scalar(const YAML::Node& node, const std::string& file, const std::string& field) {
  if (!node.IsScalar()) {
    throw InputError(file, line_of(node), field, "expected a value, found " + describe(node));
  }
  return without_nul(node.Scalar(), node, file, field);
}

std::string key_text(const YAML::Node& key, const std::string& file, const std::string& path) {
  if (!key.IsScalar()) {
    throw InputError(file, line_of(key), path.empty() ? "document" : path,
                     "expected plain names as keys, found " + describe(key) + " used as a key");
  }
  return without_nul(key.Scalar(), key, file, path.empty() ? "document" : path);
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
    const std::string key = key_text(kv.first, file_, path_);
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
    // A key not read yet and a letter or two from the missing one is most likely it,
    // misspelt ("bandwith"): blame that key, where the user will look, not the absence.
    if (node_.IsMap()) {
      for (const auto& kv : node_) {
        if (!kv.first.IsScalar()) continue;
        const std::string given = kv.first.Scalar();
        if (used_.count(given) != 0 || given == key) continue;
        if (likely_misspelling(given, {key})) {
          throw InputError(file_, line_of(kv.first), field(given),
                           "unknown key; did you mean '" + key + "'? (" + field(key) + " is required)");
        }
      }
    }
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

// A whole number as 64 bits; false when it is not one or does not fit 64 bits.
bool parse_int64(const std::string& s, long long& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string range_text(long long lo, long long hi) {
  return "a whole number between " + std::to_string(lo) + " and " + std::to_string(hi);
}

std::string number_text(double v) { return units::format_number(v); }
}  // namespace

int MapReader::positive_int(const std::string& key, int maximum) const {
  const std::string s = scalar(required(key), file_, field(key));
  long long v = 0;
  if (!parse_int64(s, v)) {
    fail(key, "expected " + range_text(1, maximum) + ", found '" + s + "'");
  }
  if (v < 1) fail(key, "expected a positive whole number, found " + s);
  if (v > maximum) fail(key, "expected " + range_text(1, maximum) + ", found " + s);
  return static_cast<int>(v);
}

int MapReader::int_or(const std::string& key, int fallback, int minimum, int maximum) const {
  if (!has(key)) return fallback;
  const std::string s = scalar(node_[key], file_, field(key));
  long long v = 0;
  if (!parse_int64(s, v)) fail(key, "expected " + range_text(minimum, maximum) + ", found '" + s + "'");
  if (v < minimum) fail(key, "expected a whole number >= " + std::to_string(minimum) + ", found " + s);
  if (v > maximum) fail(key, "expected " + range_text(minimum, maximum) + ", found " + s);
  return static_cast<int>(v);
}

double MapReader::number(const std::string& key, double minimum_exclusive, double maximum) const {
  const std::string s = scalar(required(key), file_, field(key));
  double v = 0;
  if (!parse_double(s, v)) fail(key, "expected a finite number, found '" + s + "'");
  if (!(v > minimum_exclusive)) {
    fail(key, "expected a number > " + number_text(minimum_exclusive) + ", found " + s);
  }
  if (v > maximum) fail(key, "expected a number <= " + number_text(maximum) + ", found " + s);
  return v;
}

double MapReader::number_or(const std::string& key, double fallback, double minimum_inclusive,
                            double maximum) const {
  if (!has(key)) return fallback;
  const std::string s = scalar(node_[key], file_, field(key));
  double v = 0;
  if (!parse_double(s, v)) fail(key, "expected a finite number, found '" + s + "'");
  if (v < minimum_inclusive) fail(key, "expected a number >= " + number_text(minimum_inclusive) + ", found " + s);
  if (v > maximum) fail(key, "expected a number <= " + number_text(maximum) + ", found " + s);
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

double MapReader::quantity_in(const std::string& key, double (*parse)(std::string_view), const Range& range,
                              std::optional<double> fallback, bool allow_zero) const {
  const bool given = has(key);
  const double v = quantity(key, parse, fallback, allow_zero);
  if (!given || (allow_zero && v == 0)) return v;
  if (v < range.min || v > range.max) {
    fail(key, std::string("expected ") + (allow_zero ? "0 or " : "") + "a quantity between " + range.format(range.min) +
                  " and " + range.format(range.max) + ", found '" + scalar(node_[key], file_, field(key)) + "'");
  }
  return v;
}

void MapReader::finish() const {
  std::vector<std::string> known(used_.begin(), used_.end());
  for (const auto& kv : node_) {
    const std::string key = key_text(kv.first, file_, path_);
    if (used_.count(key) == 0) {
      std::string hint;
      for (const std::string& n : nearest_names(key, known, 2)) hint += (hint.empty() ? "" : ", ") + n;
      throw InputError(file_, line_of(kv.first), field(key),
                       "unknown key" + (hint.empty() ? std::string() : "; expected one of the known keys, nearest: " + hint));
    }
  }
}

}  // namespace hetflow::model::yaml_util
