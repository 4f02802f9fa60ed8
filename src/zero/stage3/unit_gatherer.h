// When each stage-3 unit is gathered and released: the forward/backward hooks of the units, the
// trace of the first iteration, prefetching, the reuse distance and the max-live bound.
//
//   pre_forward(u) / pre_backward(u): gather u (wait for its prefetch if one is in flight), then
//       prefetch the units that follow in the trace while fewer than stage3_prefetch_bucket_size
//       elements are prefetched (the unit crossing it included, as in DeepSpeed), as long as the
//       gathered elements stay <= stage3_max_live_parameters. Under parameter
//       offload to NVMe, the units after those start reading their slices from the swap file
//       (ParamStore::start_fetch, up to offload_param.buffer_count), so the disk works ahead too.
//   post_forward(u): release u, unless the trace says u is used again before more than
//       stage3_max_reuse_distance elements of other units are gathered.
//   backward_done(u): u's gradients are complete (called by Stage3): release u.
//   end_backward(): release every unit; the first iteration's trace is frozen.
// Before gathering a unit that would exceed stage3_max_live_parameters, gathered units not in
// use (kept for reuse, prefetched) are released, farthest next use first. Units in use (inside
// their forward, between pre_backward and backward_done, or pinned by gathered_parameters) are
// never released, so the bound holds whenever it is at least the largest unit (twice that while a
// unit is used again inside another), and as long as every trainable parameter of a unit gets a
// gradient: a unit one of whose parameters gets none has no backward_done, and stays in use until
// end_backward (Stage3 warns, naming the parameter).
//
// The trace is the sequence of pre_forward/pre_backward unit ids from the first forward after
// begin_forward() to the end of that backward. A later iteration that deviates from it drops the
// trace (no prefetch, no reuse) and records a new one, as DeepSpeed does. Decisions depend only on
// the trace and the counts, which are identical on every rank, so every rank issues the same
// all_gathers in the same order.
//
// A released unit's buffer in host memory of at least 32 MiB is kept for the next gather of its
// size (spare_buffers.h: glibc would unmap it, and the next gather fault it in again), at most
// max(stage3_prefetch_bucket_size, the largest unit) elements, and only while the kept and the
// gathered elements together stay within stage3_max_live_parameters; kept bytes count as gathered.
//
// The root unit (0) is gathered at construction and stays gathered; it is not counted against
// stage3_max_live_parameters. Not thread-safe: hooks run on the thread running forward/backward.
//
// ZeRO++ (zeropp_options.h): with qwZ, the gathers of units 1..U for forward and backward move
// int8 blocks (quantized_gather.h); the root and the gathers for gathered_parameters (pin) move
// exact values (they feed checkpoints and edits). With hpZ, a unit released after its forward and
// before its backward keeps its secondary slice (secondary_shard.h), and its next gather is an
// all-gather inside the hpZ group; secondaries are dropped at the unit's backward_done, at
// end_backward and at begin_forward (the next forward gathers from the primary slices again).
//
// ZeRO-Infinity on a GPU (the store's slices in host memory or a file, units on the GPU, NCCL or
// one rank): a gather from the store runs on a side stream (device/transfer_stream.h): the slice
// goes up into its place in the unit's buffer and the all-gather runs in place there, so a
// prefetch neither waits for the compute stream nor blocks the host; use() makes the compute
// stream wait for that unit's fetch only. end_backward() and before_store_changes() wait on the
// host for every fetch, so the optimizer step may write the store's slices.
#pragma once
#include <memory>
#include <vector>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "device/transfer_stream.h"
#include "offload/param_store.h"
#include "zero/stage3/unit_internals.h"
#include "zero/stage3/secondary_shard.h"
#include "zero/stage3/spare_buffers.h"
#include "zero/stage3/unit_layout.h"
#include "zero/stage3/zeropp_options.h"

namespace deepspeed {
namespace zero {

struct GatherStats {
  int64_t numel = 0;        // elements of units 1..U gathered now (what max-live bounds)
  int64_t peak_numel = 0;
  int64_t bytes = 0;        // bytes of all gathered buffers, root included, and of qwZ's int8
                            // wire forms while their gather is in flight
  int64_t peak_bytes = 0;
  int64_t secondary_bytes = 0;  // hpZ secondary slices held now (included in bytes)
  int64_t spare_bytes = 0;      // released host buffers kept for reuse (spare_buffers.h; included)
};

class UnitGatherer : public UnitHooks {
 public:
  // store: where the rank's slices live (Stage3 owns it; it must outlive this object).
  // device: where gathered units live (the compute device; the store's slices may be in host
  // memory or a file).
  // zeropp / hpz_group: ZeRO++ (hpz_group: this rank's hpZ group when zeropp.hpz > 1).
  UnitGatherer(const Stage3Layout& layout, offload::ParamStore& store, comm::CommunicatorPtr comm,
               const ZeroConfig& config, c10::Device device = c10::kCPU,
               const ZeroPPOptions& zeropp = {}, comm::CommunicatorPtr hpz_group = nullptr);
  // Waits on the host for fetches still reading the store's slices (a prefetch never used): the
  // store (pinned host memory, freed after this object) must not go while a copy reads it.
  // Unsets the store's hand-back.
  ~UnitGatherer();

  void pre_forward(int unit) override;
  void post_forward(int unit) override;
  void pre_backward(int unit) override;
  const UnitSlots& unit_slots(int unit) const override { return layout_.units[unit]; }

  void begin_forward();
  void backward_done(int unit);
  // Between the unit's pre_backward and its backward_done (or end_backward).
  bool backward_pending(int unit) const { return state_[unit].backward_pending; }
  void end_backward();
  // The store's slices are about to change (the optimizer step, a checkpoint load): every unit
  // gathered and not in use is released (its copy would be stale, and a gather in flight reads a
  // store slice), as end_backward does; one in use (pinned) hands its store slice back. An
  // eval-only forward between backward and step leaves such units (prefetched for a backward
  // that never comes). COLLECTIVE only in waiting for gathers every rank issued alike.
  void before_store_changes();
  // Keeps the unit gathered until unpin (gathering it now if needed). COLLECTIVE when it gathers.
  void pin(int unit);
  void unpin(int unit);
  bool pinned() const;  // any unit
  // Root: write the root's slice of every rank into its gathered buffer (after the optimizer
  // step). COLLECTIVE.
  void regather_root();
  const at::Tensor& full(int unit) const { return state_[unit].full; }
  GatherStats stats() const;

 private:
  struct UnitState {
    at::Tensor full;      // the unit's gathered flat buffer (while gathered or in flight)
    comm::WorkPtr work;   // its all_gather while in flight
    at::Tensor source;    // this rank's slice being sent, while in flight
    bool params_set = false;
    bool from_store = false;  // the gather in flight reads the store's slice (not a secondary)
    bool exact = false;       // the buffer holds the partition's values, not qwZ's int8 rounding
    int64_t wire_bytes = 0;   // qwZ's wire forms (this rank's and everyone's) while in flight
    std::shared_ptr<device::CopyFence> fetched;  // after its side-stream fetch, while in flight
    bool awaiting_backward = false;  // forward ran, backward not yet: a release keeps a secondary
    int active = 0;       // open forward scopes
    bool backward_pending = false;
    int pins = 0;
  };
  bool gathered(int u) const { return state_[u].full.defined(); }
  bool in_use(int u) const;
  void record(int u);
  void issue(int u, bool exact = false);  // exact: no qwZ. A throw leaves u not gathered
  void issue_unguarded(int u, bool exact);
  void issue_from_host(int u, bool exact);
  void wait_gather(int u);  // the all_gather in flight, if any, is complete
  // The store's hand-back (ParamStore::set_hand_back): every gather in flight that reads a store
  // slice is waited for, which gives the slice back with its upload's fence.
  void hand_back_store_slices();
  void use(int u, bool exact = false);  // gather if needed, wait, point the parameters at the buffer
  void release(int u);
  void release_idle_units();  // every unit not in use, and the hpZ secondaries
  // A buffer for unit u: a kept spare of its size, else a new one (spares that no longer fit
  // beside the gathered units under max-live are freed first).
  at::Tensor gathered_buffer(int u, const at::TensorOptions& options);
  // The buffer is no longer the unit's (its parameters are not touched): kept as a spare when it
  // is host memory nothing else references and fits (spare_cap_, and max-live with the gathered
  // units), else freed.
  void forget_buffer(int u);
  void make_room(int64_t numel, int gathering);
  void prefetch();
  int64_t next_use_distance(int u, bool count_elements) const;  // -1: not used again
  int64_t numel_of(int u) const { return layout_.units[u].layout.padded_numel; }

  const Stage3Layout& layout_;
  offload::ParamStore& store_;
  comm::CommunicatorPtr comm_;
  ZeroConfig config_;
  c10::Device device_;
  ZeroPPOptions zeropp_;
  std::unique_ptr<SecondaryShards> secondary_;  // hpZ only
  device::SideStream fetches_;  // a stream on a GPU; inline elsewhere
  const bool side_stream_fetches_;  // slices from host memory go up through fetches_
  std::vector<UnitState> state_;
  GatherStats stats_;
  SpareBuffers spares_;
  int64_t spare_cap_ = 0;  // max(stage3_prefetch_bucket_size, the largest unit) elements
  std::vector<int> trace_;
  bool trace_valid_ = false;
  bool recording_ = true;
  size_t cursor_ = 0;  // next expected trace position
};

}  // namespace zero
}  // namespace deepspeed
