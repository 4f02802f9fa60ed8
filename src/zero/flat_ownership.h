// The parameter part of the flat stages: which share of the FlatParams buffer this rank updates,
// and how the others learn the result.
//
//   Sharded (stages 1, 2): the buffer is cut into N partitions; rank r updates partition r and
//       the updated partitions are all-gathered back into every rank's buffer (in chunks of
//       allgather_bucket_size elements: zero/param_gather.h), after the step or, with
//       overlap_param_gather, into the next forward. Norms are summed over ranks.
//   Replicated (stage 0 in 16 bits): one partition spans the buffer; every rank updates all of it
//       with the same averaged gradients, so nothing travels after the step. A checkpoint still
//       saves only the 1/N share a partition would hold (checkpoint/layout.h), so files are the
//       same for every stage, and loads every parameter whole.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "zero/flat_params.h"
#include "zero/param_gather.h"
#include "zero/stage.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

class FlatOwnership {
 public:
  virtual ~FlatOwnership() = default;
  int parts() const { return parts_; }
  int owner() const { return owner_; }  // the partition this rank updates
  // After the owner's partition was updated: every rank's buffer holds every partition. COLLECTIVE.
  virtual void share_updates(FlatParams& flat) = 0;
  // The same collectives launched and not waited for (COLLECTIVE): updates_in_flight() settles
  // them (zero_optimization.overlap_param_gather). Where nothing travels, share_updates.
  virtual void start_sharing_updates(FlatParams& flat) { share_updates(flat); }
  // What start_sharing_updates leaves running; null where nothing ever is.
  virtual ParamGather* updates_in_flight() { return nullptr; }
  // A partition-local sum of squares becomes the global one. COLLECTIVE.
  virtual void sum_over_owners(at::Tensor& squares) = 0;
  // The checkpoint fragments this rank saves / loads (param, offset, numel, and `at`: where they
  // lie in the owner's partition), in flat order.
  virtual std::vector<StateFragment> fragments_to_save(const FlatParams& flat) const = 0;
  virtual std::vector<StateFragment> fragments_to_load(const FlatParams& flat) const = 0;

 protected:
  FlatOwnership(const StageContext& context, int parts, int owner)
      : ctx_(context), parts_(parts), owner_(owner) {}
  StageContext ctx_;
  const int parts_, owner_;
};

// `flat`: the buffer of `context.world_size()` partitions it gathers, `gather_chunk_numel`
// elements of each partition per all-gather.
std::unique_ptr<FlatOwnership> make_sharded_ownership(const StageContext& context,
                                                      FlatParams& flat,
                                                      int64_t gather_chunk_numel);
std::unique_ptr<FlatOwnership> make_replicated_ownership(const StageContext& context);

}  // namespace zero
}  // namespace deepspeed
