#include "zero/flat_ownership.h"

#include <torch/torch.h>

#include "checkpoint/layout.h"

namespace deepspeed {
namespace zero {
namespace {

// Slot i of the flat buffer holds parameter (n - 1 - i): FlatParams lays them in reverse order.
size_t param_of_slot(size_t slot, size_t n) { return n - 1 - slot; }

// Elements [offset, offset + numel) of a parameter living at flat position `at` of the buffer,
// in a partition whose element 0 is flat position `base`.
StateFragment fragment(size_t param, int64_t offset, int64_t numel, int64_t at, int64_t base) {
  StateFragment f;
  f.param = param;
  f.offset = offset;
  f.numel = numel;
  f.at = at - base;
  return f;
}

class Sharded : public FlatOwnership {
 public:
  Sharded(const StageContext& context, FlatParams& flat, int64_t gather_chunk_numel)
      : FlatOwnership(context, context.world_size(), context.rank()),
        gather_(context, flat, context.rank(), gather_chunk_numel) {}

  void share_updates(FlatParams&) override { gather_.gather(); }
  void start_sharing_updates(FlatParams&) override { gather_.launch(); }
  ParamGather* updates_in_flight() override { return &gather_; }

  void sum_over_owners(at::Tensor& squares) override { ctx_.comm->all_reduce(squares)->wait(); }

  // This rank's partition, cut at parameter boundaries.
  std::vector<StateFragment> fragments_to_save(const FlatParams& flat) const override {
    const auto& slots = flat.slots();
    const size_t n = slots.size();
    const auto& layout = flat.layout();
    const int64_t begin = layout.begin(owner_), end = layout.end(owner_);
    std::vector<StateFragment> out;
    for (size_t i = 0; i < n; ++i) {
      const int64_t lo = std::max(begin, slots[i].offset);
      const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
      if (hi > lo)
        out.push_back(fragment(param_of_slot(i, n), lo - slots[i].offset, hi - lo, lo, begin));
    }
    return out;
  }
  std::vector<StateFragment> fragments_to_load(const FlatParams& flat) const override {
    return fragments_to_save(flat);
  }

 private:
  ParamGather gather_;
};

class Replicated : public FlatOwnership {
 public:
  explicit Replicated(const StageContext& context) : FlatOwnership(context, 1, 0) {}
  void share_updates(FlatParams&) override {}
  void sum_over_owners(at::Tensor&) override {}  // every rank holds the whole average

  // The 1/N share a partition would hold.
  std::vector<StateFragment> fragments_to_save(const FlatParams& flat) const override {
    const auto& slots = flat.slots();
    const size_t n = slots.size();
    std::vector<int64_t> numels(n);
    for (size_t i = 0; i < n; ++i) numels[param_of_slot(i, n)] = slots[i].numel;
    std::vector<StateFragment> out;
    for (auto& r : checkpoint::partition_fragments(numels, ctx_.world_size(), ctx_.rank()))
      out.push_back(fragment(r.param, r.offset, r.numel,
                             slots[param_of_slot(r.param, n)].offset + r.offset, 0));
    return out;
  }
  // Every parameter whole.
  std::vector<StateFragment> fragments_to_load(const FlatParams& flat) const override {
    const auto& slots = flat.slots();
    std::vector<StateFragment> out;
    for (size_t i = 0; i < slots.size(); ++i)
      out.push_back(
          fragment(param_of_slot(i, slots.size()), 0, slots[i].numel, slots[i].offset, 0));
    return out;
  }
};

}  // namespace

std::unique_ptr<FlatOwnership> make_sharded_ownership(const StageContext& context,
                                                      FlatParams& flat,
                                                      int64_t gather_chunk_numel) {
  return std::make_unique<Sharded>(context, flat, gather_chunk_numel);
}

std::unique_ptr<FlatOwnership> make_replicated_ownership(const StageContext& context) {
  return std::make_unique<Replicated>(context);
}

}  // namespace zero
}  // namespace deepspeed
