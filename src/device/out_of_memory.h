// An allocator's out-of-memory turned into words a DeepSpeed user can act on: where it happened
// (rank, phase, ZeRO stage, device), what was being allocated (the buffer deepspeed was making,
// named by the AllocatingFor scope around it, or else the model's own tensors), what was asked
// (libtorch's "Tried to allocate ..." or the CPU allocator's byte count), and what to try,
// instead of a CUDA stack.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

namespace deepspeed {

// Names a buffer deepspeed is about to allocate (a gathered unit, a gradient bucket), for the
// report: when an exception leaves the scope, the innermost scope it leaves is recorded (for the
// process: on a GPU the stages' hooks run on autograd's device thread) until the report takes
// it, or until this thread opens another scope outside any catch block (the exception was then
// handled without a report). Costs an atomic load unless something throws. Keep it around the
// allocation alone, so that it names only what that allocation asked for.
class AllocatingFor {
 public:
  // `what`: a string literal ("stage 3's gathered parameters of unit"); `index` >= 0 is printed
  // after it; `numel` elements of `element_size` bytes.
  AllocatingFor(const char* what, int64_t index, int64_t numel, int64_t element_size) noexcept;
  ~AllocatingFor();
  AllocatingFor(const AllocatingFor&) = delete;
  AllocatingFor& operator=(const AllocatingFor&) = delete;

 private:
  const char* what_;
  int64_t index_, numel_, element_size_;
  int exceptions_;  // in flight when the scope began: more at its end means one is leaving it
};

// What the scope left by the last exception was allocating, then forgotten; "" when none was:
// the calling thread's own record, else the newest another thread (autograd's device thread)
// made since this thread's engine call began. forget_failed_allocation() marks that beginning
// (each engine call starts with it, so an old failure that was caught and handled is never
// named). Ranks as threads (tests): forgetting drops only the caller's own record, and a report
// takes another thread's only when the caller has none of its own (a rank whose failure was in
// no named buffer may then name another rank's).
std::string take_failed_allocation();
void forget_failed_allocation();

// The message to throw when `libtorch_message` reports an out-of-memory (libtorch's CUDA
// caching allocator, a page-locked host allocation, the CPU allocator); nullopt otherwise.
// `allocating`: take_failed_allocation() ("" if deepspeed was allocating nothing of its own: the
// model's tensors then, whose kind `phase_tensors` names, e.g. "activations").
std::optional<std::string> out_of_memory_message(const std::string& libtorch_message,
                                                 const std::string& where, int zero_stage,
                                                 c10::Device device,
                                                 const std::string& allocating = "",
                                                 const char* phase_tensors = nullptr);

}  // namespace deepspeed
