#pragma once
// Reading JSON with errors that name the file, line and field, for every JSON reader of the
// project (HuggingFace configs, plan files). Header-only: works with nlohmann::json and
// nlohmann::ordered_json alike.
#include <string>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/limits.hpp"

namespace hetflow::model::json_util {

// A value in a message: its type, or a short scalar; never the whole value (it may be huge
// or deeply nested, and dumping it recurses).
template <typename Json>
std::string brief(const Json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// The line where `text` first nests deeper than `limit` arrays and objects, or 0. One pass
// over the characters (strings skipped), so nothing recurses over a hostile document.
inline int line_nested_deeper_than(const std::string& text, int limit) {
  int depth = 0, line = 1;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return line;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

// Parses `text`; nesting deeper than limits::kMaxJsonDepth is refused before parsing (nlohmann
// recurses when it destroys or prints a value, and its depth-checking callback parser is ten
// times slower). Errors are InputError(file, line, "json", ...) (model/error.hpp's
// json_syntax_error).
template <typename Json>
Json parse(const std::string& text, const std::string& file, const std::string& depth_hint = "") {
  if (const int line = line_nested_deeper_than(text, limits::kMaxJsonDepth)) {
    throw InputError(file, line, "json", "nested deeper than " + std::to_string(limits::kMaxJsonDepth) + " levels" + depth_hint);
  }
  try {
    return Json::parse(text);
  } catch (const typename Json::parse_error& e) {
    throw json_syntax_error(text, file, e.byte, e.what());
  } catch (const typename Json::out_of_range& e) {  // a number beyond a double's range
    throw json_syntax_error(text, file, 0, e.what());
  }
}

}  // namespace hetflow::model::json_util
