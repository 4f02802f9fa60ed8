#include "zero/stage3/unit_gatherer.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/out_of_memory.h"
#include "zero/stage3/quantized_gather.h"

namespace deepspeed {
namespace zero {

UnitGatherer::UnitGatherer(const Stage3Layout& layout, offload::ParamStore& store,
                           comm::CommunicatorPtr comm, const ZeroConfig& config,
                           c10::Device device, const ZeroPPOptions& zeropp,
                           comm::CommunicatorPtr hpz_group)
    : layout_(layout), store_(store), comm_(std::move(comm)), config_(config), device_(device),
      zeropp_(zeropp), fetches_(device),
      // NCCL orders its collective after the side stream; one rank has no collective. Gloo's
      // CUDA path stages through the host on the current stream at wait(), so it keeps the
      // compute stream.
      side_stream_fetches_(device.is_cuda() &&
                           (comm_->world_size() == 1 || comm_->backend() == "nccl")),
      state_(layout.units.size()) {
  spare_cap_ = config.stage3_prefetch_bucket_size;
  for (size_t u = 1; u < layout.units.size(); ++u)
    spare_cap_ = std::max(spare_cap_, layout.units[u].layout.padded_numel);
  if (hpz_group)
    secondary_ = std::make_unique<SecondaryShards>(std::move(hpz_group), layout.units.size());
  // A unit gathered and in use (pinned) may still hold its store slice when the store is read or
  // written as a whole; before_store_changes() has released the others by then.
  store_.set_hand_back([this] { hand_back_store_slices(); });
}

UnitGatherer::~UnitGatherer() {
  store_.set_hand_back(nullptr);
  try {  // a sticky CUDA error throws here too: a destructor must not
    fetches_.mark()->wait();
  } catch (...) {
  }
}

GatherStats UnitGatherer::stats() const {
  GatherStats g = stats_;
  g.secondary_bytes = secondary_ ? secondary_->bytes() : 0;
  g.spare_bytes = spares_.bytes();
  g.bytes += g.secondary_bytes + g.spare_bytes;
  return g;
}

bool UnitGatherer::in_use(int u) const {
  const auto& s = state_[u];
  return u == 0 || s.active > 0 || s.backward_pending || s.pins > 0;
}

void UnitGatherer::record(int u) {
  if (trace_valid_) {
    if (cursor_ < trace_.size() && trace_[cursor_] == u) {
      ++cursor_;
      return;
    }
    // The execution order changed: stop predicting, record the new order from the next forward.
    trace_valid_ = recording_ = false;
    trace_.clear();
    return;
  }
  if (recording_) trace_.push_back(u);
}

// Unit u's whole buffer, named for an out-of-memory report.
at::Tensor UnitGatherer::gathered_buffer(int u, const at::TensorOptions& options) {
  const int64_t numel = layout_.units[u].layout.padded_numel;
  if (at::Tensor kept = spares_.take(numel, options); kept.defined()) return kept;
  spares_.shrink_to(
      std::max<int64_t>(0, config_.stage3_max_live_parameters - stats_.numel - numel));
  AllocatingFor naming("stage 3's gathered parameters of unit", u, numel,
                       c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  return torch::empty({numel}, options);
}

// Where the unit comes from: its hpZ secondary slices (inside the group), or every rank's
// primary slice (int8 blocks under qwZ unless `exact`).
// A throw anywhere in it (an out-of-memory for the buffer, the upload, qwZ's blocks; a failed
// collective) leaves u not gathered: a buffer half filled must not look gathered to the next
// use(), and the stats count only what completed.
void UnitGatherer::issue(int u, bool exact) {
  try {
    issue_unguarded(u, exact);
  } catch (...) {
    auto& s = state_[u];
    if (s.from_store && s.source.defined()) {
      try {  // the store's buffer goes back once the copies queued from it have passed
        store_.done(u, fetches_.mark());
      } catch (...) {
      }
    }
    s.source = at::Tensor();
    s.full = at::Tensor();
    s.work = {};
    s.fetched.reset();
    s.wire_bytes = 0;
    s.params_set = false;
    throw;
  }
}

void UnitGatherer::issue_unguarded(int u, bool exact) {
  auto& s = state_[u];
  const auto& slots = layout_.units[u];
  const bool secondary = !exact && secondary_ && secondary_->has(u);
  exact = exact || u == 0 || !zeropp_.quantized_weights;
  s.from_store = !secondary;
  // A secondary holds what an earlier gather brought: exact only without qwZ.
  s.exact = secondary ? !zeropp_.quantized_weights : exact;
  if (secondary) {
    s.full = gathered_buffer(u, at::TensorOptions().dtype(store_.dtype()).device(device_));
    s.work = secondary_->gather(u, s.full);
  } else {
    s.source = store_.fetch(u);
    if (side_stream_fetches_ && s.source.device() != device_) {  // host memory or a file
      issue_from_host(u, exact);
    } else {
      s.full = gathered_buffer(u, s.source.options().device(device_).pinned_memory(false));
      s.work = exact ? comm_->all_gather(s.full, s.source)
                     : quantized_all_gather(*comm_, s.full, s.source);
    }
  }
  // qwZ: this rank's slice in int8 blocks and every rank's, held until the gather is waited for.
  s.wire_bytes = !secondary && !exact && s.work
                     ? quantized_gather_wire_bytes(slots.layout.partition_numel, comm_->world_size())
                     : 0;
  const int64_t bytes = s.full.numel() * s.full.element_size() + s.wire_bytes;
  stats_.bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes + spares_.bytes());
  if (u != 0) {
    stats_.numel += s.full.numel();
    stats_.peak_numel = std::max(stats_.peak_numel, stats_.numel);
  }
}

// The slice goes up into its own place in the unit's buffer, then the all-gather fills the rest
// in place (qwZ: its int8 gather reads a separate copy). Both queue on the side stream; the
// buffer belongs to its pool until use() hands it to the compute stream.
void UnitGatherer::issue_from_host(int u, bool exact) {
  auto& s = state_[u];
  const auto& slots = layout_.units[u];
  const int64_t part = slots.layout.partition_numel;
  fetches_.run([&] {
    s.full = gathered_buffer(u, at::TensorOptions().dtype(s.source.dtype()).device(device_));
    if (exact) {
      at::Tensor mine = s.full.narrow(0, comm_->rank() * part, part);
      mine.copy_(s.source.reshape({-1}), /*non_blocking=*/true);
      s.work = comm_->world_size() == 1 ? nullptr : comm_->all_gather(s.full, mine);
    } else {
      at::Tensor mine = s.source.to(device_, /*non_blocking=*/true);
      s.work = quantized_all_gather(*comm_, s.full, mine);
    }
    s.fetched = fetches_.mark();
  });
}

void UnitGatherer::wait_gather(int u) {
  auto& s = state_[u];
  if (!s.work && !s.fetched && !s.source.defined()) return;
  std::shared_ptr<device::CopyFence> upload = std::move(s.fetched);
  if (upload) {
    upload->join_current();  // the compute stream waits for this unit's fetch, nothing more
    fetches_.used_on_current(s.full);
  }
  if (s.work) {
    s.work->wait();
    s.work.reset();
  }
  stats_.bytes -= s.wire_bytes;
  s.wire_bytes = 0;
  s.source = at::Tensor();
  // The store's buffer may still be read by the upload (the host did not wait for it): the store
  // reuses it only once that has passed.
  if (s.from_store) store_.done(u, std::move(upload));
}

// Every rank reaches this at the same point (the store's whole reads and writes come from the
// same engine call on every rank), with the same gathers in flight: waiting completes them.
void UnitGatherer::hand_back_store_slices() {
  for (size_t u = 0; u < state_.size(); ++u)
    if (state_[u].from_store && state_[u].source.defined()) wait_gather(static_cast<int>(u));
}

void UnitGatherer::use(int u, bool exact) {
  auto& s = state_[u];
  const auto& slots = layout_.units[u];
  if (slots.params.empty()) return;
  if (!gathered(u)) {
    make_room(numel_of(u), u);
    issue(u, exact);
  }
  wait_gather(u);
  if (s.params_set) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < slots.params.size(); ++i) {
    at::Tensor p = slots.params[i];
    int64_t n = 1;
    for (auto d : slots.shapes[i]) n *= d;
    p.set_data(s.full.narrow(0, slots.offsets[i], n).view(slots.shapes[i]));
  }
  s.params_set = true;
}

// The parameters get empty data of their dtype: the gathered buffer's last references go, so its
// storage is freed (the unit's parameters show numel 0, as DeepSpeed's do while released).
void UnitGatherer::release(int u) {
  auto& s = state_[u];
  if (u == 0 || !gathered(u)) return;
  wait_gather(u);
  // hpZ: the unit's backward is still to come; its gather then stays inside the group.
  if (secondary_ && s.awaiting_backward && !secondary_->has(u)) secondary_->keep(u, s.full);
  torch::NoGradGuard no_grad;
  if (s.params_set)
    for (auto p : layout_.units[u].params) p.set_data(torch::empty({0}, p.options()));
  forget_buffer(u);
}

void UnitGatherer::forget_buffer(int u) {
  auto& s = state_[u];
  stats_.bytes -= s.full.numel() * s.full.element_size();
  stats_.numel -= s.full.numel();
  const int64_t room =
      std::min(spare_cap_, config_.stage3_max_live_parameters - stats_.numel);
  if (u != 0 && s.full.numel() <= room && spares_.worth_keeping(s.full)) {
    spares_.shrink_to(room - s.full.numel());
    spares_.keep(std::move(s.full));
  }
  s.full = at::Tensor();
  s.params_set = false;
}

int64_t UnitGatherer::next_use_distance(int u, bool count_elements) const {
  if (!trace_valid_) return -1;
  int64_t distance = 0;
  for (size_t i = cursor_; i < trace_.size(); ++i) {
    if (trace_[i] == u) return distance;
    distance += count_elements ? numel_of(trace_[i]) : 1;
  }
  return -1;
}

// Releases gathered units not in use until `numel` more elements fit under max-live: those not
// needed again this iteration first, then the farthest next use.
void UnitGatherer::make_room(int64_t numel, int gathering) {
  const int64_t limit = config_.stage3_max_live_parameters;
  while (stats_.numel + numel > limit) {
    int victim = -1;
    int64_t victim_distance = -2;
    for (int v = 1; v < static_cast<int>(state_.size()); ++v) {
      if (v == gathering || !gathered(v) || in_use(v)) continue;
      int64_t d = next_use_distance(v, /*count_elements=*/false);
      if (d < 0) d = INT64_MAX;
      if (d > victim_distance) victim = v, victim_distance = d;
    }
    if (victim < 0) return;  // everything gathered is in use: the bound yields
    release(victim);
  }
}

void UnitGatherer::prefetch() {
  if (!trace_valid_) return;
  int64_t budget = config_.stage3_prefetch_bucket_size;
  bool gathering = budget > 0;
  for (size_t i = cursor_; i < trace_.size(); ++i) {
    const int v = trace_[i];
    if (v == 0 || layout_.units[v].params.empty()) continue;
    const int64_t n = numel_of(v);
    if (gathered(v)) {
      if (!state_[v].params_set) budget -= n;  // an earlier prefetch, not used yet
      continue;
    }
    // As DeepSpeed's coordinator: the budget is checked before a unit is added, so the unit that
    // crosses it is still prefetched (a unit larger than the whole budget too: with the 1.3B
    // GPT's 54M-element blocks and the usual 5e7, a stricter check would prefetch nothing).
    if (gathering && budget > 0 && stats_.numel + n <= config_.stage3_max_live_parameters) {
      issue(v);
      budget -= n;
      continue;
    }
    // Past the all-gather window: read ahead from the parameter swap file.
    gathering = false;
    if (!store_.swapped() || !store_.start_fetch(v)) return;
  }
}

void UnitGatherer::begin_forward() {
  // Nothing from a previous forward (an eval pass, kept for a reuse that never came) stays.
  release_idle_units();
  cursor_ = 0;
  if (!trace_valid_) {
    trace_.clear();
    recording_ = true;
  }
  prefetch();  // the first units' gathers overlap whatever runs before them (the embeddings)
}

// The forward scope (ZeroUnit's ForwardScope) opens only if this returns: a throw here (an
// out-of-memory gathering u or a prefetch) gets no post_forward, so it undoes its own count.
// Else u would count as in use for ever: never released, never regathered after a step.
void UnitGatherer::pre_forward(int u) {
  record(u);
  state_[u].active++;
  state_[u].awaiting_backward = true;
  try {
    use(u);
    prefetch();
  } catch (...) {
    state_[u].active--;
    throw;
  }
}

void UnitGatherer::post_forward(int u) {
  auto& s = state_[u];
  s.active--;
  if (in_use(u)) return;
  const int64_t distance = next_use_distance(u, /*count_elements=*/true);
  if (distance >= 0 && distance <= config_.stage3_max_reuse_distance) return;
  release(u);
}

void UnitGatherer::pre_backward(int u) {
  record(u);
  state_[u].backward_pending = true;
  use(u);
  prefetch();
}

void UnitGatherer::backward_done(int u) {
  state_[u].backward_pending = false;
  state_[u].awaiting_backward = false;
  if (secondary_) secondary_->drop(u);
  if (!in_use(u)) release(u);
}

void UnitGatherer::end_backward() {
  for (auto& s : state_) s.backward_pending = false;
  release_idle_units();
  // A prefetch never used may still be reading the store: the step is about to write it.
  fetches_.mark()->wait();
  if (recording_ && !trace_.empty()) trace_valid_ = true;
  recording_ = false;
  cursor_ = 0;
}

// Every unit not in use goes, and no unit awaits a backward any more, so no release keeps an hpZ
// secondary (the hpZ secondaries go too): the forward, backward or store change that comes next
// would make them stale. At begin_forward, end_backward and before_store_changes.
void UnitGatherer::release_idle_units() {
  for (int u = 1; u < static_cast<int>(state_.size()); ++u) {
    state_[u].awaiting_backward = false;
    if (!in_use(u)) release(u);
  }
  if (secondary_) secondary_->drop_all();
}

void UnitGatherer::before_store_changes() {
  // As end_backward: the backward an eval forward's units await is not coming.
  release_idle_units();
  hand_back_store_slices();
  fetches_.mark()->wait();  // a read-ahead upload never used may still read a slice
}

void UnitGatherer::pin(int u) {
  // A pinned unit shows its exact values (a modifier rank's edits become the masters): one
  // gathered through qwZ (prefetched, awaiting its backward, or in use by the forward or
  // backward running now) is gathered again exactly.
  auto& s = state_[u];
  if (gathered(u) && !s.exact && in_use(u)) {
    // Its parameters point at the quantized buffer until use() points them at the exact one, so
    // both are live meanwhile and both count (peak, max-live room). Autograd saved the
    // parameters themselves (ZeroLinear saves the leaf), so a backward of what ran before the
    // pin reads the exact values too, and the old buffer goes once nothing points at it.
    wait_gather(u);
    const int64_t old_bytes = s.full.numel() * s.full.element_size(), old_numel = s.full.numel();
    at::Tensor quantized = std::move(s.full);
    s.full = at::Tensor();
    s.params_set = false;
    s.pins++;
    try {
      use(u, /*exact=*/true);
    } catch (...) {  // (out of memory, likeliest with both live): the unit as it was
      forget_buffer(u);  // what the exact gather had counted, if it got that far
      s.pins--;
      s.full = std::move(quantized);
      s.exact = false;
      s.work = {};
      s.params_set = true;
      throw;
    }
    stats_.bytes -= old_bytes;
    stats_.numel -= old_numel;
    return;
  }
  if (gathered(u) && !s.exact) release(u);
  s.pins++;
  try {
    use(u, /*exact=*/true);
  } catch (...) {
    unpin(u);  // a unit pinned for ever would never be released, nor regathered after a step
    throw;
  }
}

bool UnitGatherer::pinned() const {
  for (const auto& s : state_)
    if (s.pins > 0) return true;
  return false;
}

void UnitGatherer::unpin(int u) {
  state_[u].pins--;
  if (!in_use(u)) release(u);
}

void UnitGatherer::regather_root() {
  const auto& slots = layout_.units[0];
  if (slots.params.empty()) return;
  auto& s = state_[0];
  if (!gathered(0)) {
    use(0);
    return;
  }
  comm_->all_gather(s.full, store_.fetch(0))->wait();
}

}  // namespace zero
}  // namespace deepspeed
