// Hand-made ZeRO-3 layouts and I/O settings for the swap-file tests (ParamStore, GradStore).
#pragma once
#include <vector>

#include "deepspeed/config.h"
#include "zero/stage3/unit_layout.h"

namespace dstest {

// Units of the given element counts (the first one is the root), laid end to end in the
// partition at world size 1, so no unit is padded.
deepspeed::zero::Stage3Layout one_rank_layout(const std::vector<int64_t>& unit_numels);

// Small direct-I/O requests (4 KiB blocks, queue depth 4), so one unit spans several.
deepspeed::AioConfig small_aio();

}  // namespace dstest
