#pragma once
// Reading JSON with errors that name the file, line and field, for every JSON reader of the
// project (HuggingFace configs, plan files). Header-only: works with nlohmann::json and
// nlohmann::ordered_json alike.
#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

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

// The 1-based line of byte `offset` in `text`.
inline int line_at(const std::string& text, size_t offset) {
  int line = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

// Receives the elements of a streamed array (see parse_streamed) one at a time: the key of
// the top-level member, the element's index, the line it ends on, the element (the sink may
// take it apart: it is not kept), and the document as read so far (the members before).
template <typename Json>
using ElementSink =
    std::function<void(const std::string& key, size_t index, int line, Json& element, const Json& document)>;

namespace detail {

// A character iterator that records how far the parser has read, so that errors found while
// building the document (a key given twice, nesting too deep) can name their line.
class TrackedChar {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChar() = default;
  TrackedChar(const char* at, const char** furthest) : at_(at), furthest_(furthest) {}
  reference operator*() const { return *at_; }
  TrackedChar& operator++() {
    *furthest_ = ++at_;
    return *this;
  }
  TrackedChar operator++(int) {
    TrackedChar before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedChar& o) const { return at_ == o.at_; }
  bool operator!=(const TrackedChar& o) const { return at_ != o.at_; }

 private:
  const char* at_ = nullptr;
  const char** furthest_ = nullptr;
};

// Builds the document as nlohmann's SAX parser reads it, in one pass: nesting deeper than
// limits::kMaxJsonDepth and a key given twice in one object (whose second value would
// silently replace the first) are refused with their line and the path of the key. Keys are
// found by a short scan while an object is small and by a hash set once it is large, so a
// hostile object with a million keys costs linear time (nlohmann's own ordered_json
// reader searches every key linearly).
template <typename Json>
class DocumentBuilder {
 public:
  DocumentBuilder(Json& root, const std::string& text, const std::string& file, const char* const& furthest,
                  const std::string& depth_hint, const std::function<bool(const std::string&)>* streamed = nullptr,
                  const ElementSink<Json>* sink = nullptr)
      : root_(root), text_(text), file_(file), furthest_(furthest), depth_hint_(depth_hint), streamed_(streamed),
        sink_(sink) {}

  bool null() { return place(nullptr); }
  bool boolean(bool v) { return place(v); }
  bool number_integer(typename Json::number_integer_t v) { return place(v); }
  bool number_unsigned(typename Json::number_unsigned_t v) { return place(v); }
  bool number_float(typename Json::number_float_t v, const typename Json::string_t&) { return place(v); }
  bool string(typename Json::string_t& v) { return place(std::move(v)); }
  bool binary(typename Json::binary_t& v) { return place(Json::binary(std::move(v))); }

  bool start_object(std::size_t) {
    open(Json::object());
    return true;
  }
  bool key(typename Json::string_t& key) {
    Frame& f = frames_.back();
    auto& members = f.container->template get_ref<typename Json::object_t&>();
    if (!new_key(f, members, key)) {
      throw InputError(file_, line(), path() + key, "given twice in one object; give each key once");
    }
    f.key = key;
    if constexpr (std::is_same_v<typename Json::object_t, nlohmann::ordered_map<typename Json::string_t, Json>>) {
      members.emplace_back(key, nullptr);  // known new: no second search
      member_ = &members.back().second;
    } else {
      member_ = &members.emplace(key, nullptr).first->second;
    }
    return true;
  }
  bool end_object() {
    close();
    return true;
  }
  bool start_array(std::size_t) {
    open(Json::array());
    return true;
  }
  bool end_array() {
    close();
    return true;
  }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  // An open array or object. Only the innermost one grows, so pointers to the others stay
  // valid while they are open.
  struct Frame {
    Json* container;
    std::string key;                                            // objects: the key read last
    size_t elements = 0;                                        // arrays: elements so far
    std::unique_ptr<std::unordered_set<std::string>> index;     // objects with many keys
    bool streamed = false;  // a top-level member array whose elements go to the sink
  };
  static constexpr size_t kScanKeys = 16;

  template <typename Members>
  static bool new_key(Frame& f, const Members& members, const std::string& key) {
    if (!f.index && members.size() < kScanKeys) {
      for (const auto& m : members) {
        if (m.first == key) return false;
      }
      return true;
    }
    if (!f.index) {
      f.index = std::make_unique<std::unordered_set<std::string>>();
      for (const auto& m : members) f.index->insert(m.first);
    }
    return f.index->insert(key).second;
  }

  // Places a value as the root, the next element of the open array, or the member whose
  // key was just read; returns where it went.
  Json* put(Json value) {
    if (frames_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.container->is_array()) {
      const size_t index = f.elements++;
      if (f.streamed && !value.is_structured()) {  // a scalar element: complete already
        (*sink_)(frames_.front().key, index, line(), value, root_);
        return nullptr;
      }
      f.container->push_back(std::move(value));
      return &f.container->back();
    }
    *member_ = std::move(value);
    return member_;
  }
  bool place(Json value) {
    put(std::move(value));
    return true;
  }
  void open(Json container) {
    if (frames_.size() == static_cast<size_t>(limits::kMaxJsonDepth)) {
      throw InputError(file_, line(), "json",
                       "nested deeper than " + std::to_string(limits::kMaxJsonDepth) + " levels" + depth_hint_);
    }
    const bool streamed = sink_ != nullptr && frames_.size() == 1 && frames_.front().container->is_object() &&
                          container.is_array() && (*streamed_)(frames_.front().key);
    Json* at = put(std::move(container));
    frames_.push_back(Frame{at, {}, 0, nullptr, streamed});
  }
  // Closes the innermost container; an element of a streamed array, now complete, goes to
  // the sink and out of the document.
  void close() {
    frames_.pop_back();
    if (frames_.size() != 2 || !frames_.back().streamed) return;
    Frame& array = frames_.back();
    auto& elements = array.container->template get_ref<typename Json::array_t&>();
    Json element = std::move(elements.back());
    elements.pop_back();
    (*sink_)(frames_.front().key, array.elements - 1, line(), element, root_);
  }

  // The line the parser has reached, counted on from the last time asked (the parser only
  // moves forward), so that asking per element stays linear in the text.
  int line() {
    const auto at = static_cast<size_t>(furthest_ - text_.data());
    for (; counted_ < at && counted_ < text_.size(); ++counted_) line_ += text_[counted_] == '\n';
    return line_;
  }
  // Where the parser is, as a data path ("tasks[3]."): the prefix of the key at fault.
  std::string path() const {
    std::string p;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.container->is_array()) {
        p += "[" + std::to_string(f.elements - 1) + "]";
      } else {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p.empty() ? p : p + ".";
  }

  Json& root_;
  const std::string& text_;
  const std::string& file_;
  const char* const& furthest_;
  const std::string& depth_hint_;
  const std::function<bool(const std::string&)>* streamed_;
  const ElementSink<Json>* sink_;
  std::vector<Frame> frames_;  // the open containers, innermost last
  size_t counted_ = 0;         // text_[0, counted_) has line_ - 1 newlines
  int line_ = 1;
  Json* member_ = nullptr;     // the member of the innermost object whose key was read last
};

}  // namespace detail

namespace detail {

template <typename Json>
Json build(const std::string& text, const std::string& file, const std::string& depth_hint,
           const std::function<bool(const std::string&)>* streamed, const ElementSink<Json>* sink) {
  Json root;
  const char* furthest = text.data();
  DocumentBuilder<Json> builder(root, text, file, furthest, depth_hint, streamed, sink);
  try {
    Json::sax_parse(TrackedChar(text.data(), &furthest), TrackedChar(text.data() + text.size(), &furthest), &builder);
  } catch (const typename Json::parse_error& e) {
    throw json_syntax_error(text, file, e.byte, e.what());
  } catch (const typename Json::out_of_range& e) {  // a number beyond a double's range
    throw json_syntax_error(text, file, 0, e.what());
  }
  return root;
}

}  // namespace detail

// Parses `text` in one pass. Errors are InputError(file, line, field, ...): the syntax
// (model/error.hpp's json_syntax_error), nesting deeper than limits::kMaxJsonDepth (nlohmann
// recurses when it prints a value), and a key given twice in one object, named by its path.
template <typename Json>
Json parse(const std::string& text, const std::string& file, const std::string& depth_hint = "") {
  return detail::build<Json>(text, file, depth_hint, nullptr, nullptr);
}

// As parse, but the elements of each top-level member array whose key `streamed` accepts go
// to `sink` one by one as they are read, instead of into the document (where the member
// stays, as an empty array): a large table is converted while it is read, never held whole
// as a document tree.
template <typename Json>
Json parse_streamed(const std::string& text, const std::string& file,
                    const std::function<bool(const std::string&)>& streamed, const ElementSink<Json>& sink) {
  return detail::build<Json>(text, file, "", &streamed, &sink);
}

}  // namespace hetflow::model::json_util
