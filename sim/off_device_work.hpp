#pragma once
// The work of a task that runs off the GPUs, as executions on the platform's resource hosts
// (each a host whose speed its users share max-min fairly): a load's read from the shared
// file system, its read on its node's path and its preprocessing on the node's loader
// workers; an offload copy on its PCIe bridge's direction; a host optimizer step on its
// node's CPUs. They run at once; the task ends with the last.
#include <vector>

#include <simgrid/s4u.hpp>

#include "partition/loading.hpp"
#include "partition/plan.hpp"
#include "sim/platform.hpp"

namespace hetflow::sim {

struct OffDeviceWork {
  simgrid::s4u::Host* host = nullptr;
  double amount = 0;  // in the host's unit: bytes, samples, or host-memory bytes
};

// `shares`: a folded plan's (partition::load_shares); what each simulated load stands for.
// Resources the platform lacks (an unbounded loader) and amounts of 0 are left out.
std::vector<OffDeviceWork> off_device_work(const partition::Plan& plan, const partition::Task& task,
                                           const PlatformSpec& spec, const Platform& platform,
                                           const partition::LoadShares& shares);

}  // namespace hetflow::sim
