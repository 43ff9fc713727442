#pragma once
// A campaign's progress against time as an SVG picture: steps trained over days, the
// target, failures as ticks coloured by cause, restarts and checkpoints marked.
#include <string>

#include "campaign/campaign.hpp"

namespace hetflow::campaign {

// The picture of run 0 (which records its progress); `title` heads it.
std::string progress_svg(const CampaignResult& result, double target_steps, const std::string& title);

}  // namespace hetflow::campaign
