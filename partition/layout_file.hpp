#pragma once
// The layout file (`hetflow plan --layout FILE`): the user's own virtual workers, the devices
// of each pipeline stage (several devices: a tensor-parallel group) and its layers.
//
//   workers:
//     - microbatches: 8                # optional
//       stages:                        # in model order
//         - {devices: [v100-0/gpu0], layers: 0-6}
//         - {devices: [v100-0/gpu1, v100-0/gpu2], layers: 7-13}   # layers: FIRST-LAST or N
//
// Device names are the cluster's (model::Device::name); layer ranges are inclusive.
#include <string>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

// Reads `text` (YAML or JSON) into `base`'s workers, one rank per stage, and sets
// base.tensor to the most devices of any stage (each stage's own degree is its device count).
// Every worker must cover every layer once, in order, with non-empty stages; no device may
// appear twice; each stage's device count must divide every layer's tp_units. Stages may
// differ in device count, except under base.sequence_parallel, and except where a layer with
// parameters that is not tensor parallel (replicated on each device) would be held at
// different degrees and all-reduced (base.sync allreduce). A worker without
// `microbatches` gets 0: the caller fills it in. Throws InputError(file, line, field path,
// message) naming the first problem, e.g. "workers[1].stages[0].devices[0]: unknown device
// 'v100-0/gpu9'; nearest known: ...". Leaves base.virtual_stages alone (the caller refuses
// more than 1).
Layout read_layout_file(const std::string& text, const std::string& file, const model::Cluster& cluster,
                        const model::Network& network, Layout base);

// The layout's workers as a layout file that read_layout_file reads back into the same
// workers (one chunk per rank; the caller refuses virtual stages, which the format lacks).
std::string write_layout_file(const Layout& layout, const model::Cluster& cluster);

}  // namespace hetflow::partition
