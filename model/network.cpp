#include "model/network.hpp"

namespace hetflow::model {

double Network::param_count() const {
  double total = 0;
  for (const Layer& l : layers) total += l.params;
  return total;
}

double Network::forward_flops_per_sample() const {
  double total = 0;
  for (const Layer& l : layers) total += l.forward_flops;
  return total;
}

double Network::backward_flops_per_sample() const {
  double total = 0;
  for (const Layer& l : layers) total += l.backward_flops;
  return total;
}

double Network::cut_bytes(size_t first_after) const {
  // A producer's output crosses the cut once, however many consumers read it after the cut.
  double elems = 0;
  std::vector<bool> counted(layers.size(), false);
  for (size_t c = first_after; c < layers.size(); ++c) {
    for (int p : layers[c].inputs) {
      const auto producer = static_cast<size_t>(p);
      if (producer < first_after && !counted[producer]) {
        counted[producer] = true;
        elems += layers[producer].output_elems;
      }
    }
  }
  return elems * element_bytes(precision);
}

}  // namespace hetflow::model
