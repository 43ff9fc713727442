#include "partition/axis.hpp"

#include <stdexcept>

namespace hetflow::partition {

std::string_view to_string(Axis a) {
  switch (a) {
    case Axis::data: return "data";
    case Axis::pipeline: return "pipeline";
    case Axis::tensor: return "tensor";
    case Axis::context: return "context";
    case Axis::expert: return "expert";
  }
  return "data";
}

namespace {
std::string known_axes() {
  std::string known;
  for (const Axis a : kAxes) known += (known.empty() ? "" : ", ") + std::string(to_string(a));
  return known;
}
}  // namespace

Axis parse_axis(std::string_view name) {
  for (const Axis a : kAxes) {
    if (to_string(a) == name) return a;
  }
  throw std::invalid_argument("expected an axis (" + known_axes() + "), found '" + std::string(name) + "'");
}

std::vector<LayoutAxis> default_axes() { return {{Axis::tensor, 1}, {Axis::data, 1}, {Axis::pipeline, 1}}; }

std::string axis_order_text(const std::vector<LayoutAxis>& axes) {
  std::string text;
  for (const LayoutAxis& a : axes) text += (text.empty() ? "" : ",") + std::string(to_string(a.axis));
  return text;
}

std::vector<LayoutAxis> parse_axis_order(std::string_view text) {
  std::vector<LayoutAxis> axes;
  std::array<bool, kAxisCount> seen{};
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = text.find(',', begin);
    const size_t end = comma == std::string_view::npos ? text.size() : comma;
    const Axis a = parse_axis(text.substr(begin, end - begin));
    if (a == Axis::expert) {
      throw std::invalid_argument("expected the placed axes (expert subdivides data: its groups are consecutive data "
                                  "indices, and its size is experts.parallel), found 'expert' in '" + std::string(text) + "'");
    }
    if (seen[static_cast<size_t>(a)]) {
      throw std::invalid_argument("expected each axis once, found '" + std::string(to_string(a)) + "' twice in '" +
                                  std::string(text) + "'");
    }
    seen[static_cast<size_t>(a)] = true;
    axes.push_back({a, 1});
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  if (axes.size() + (seen[static_cast<size_t>(Axis::context)] ? 0 : 1) + 1 != kAxisCount) {
    throw std::invalid_argument("expected every placed axis (data, pipeline, tensor, context) once (context may be left out), found '" +
                                std::string(text) + "'");
  }
  return axes;
}

}  // namespace hetflow::partition
