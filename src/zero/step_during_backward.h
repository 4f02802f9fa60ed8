// ZeRO-Offload's host update: the fp32 masters and moments in host memory, the vectorised CPU
// Adam (FusedAdam) run range by range on a worker thread. Used for every FusedAdam step of a
// shard whose masters are on the host while the stage computes elsewhere (offload_optimizer
// "cpu" on a GPU), and on the CPU when offload_optimizer.overlap_step asks for it.
//
// With overlap_step (the update needs nothing from the whole gradient: no gradient clipping, no
// fp16 overflow vote; ShardOptions.overlap_step_allowed), each range of the gradient partition is
// taken as soon as the accumulation boundary's backward has made it final (its bucket reduced),
// instead of after the whole backward:
//   engine thread  take(): the range's gradients, in their own dtype, down into host memory (on a
//                  GPU asynchronously, on a download stream that follows the compute stream,
//                  with a fence; stages 2 and 3 keep the partition in host memory already,
//                  zero/host_grad_partition.h, and hand over their download's fence instead); a
//                  task posted;
//   worker thread  waits for the fence; for each chunk of the range, widens the gradients to fp32
//                  in a small scratch buffer, runs Adam on the masters, writes the chunk's 16-bit
//                  rounding into a slot of a small ring and uploads the slot into the device
//                  partition on a side stream (a slot is reused once its upload is done).
// finish() (the engine's step) waits for the worker, updates what no range covered (padding),
// and makes the compute stream wait for the uploads. When the step needs the whole gradient
// first (clipping, fp16), overlap_step still brings each range down during backward, and
// finish() updates them all with the scale. Without overlap_step the shard takes the whole
// partition at step time, then finishes: the same code, serial.
// The ranges give bit for bit what one step gives: the update is elementwise, same constants.
// With a client optimizer's parameter groups (FusedAdam::set_flat) a range is cut where the
// groups' segments meet, each part updated with its group's constants (AdamRangeStep).
// Host bytes per parameter on a GPU in 16-bit training: masters 4 + moments 8 + gradients 2 (the
// ZeRO floor of 12 plus the gradients' place: the stage's host partition, or the landing buffer
// here at stage 1 when it all-reduces a full buffer on the GPU); the scratch and the ring are a
// few chunks.
// Why uploading early is safe: a range is final only after backward has run every node that
// reads its parameters, and the worker waits for a fence recorded after those nodes' kernels.
// With the partition in host memory (the CPU, or offload_param "cpu") the update writes the
// 16-bit partition directly (FusedAdam's half copy) and nothing goes up.
// hand_over() instead of finish() (offload_optimizer.overlap_forward, zero/forward_waits.h) lets
// the ranges still queued at the step run on into the next forward, in the order it reads them:
// settle() waits for the ranges the caller is about to read (and on a GPU makes the compute
// stream wait for their upload), complete() for all of them. A step's update is the same bit for
// bit; only when the engine may read each range changes.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "device/transfer_stream.h"
#include "offload/step_worker.h"
#include "optim/fused_adam.h"

namespace deepspeed {
namespace zero {

class StepDuringBackward {
 public:
  struct Options {
    // pin_memory: the landing buffer page-locked, and the fp32 masters (which then go up without
    // the ring). The upload ring always is.
    bool pin = false;
    // The partition is not in host memory: updated values go up through the ring (16-bit) or
    // straight from the masters (fp32). False: the update writes the partition itself.
    bool upload = false;
    // Elements per widening / upload chunk; at most ceil(partition / ring_slots).
    int64_t chunk = int64_t{1} << 22;
    int ring_slots = 4;
    // True: each range is updated as it is taken (the step needs no whole gradient). False:
    // taking a range only brings its gradients down; finish() updates, with the grad scale set
    // on `adam` just before it (clipping, fp16's loss scale).
    bool update_early = true;
  };
  // `master`: the fp32 host masters, a parameter of `adam` (with the partition in host memory
  // and fp32, the partition itself; 16-bit in host memory: `adam` writes it as its half copy).
  // `compute_device`: where the gradients are (and the partition, unless it is in host memory):
  // the host buffers are page-locked for copies with it and the copies use its streams.
  StepDuringBackward(optim::FusedAdam& adam, at::Tensor master, c10::Device compute_device,
                     Options options);
  ~StepDuringBackward();

  // Elements [begin, begin + grads.numel()) of the gradient partition are final for this step.
  // `partition`: the resident parameter partition. The first take() of a step reads the step's
  // constants (each group's learning rate, the grad scale set on `adam`) and, with
  // update_early, counts the step. `ready`: for gradients already in host memory
  // (zero/host_grad_partition.h), a fence after which their values are there (null: they are).
  // A take() that throws (an out-of-memory for the landing buffer or the ring) records nothing.
  // REQUIRES: ranges of one step do not overlap.
  void take(int64_t begin, const at::Tensor& grads, const at::Tensor& partition,
            std::shared_ptr<device::CopyFence> ready = nullptr);
  // Whether a range was taken since the last finish().
  bool started() const { return !taken_.empty(); }
  // Completes the step: `grads` is the whole gradient partition. Rethrows a worker's error. A
  // throw before the step was counted keeps the step (finish() may be called again); after it,
  // the step is lost().
  void finish(const at::Tensor& grads, const at::Tensor& partition);
  // Like finish(), but the ranges still queued are not waited for: what no range covered is
  // queued too, and the queue is sorted by `first_read(begin, end)` (when the next forward first
  // reads the range; lower first; ties: the higher elements first, as FlatParams lays the
  // parameters out in reverse). Until complete(), settle() waits for the ranges about to be
  // read. REQUIRES: started(), updates_early(). A throw loses the step.
  void hand_over(const at::Tensor& grads, const at::Tensor& partition,
                 const std::function<int64_t(int64_t, int64_t)>& first_read);
  // A handed-over step whose ranges may still be running.
  bool handed_over() const { return handed_over_; }
  // Elements [begin, end) of the partition are updated (on a GPU: the compute stream waits for
  // their upload, the host does not). A no-op unless handed_over(). A worker's error loses the
  // step and is thrown.
  void settle(int64_t begin, int64_t end);
  // Completes a handed-over step: every range updated and, on a GPU, uploaded before the compute
  // stream's next work. A no-op unless handed_over(). Throws as settle().
  void complete();
  // Ranges that settle() found not yet updated since the last hand_over (tests, logs: the
  // forward really overlapped the update).
  size_t ranges_waited_for() const { return ranges_waited_for_; }
  // Drops the ranges taken this step (an fp16 overflow skips it). REQUIRES: nothing updated yet
  // (!update_early, or nothing taken): an early update cannot be undone.
  void discard();
  // After a backward that threw: cancels the fences of the ranges taken (a range whose values
  // will never come is not waited for), waits for the worker (dropping its error) and for the
  // uploads it queued, and forgets the step. If the step was already counted and ranges updated,
  // it is lost().
  void abandon();
  // Ranges of a step that was counted and partly updated but never completed (abandoned, or its
  // update failed): the optimizer state is partly stepped. 0: none. Until forget_lost().
  size_t lost() const { return lost_; }
  void forget_lost() { lost_ = 0; }
  // The lost step had been handed over (its update failed while running into the next forward).
  bool lost_in_forward() const { return lost_in_forward_; }
  bool updates_early() const { return options_.update_early; }
  size_t ranges_taken() const { return taken_.size(); }
  // Ranges the last completed step took before finish() (tests, logs).
  size_t ranges_in_last_step() const { return last_ranges_; }
  // The OpenMP team of the last chunk updated (tests: the full team once finish() is reached).
  int last_chunk_team() const { return last_chunk_team_; }
  // Host bytes held here (the gradient landing place, the scratch, the ring).
  int64_t host_bytes() const;

 private:
  struct Slot {
    at::Tensor values;                          // chunk elements of the partition's dtype
    std::shared_ptr<device::CopyFence> uploaded;  // its last upload; null when free
  };
  // A range's gradients in host memory, in their dtype: the gradients themselves on the CPU,
  // else a slice of the landing buffer, filled by an asynchronous copy; usable once the fence
  // is passed.
  struct Download {
    at::Tensor grads;
    std::shared_ptr<device::CopyFence> fence;
  };
  Download download(int64_t begin, const at::Tensor& grads,
                    std::shared_ptr<device::CopyFence> ready = nullptr);
  void update(int64_t begin, const at::Tensor& host_grads, const at::Tensor& partition);
  void update_chunk(int64_t begin, const at::Tensor& grads, const at::Tensor& partition);
  // Queues the update of a range whose gradients are coming down (`down`) on the worker.
  void post_update(int64_t begin, const Download& down, const at::Tensor& partition);
  void end_step();  // a completed step: its ranges forgotten, the thread count refreshed
  void clear_step();  // this step's ranges, fences and progress dropped (no waiting)

  optim::FusedAdam& adam_;
  at::Tensor master_;
  Options options_;
  optim::AdamRangeStep step_;
  at::Tensor landing_;  // gradients from a GPU, the partition's size, their dtype
  at::Tensor scratch_;  // worker: a chunk of fp32 gradients
  std::vector<Slot> ring_;
  size_t next_slot_ = 0;
  struct Landed {  // !update_early: a range's gradients on their way down
    int64_t begin;
    Download down;
  };
  void prepare();  // counts the step (FusedAdam's step + 1) and reads its constants
  void reserve(at::ScalarType grad_dtype, const at::Tensor& partition);  // scratch and ring
  void forget();  // waits for the landing copies, then drops this step's ranges
  void lose();    // forget(), remembering the step as lost()
  std::vector<std::pair<int64_t, int64_t>> taken_;  // (begin, numel) this step
  std::vector<Landed> landed_;
  // The fences of the ranges taken this step: abandon() cancels them (a host-passed fence of a
  // copy a failed backward dropped would keep the worker, and so abandon(), waiting for ever).
  std::vector<std::shared_ptr<device::CopyFence>> awaited_;
  // Each range of this step as the worker updates it: settle() waits on it. Guarded by
  // progress_mutex_ (the worker writes, the engine's thread reads).
  struct Progress {
    int64_t begin = 0, end = 0;
    bool done = false;
    std::shared_ptr<device::CopyFence> uploaded;  // on a GPU: after the range's last upload
  };
  std::mutex progress_mutex_;
  std::condition_variable progress_changed_;
  std::vector<Progress> progress_;
  bool worker_failed_ = false;  // a task threw: the ranges after it will never be done
  bool handed_over_ = false;
  size_t ranges_waited_for_ = 0;
  size_t last_ranges_ = 0;
  int last_chunk_team_ = 0;  // written by whichever thread updates; read after finish()
  bool prepared_ = false;  // this step was counted: from here on it can only complete or be lost
  size_t lost_ = 0;
  bool lost_in_forward_ = false;
  c10::Device device_;  // the compute device: host buffers are registered for copies with it
  device::SideStream downloads_;  // gradients down, behind the compute stream's reduction
  device::SideStream uploads_;
  // The Adam's team size: read on the engine's thread (construction, finish()), never in take(),
  // which on a GPU runs on autograd's device thread, whose OpenMP default is every core.
  int threads_;
  // The worker's team size for its next chunk: threads_ - 1 during a GPU's backward (prepare()),
  // all of threads_ once the engine reaches finish(): backward's kernels are launched by then,
  // and the ranges still queued (most of a big model's: the Adam takes longer than backward)
  // have every core. Read by the worker before each chunk, so only it changes step_.
  std::atomic<int> team_{1};
  offload::StepWorker worker_;  // last: joined first, while the buffers above still exist
};

}  // namespace zero
}  // namespace deepspeed
