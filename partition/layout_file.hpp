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
// Device names are the cluster's (model::Device::name); layer ranges are inclusive. With
// virtual stages (interleaved schedules) a worker lists p x v stages in model order, stage k
// on the devices of stage k % p (Megatron's interleaving), each listed again.
//
// Beside the workers, an optional `options:` mapping holds the plan options that, with the
// workers, make the plan (as `hetflow search --out-layout` writes them):
//
//   options: {micro_batch: 1, schedule: interleaved, virtual_stages: 2, recompute: full,
//             sequence_parallel: false, fp32_grad_accumulation: false, workspace: 1 GiB,
//             sync: allreduce, staleness: 0, allreduce: ring, bucket_size: 25 MiB,
//             overlap_grad_reduce: false, flash_attention: false, fused_softmax: true,
//             fused_bias_gelu: true, fused_bias_dropout_add: true, fused_adam: true,
//             zero_stage: 0, reshard_after_forward: true,   (these two written when sharded)
//             zero_shares: memory,   (written when not equal)
//             offload_optimizer: false, offload_activations: false,   (each written when true)
//             context_parallel: 2, context_comm: ring}   (written when there are context groups; a ring's)
#include <functional>
#include <string>
#include <string_view>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/layout.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

// Reads `text` (YAML or JSON) into `base`'s workers, one rank per stage, and sets
// base.tensor to the most devices of any stage (each stage's own degree is its device count).
// Every worker must cover every layer once, in order, with non-empty stages; no device may
// appear twice (but as the same stage's devices again, with base.virtual_stages > 1); each
// stage's device count must divide every layer's tp_units. Stages may
// differ in device count, except under base.sequence_parallel, and except where a layer with
// parameters that is not tensor parallel (replicated on each device) would be held at
// different degrees and all-reduced (base.sync allreduce). A worker without
// `microbatches` gets 0: the caller fills it in. Throws InputError(file, line, field path,
// message) naming the first problem, e.g. "workers[1].stages[0].devices[0]: unknown device
// 'v100-0/gpu9'; nearest known: ...". The `options:` mapping is apply_layout_file_options'.
Layout read_layout_file(const std::string& text, const std::string& file, const model::Cluster& cluster,
                        const model::Network& network, Layout base);

// Sets the members of `options` that the file's `options:` mapping gives, except those
// `keep` names (PlanOptions member names: "micro_batch", "bucket_bytes", ...: the caller's
// own, given on its command line). Throws InputError for a bad value or an unknown key.
void apply_layout_file_options(const std::string& text, const std::string& file, PlanOptions& options,
                               const std::function<bool(std::string_view member)>& keep);

// The layout as a layout file: its workers, and the options that plan them back (read by
// read_layout_file and apply_layout_file_options into the same layout).
std::string write_layout_file(const Layout& layout, const model::Cluster& cluster);

}  // namespace hetflow::partition
