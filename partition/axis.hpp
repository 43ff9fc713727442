#pragma once
// The parallel axes a layout lays a job along, by name: data (virtual workers, the replicas),
// pipeline (a worker's ranks), tensor (a rank's device group), context (virtual workers that
// split each sample's sequence between them) and expert (consecutive replicas that split a
// mixture's experts between them and exchange tokens). Each axis is one file
// (axis_<name>.cpp) registered in one table (axis_registry.hpp) with what it adds to a plan;
// this header holds only what layouts and plans need to name and size them.
//
// The expert axis subdivides the data axis (Megatron's expert parallelism inside the
// data-parallel group): it has no place of its own in the placement order, and its size is
// the layout's `experts.parallel`.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::partition {

// In the order plan files list a device's coordinates: outermost first.
// (Context and expert came last, so that plans written before them keep their coordinates'
// order.)
enum class Axis : std::uint8_t { data, pipeline, tensor, context, expert };
inline constexpr std::size_t kAxisCount = 5;
inline constexpr std::array<Axis, kAxisCount> kAxes{Axis::data, Axis::pipeline, Axis::tensor, Axis::context, Axis::expert};

std::string_view to_string(Axis a);
// Throws std::invalid_argument naming the axes there are.
Axis parse_axis(std::string_view name);

// One axis of a layout and its size: the most members any of its groups has (virtual workers
// may differ in pipeline depth, ranks in tensor-parallel degree).
struct LayoutAxis {
  Axis axis = Axis::tensor;
  int size = 1;
  bool operator==(const LayoutAxis&) const = default;
};

// Megatron-LM's placement: consecutive devices differ first in tensor rank, then in virtual
// worker, then in pipeline rank (its --order tp-dp-pp), so a tensor-parallel group sits
// inside a node and a pipeline's neighbours are D x T devices apart.
std::vector<LayoutAxis> default_axes();

// "tensor,data,pipeline": the placement order (innermost first) the axes are listed in.
std::string axis_order_text(const std::vector<LayoutAxis>& axes);
// The axes of an order given as text, each of size 1. Throws std::invalid_argument unless
// every placed axis appears exactly once; context may be left out (a layout without context
// parallelism), as in every layout written before it. Expert is never placed: naming it is
// an error that says where its size goes.
std::vector<LayoutAxis> parse_axis_order(std::string_view text);

// Where a device sits on a layout's parallel axes; -1 on an axis it is not on (a device that
// only hosts parameter servers, or one the layout does not use).
struct AxisCoords {
  std::array<int, kAxisCount> at{-1, -1, -1, -1, -1};
  int operator[](Axis a) const { return at[static_cast<std::size_t>(a)]; }
  int& operator[](Axis a) { return at[static_cast<std::size_t>(a)]; }
  bool operator==(const AxisCoords&) const = default;
};

}  // namespace hetflow::partition
