#include "support/stage3_layouts.h"

namespace dstest {

deepspeed::zero::Stage3Layout one_rank_layout(const std::vector<int64_t>& unit_numels) {
  deepspeed::zero::Stage3Layout L;
  for (int64_t n : unit_numels) {
    deepspeed::zero::UnitSlots u;
    u.layout.numel = u.layout.padded_numel = u.layout.partition_numel = n;
    u.partition_offset = L.partition_numel;
    L.partition_numel += n;
    L.units.push_back(u);
  }
  return L;
}

deepspeed::AioConfig small_aio() {
  deepspeed::AioConfig a;
  a.block_size = 4096;
  a.queue_depth = 4;
  return a;
}

}  // namespace dstest
