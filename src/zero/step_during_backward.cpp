#include "zero/step_during_backward.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "device/out_of_memory.h"
#include "device/pinned_memory.h"
#include "util/ranges.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

StepDuringBackward::StepDuringBackward(optim::FusedAdam& adam, at::Tensor master,
                                       c10::Device compute_device, Options options)
    : adam_(adam), master_(std::move(master)), options_(options), device_(compute_device),
      downloads_(compute_device), uploads_(compute_device), threads_(at::get_num_threads()) {
  TORCH_CHECK(options_.chunk > 0 && options_.ring_slots > 0,
              "StepDuringBackward: chunk and ring_slots must be positive");
  // A small partition gets chunks of a quarter of it (ring_slots of them), not a fixed size.
  const int64_t share = (master_.numel() + options_.ring_slots - 1) / options_.ring_slots;
  options_.chunk = std::max<int64_t>(1, std::min(options_.chunk, share));
}

// The buffers go back to the host allocator (unregistered) only after no copy reads or writes
// them: a step abandoned mid-way (a failed backward, a forward-only end) may leave some queued.
StepDuringBackward::~StepDuringBackward() {
  for (auto& fence : awaited_) fence->cancel();  // a range whose values will not come now
  try {
    worker_.wait();
  } catch (...) {
  }
  try {  // a sticky CUDA error throws here too: a destructor must not
    downloads_.mark()->wait();
    uploads_.mark()->wait();
  } catch (...) {
  }
}

int64_t StepDuringBackward::host_bytes() const {
  int64_t bytes = storage_bytes(landing_) + storage_bytes(scratch_);
  for (const auto& s : ring_) bytes += storage_bytes(s.values);
  return bytes;
}

// On a GPU the copy runs on the download stream once the compute stream has produced the
// gradients (their bucket's reduction was joined to it): backward's next kernels do not queue
// behind a transfer of the whole range. `grads` is a slice of the stage's gradient partition,
// which nothing frees or rewrites before finish()/forget() waited for the fence.
StepDuringBackward::Download StepDuringBackward::download(int64_t begin, const at::Tensor& grads,
                                                          std::shared_ptr<device::CopyFence> ready) {
  if (grads.is_cpu())
    return {grads.contiguous(), ready ? std::move(ready) : device::CopyFence::record(grads.device())};
  if (!landing_.defined() || landing_.scalar_type() != grads.scalar_type()) {
    AllocatingFor naming("ZeRO-Offload's landing buffer for the gradients in host memory", -1,
                         master_.numel(), c10::elementSize(grads.scalar_type()));
    landing_ = device::host_buffer(master_.numel(), grads.scalar_type(), options_.pin, device_);
  }
  at::Tensor slice = landing_.narrow(0, begin, grads.numel());
  downloads_.follow_current();
  auto fence = downloads_.copy(slice, grads);
  return {slice, fence};
}

// One chunk: fp32 gradients (widened into the scratch when 16-bit), the update, and the new
// values up into the partition.
void StepDuringBackward::update_chunk(int64_t begin, const at::Tensor& grads,
                                      const at::Tensor& partition) {
  const int64_t n = grads.numel();
  reserve(grads.scalar_type(), partition);  // done already on the engine's thread: a no-op
  at::Tensor grads32 = grads;
  if (grads.scalar_type() != at::kFloat) {
    grads32 = scratch_.narrow(0, 0, n);
    grads32.copy_(grads);
  }
  const float* g = grads32.data_ptr<float>();
  if (!options_.upload) {  // the partition is in host memory: the update writes it
    step_.run(g, begin, n);
    return;
  }
  at::Tensor target = partition.narrow(0, begin, n);
  // Masters in the partition's dtype (fp32, or 16-bit masters: fp16/bf16_master_weights_and_grads)
  // are themselves what goes up.
  const bool masters_go_up = partition.scalar_type() == master_.scalar_type();
  if (masters_go_up) {
    step_.run(g, begin, n);
    if (options_.pin) {  // page-locked: straight from them
      uploads_.copy(target, master_.narrow(0, begin, n));
      return;
    }
  }
  Slot& slot = ring_[next_slot_];
  next_slot_ = (next_slot_ + 1) % ring_.size();
  if (slot.uploaded) slot.uploaded->wait();  // its previous chunk has gone up
  at::Tensor values = slot.values.narrow(0, 0, n);
  if (masters_go_up)
    values.copy_(master_.narrow(0, begin, n));
  else
    step_.run_into(g, begin, n, static_cast<uint16_t*>(values.data_ptr()),
                   partition.scalar_type() == at::kHalf ? optim::Half16Kind::FP16
                                                        : optim::Half16Kind::BF16);
  slot.uploaded = uploads_.copy(target, values);
}

// The scratch and the ring, allocated before the step is counted (prepare()) and before any range
// is posted, on the engine's thread: an out-of-memory there fails the backward (or the step) with
// nothing of the optimizer state changed, so a retry is clean.
void StepDuringBackward::reserve(at::ScalarType grad_dtype, const at::Tensor& partition) {
  if (grad_dtype != at::kFloat && !scratch_.defined())
    scratch_ = at::empty({options_.chunk}, at::kFloat);
  // Page-locked whatever pin_memory says (ring_slots chunks: 32 MiB at the defaults in 16 bits):
  // an upload from pageable memory would hold the worker until the upload stream had caught up,
  // at every chunk. Masters in the partition's dtype need it only when they are pageable: a chunk
  // is then copied into a slot (a host memcpy) and goes up from there.
  const bool needs_ring = partition.scalar_type() != master_.scalar_type() || !options_.pin;
  if (options_.upload && needs_ring && ring_.empty()) {
    std::vector<Slot> ring(options_.ring_slots);
    AllocatingFor naming("ZeRO-Offload's page-locked upload ring (each slot)", -1, options_.chunk,
                         c10::elementSize(partition.scalar_type()));
    for (auto& s : ring)
      s.values = device::host_buffer(options_.chunk, partition.scalar_type(), /*pin=*/true, device_);
    ring_ = std::move(ring);
  }
}

namespace {

// The worker thread's OpenMP team size, for libtorch's own parallel loops there too (the
// widening copy): a thread's default is every core, whatever at::set_num_threads said on the
// main thread.
void worker_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

}  // namespace

void StepDuringBackward::update(int64_t begin, const at::Tensor& host_grads,
                                const at::Tensor& partition) {
  const int64_t n = host_grads.numel();
  for (int64_t at = 0; at < n; at += options_.chunk) {
    const int64_t c = std::min(options_.chunk, n - at);
    const int team = team_.load(std::memory_order_acquire);
    if (team != step_.hyper.num_threads) {
      step_.set_num_threads(team);
      worker_threads(team);
    }
    last_chunk_team_ = team;
    update_chunk(begin + at, host_grads.narrow(0, at, c), partition);
  }
}

void StepDuringBackward::take(int64_t begin, const at::Tensor& grads, const at::Tensor& partition,
                              std::shared_ptr<device::CopyFence> ready) {
  torch::NoGradGuard no_grad;
  const int64_t n = grads.numel();
  TORCH_CHECK(!handed_over_, "StepDuringBackward: a range of the next step taken before the "
              "handed-over step was completed (complete())");
  TORCH_CHECK(begin >= 0 && begin + n <= master_.numel(), "StepDuringBackward: range [", begin,
              ", ", begin + n, ") outside the partition of ", master_.numel());
  if (n == 0) {
    taken_.emplace_back(begin, n);
    return;
  }
  // What can fail (the landing buffer, the scratch, the ring) comes before the step is counted
  // and the range recorded: a take that throws leaves the step as it was.
  Download down = download(begin, grads, std::move(ready));
  if (options_.update_early) {
    reserve(grads.scalar_type(), partition);
    if (!prepared_) prepare();
  }
  taken_.emplace_back(begin, n);
  awaited_.push_back(down.fence);
  if (!options_.update_early) {
    landed_.push_back({begin, down});
    return;
  }
  post_update(begin, down, partition);
}

void StepDuringBackward::post_update(int64_t begin, const Download& down,
                                     const at::Tensor& partition) {
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(progress_mutex_);
    index = progress_.size();
    progress_.push_back({begin, begin + down.grads.numel(), false, nullptr});
  }
  worker_.post(
      [this, begin, down, partition, index] {
        // Whatever throws here (the update, the fence) marks the worker failed: settle() must
        // not wait for ranges that will now never be done.
        try {
          down.fence->wait();
          worker_threads(step_.hyper.num_threads);
          update(begin, down.grads, partition);
          // The range's uploads are queued: a fence after them, recorded on this thread (the
          // one issuing the copies), for the compute stream to wait on in settle().
          std::shared_ptr<device::CopyFence> uploaded = options_.upload ? uploads_.mark() : nullptr;
          std::lock_guard<std::mutex> lock(progress_mutex_);
          progress_[index].done = true;
          progress_[index].uploaded = std::move(uploaded);
        } catch (...) {
          {
            std::lock_guard<std::mutex> lock(progress_mutex_);
            worker_failed_ = true;
          }
          progress_changed_.notify_all();
          throw;
        }
        progress_changed_.notify_all();
      },
      begin);
}

// The step's constants, with the learning rates the scheduler set for it (each parameter
// group's, on its segments of the partition) and the grad scale set on the optimizer (counted
// even for an empty partition, as a whole step() counts it).
// Updating during a GPU's backward, the Adam's OpenMP team leaves one core to the thread that
// launches backward's kernels: a team on every core (spinning between chunks, as libgomp does)
// would take that thread off its core for whole time slices while the GPU waits for work.
void StepDuringBackward::prepare() {
  step_ = adam_.prepare_step(master_);
  prepared_ = true;
  const int team =
      options_.upload && options_.update_early ? std::max(1, threads_ - 1) : threads_;
  step_.set_num_threads(team);
  team_.store(team, std::memory_order_release);
}

// Cancelled first: a range whose values a host thread was to put in (a pageable partition's
// HostFence) may never get them now, and waiting below would then never end. A device's fence
// ignores it, and is waited for: its copy still writes the landing buffer.
void StepDuringBackward::forget() {
  for (auto& fence : awaited_) fence->cancel();
  for (auto& l : landed_) {
    try {
      l.down.fence->wait();  // their copies still write the landing buffer
    } catch (...) {  // cancelled (its values never came), or the device failed
    }
  }
  clear_step();
}

void StepDuringBackward::clear_step() {
  landed_.clear();
  taken_.clear();
  awaited_.clear();
  prepared_ = false;
  handed_over_ = false;
  std::lock_guard<std::mutex> lock(progress_mutex_);
  progress_.clear();
  worker_failed_ = false;
}

// The step was counted and (some of) its ranges may be updated: it cannot be completed or undone.
void StepDuringBackward::lose() {
  lost_ = std::max<size_t>(1, taken_.size());
  lost_in_forward_ = handed_over_;
  try {  // the uploads already queued land before whatever the compute stream does next
    uploads_.join();
  } catch (...) {
  }
  forget();
}

void StepDuringBackward::discard() {
  TORCH_CHECK(!prepared_,
              "StepDuringBackward::discard: ranges were already updated during backward");
  forget();
}

void StepDuringBackward::abandon() {
  if (handed_over_) {  // its gradients are final: complete it (a failure has lost it already)
    try {
      complete();
    } catch (...) {
    }
    return;
  }
  if (taken_.empty() && !prepared_) return;  // nothing of a step here (finish() joined its uploads)
  for (auto& fence : awaited_) fence->cancel();  // before the worker, which may wait on them
  try {
    worker_.wait();
  } catch (...) {
  }
  if (prepared_)
    lose();  // joins the uploads too
  else
    forget();
}

// Two halves. First what can fail with nothing changed (a worker's error aside): the downloads
// of what no range covered, the fences, the buffers. A throw there keeps the step whole, and
// finish() may be called again. Then the step is counted (prepare(), unless the first range did)
// and the updates run: a throw from there on loses the step (lost()).
void StepDuringBackward::finish(const at::Tensor& grads, const at::Tensor& partition) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(started(), "StepDuringBackward::finish without a range taken this step");
  team_.store(threads_, std::memory_order_release);  // backward is launched: every core now
  try {
    worker_.wait();
  } catch (...) {
    lose();
    throw;
  }
  std::vector<Landed> rest;  // what no range covered (padding; the whole partition when serial)
  try {
    for (const auto& [begin, numel] : uncovered(taken_, master_.numel(), "StepDuringBackward"))
      rest.push_back({begin, download(begin, grads.narrow(0, begin, numel))});
    for (auto& l : landed_) l.down.fence->wait();
    for (auto& r : rest) r.down.fence->wait();
    reserve(grads.scalar_type(), partition);
  } catch (...) {
    if (prepared_) lose();  // the early updates ran: the step cannot be completed
    throw;
  }
  try {
    if (!prepared_) prepare();
    for (auto& l : landed_) update(l.begin, l.down.grads, partition);
    for (auto& r : rest) update(r.begin, r.down.grads, partition);
    uploads_.join();
  } catch (...) {
    lose();
    throw;
  }
  last_ranges_ = taken_.size();
  end_step();
}

void StepDuringBackward::end_step() {
  threads_ = at::get_num_threads();  // the caller's thread: the user's setting, for the next step
  clear_step();
}

// The ranges still queued stay queued; what no range covered (padding) joins them, on the worker
// too. The Adam's team keeps its spare core: the engine's thread goes on to launch the next
// forward's kernels (on the CPU, to compute it) while the worker updates.
void StepDuringBackward::hand_over(const at::Tensor& grads, const at::Tensor& partition,
                                   const std::function<int64_t(int64_t, int64_t)>& first_read) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(started() && options_.update_early && prepared_ && !handed_over_,
              "StepDuringBackward::hand_over needs a step updated during backward");
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(progress_mutex_);
    failed = worker_failed_;
  }
  if (failed) {  // a range already failed during backward: step() throws, as finish() would
    try {
      worker_.wait();
    } catch (...) {
      lose();
      throw;
    }
  }
  last_ranges_ = taken_.size();
  try {
    for (const auto& [begin, numel] : uncovered(taken_, master_.numel(), "StepDuringBackward")) {
      Download down = download(begin, grads.narrow(0, begin, numel));
      taken_.emplace_back(begin, numel);
      awaited_.push_back(down.fence);
      post_update(begin, down, partition);
    }
  } catch (...) {
    for (auto& fence : awaited_) fence->cancel();
    try {
      worker_.wait();
    } catch (...) {
    }
    lose();
    throw;
  }
  std::unordered_map<int64_t, int64_t> when;  // a range's first element -> its first read
  {
    std::lock_guard<std::mutex> lock(progress_mutex_);
    for (const auto& p : progress_) when[p.begin] = first_read(p.begin, p.end);
  }
  worker_.reorder([&when](int64_t a, int64_t b) {
    const int64_t wa = when.count(a) ? when.at(a) : 0, wb = when.count(b) ? when.at(b) : 0;
    return wa != wb ? wa < wb : a > b;
  });
  ranges_waited_for_ = 0;
  handed_over_ = true;
}

void StepDuringBackward::settle(int64_t begin, int64_t end) {
  if (!handed_over_ || begin >= end) return;
  std::vector<std::shared_ptr<device::CopyFence>> uploads;
  bool failed = false;
  {
    std::unique_lock<std::mutex> lock(progress_mutex_);
    auto overlaps = [&](const Progress& p) { return p.begin < end && begin < p.end; };
    auto all_done = [&] {
      if (worker_failed_) return true;
      for (const auto& p : progress_)
        if (overlaps(p) && !p.done) return false;
      return true;
    };
    if (!all_done()) {
      for (const auto& p : progress_) ranges_waited_for_ += overlaps(p) && !p.done;
      progress_changed_.wait(lock, all_done);
    }
    failed = worker_failed_;
    for (const auto& p : progress_)
      if (overlaps(p) && p.uploaded) uploads.push_back(p.uploaded);
  }
  if (failed) return complete();  // throws the worker's error, the step lost
  for (const auto& fence : uploads) fence->join_current();
}

void StepDuringBackward::complete() {
  if (!handed_over_) return;
  try {
    worker_.wait();
    uploads_.join();
  } catch (...) {
    lose();
    throw;
  }
  end_step();
}

}  // namespace zero
}  // namespace deepspeed
