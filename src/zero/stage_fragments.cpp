// The default checkpoint layout of a stage: the canonical 1/N share (checkpoint/layout.h), which
// is what stages 0-2 hold or save.
#include "checkpoint/layout.h"
#include "zero/stage.h"

namespace deepspeed {
namespace zero {

std::vector<StateFragment> ZeroStage::fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                                        int world_size) const {
  std::vector<StateFragment> out;
  for (auto& f : checkpoint::partition_fragments(numels, world_size, rank)) {
    StateFragment s;
    s.param = f.param;
    s.offset = f.offset;
    s.numel = f.numel;
    out.push_back(s);
  }
  return out;
}

}  // namespace zero
}  // namespace deepspeed
