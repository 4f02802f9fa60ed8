// Vectorised Adam/AdamW update over a flat fp32 buffer: the step ZeRO runs on each rank's
// partition and CPU offload runs on the host (DeepSpeedCPUAdam's counterpart).
//
// One pass over n elements: grad, exp_avg, exp_avg_sq and param are each read once, and
// exp_avg, exp_avg_sq and param written once (28 bytes per element), with an optional fused
// store of the new param as 16-bit bits. The kernel is memory-bound on any recent x86.
//
// Math (same op order as torch::optim::AdamW / Adam of libtorch 1.13, constants computed in
// double and rounded to float once, as libtorch does when it wraps a Scalar):
//   g  = grad * grad_scale
//   adamw_mode:  param *= (1 - lr*wd)          (decoupled decay)
//   else:        g     += wd * param           (L2)
//   m  = b1*m + (1-b1)*g;   v = b2*v + (1-b2)*g*g
//   bc1 = 1 - b1^step;      bc2 = 1 - b2^step  (both 1 when !bias_correction)
//   param += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
//
// Thread-safety: adam_step is reentrant; calls on disjoint buffers may run concurrently. It
// runs an OpenMP team of p.num_threads (0: omp_get_max_threads()) when the library is built
// with OpenMP and n is large enough to repay the fork.
#pragma once

#include <cstdint>

namespace deepspeed::optim {

// Which 16-bit format the fused copy of the updated param is written in.
enum class Half16Kind { BF16, FP16 };

struct AdamStepParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = true;       // true: decoupled decay (AdamW); false: L2 added to the grad (Adam)
  bool bias_correction = true;  // false: bc1 = bc2 = 1 (DeepSpeed's "bias_correction": false)
  int64_t step = 1;             // 1-based count of this step. REQUIRES: >= 1 if bias_correction
  float grad_scale = 1.0f;      // grad is multiplied by this first (1/loss_scale, clip coefficient)
  int num_threads = 0;          // OpenMP threads for this call; 0: omp_get_max_threads()
};

// Updates param, exp_avg, exp_avg_sq in place. If param16 is not null, also writes the updated
// param there as bf16 or fp16 bits, rounded to nearest even (bf16 bit-identical to
// c10::BFloat16(float), NaN -> 0x7FC0; fp16 to c10::Half(float)).
// REQUIRES: n >= 0; the five buffers do not overlap (grad may not alias param).
// Throws std::invalid_argument for step < 1 with bias correction or n < 0.
void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStepParams& p, uint16_t* param16 = nullptr,
               Half16Kind kind = Half16Kind::BF16);

// adam_step with the gradients as bf16 bits: each thread widens its own chunks into a buffer that
// stays in its cache and runs the same kernel on them, so the result is adam_step's on the
// widened gradients bit for bit (widening bf16 is exact), without a separate pass writing and
// reading fp32 gradients through memory (ZeRO-Offload's bf16 gradient partition).
void adam_step_bf16_grad(float* param, const uint16_t* grad_bf16, float* exp_avg,
                         float* exp_avg_sq, int64_t n, const AdamStepParams& p,
                         uint16_t* param16 = nullptr, Half16Kind kind = Half16Kind::BF16);

// The formats the update's buffers can be stored in.
enum class AdamElem { F32, BF16, FP16 };

// Where the update's per-element state lives: the master weights and the two moments, each in a
// format. fp32 throughout is adam_step's case. Masters in 16 bits (DeepSpeed's
// fp16.fp16_master_weights_and_grads, bf16.bf16_master_weights_and_grads) and moments in bf16
// (bf16.bf16_optimizer_states) cost 2 bytes per element instead of 4.
struct AdamBuffers {
  void* param = nullptr;
  AdamElem param_format = AdamElem::F32;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  AdamElem moment_format = AdamElem::F32;  // F32 or BF16
  // The same buffers from element k on.
  AdamBuffers at(int64_t k) const;
};

// adam_step over buffers in any formats, with gradients as fp32, bf16 or fp16 bits. Each thread
// widens a block of its elements into fp32 arrays that stay in its cache, runs adam_step's kernel
// on them and rounds what it updated back into 16-bit buffers (to nearest even), so the result is
// adam_step's on the widened values, rounded (widening is exact): with fp32 buffers and fp32
// gradients it is adam_step itself, bit for bit. No extra pass over memory, no temporary buffer.
// copy16: as adam_step's param16, the updated masters' 16-bit values in `copy_kind` (when the
// masters are 16-bit in that format, their own bits; in the other format, the fp32 update
// rounded to it). REQUIRES: n >= 0; no buffer overlaps another.
void adam_step_buffers(const AdamBuffers& b, const void* grad, AdamElem grad_format, int64_t n,
                       const AdamStepParams& p, uint16_t* copy16 = nullptr,
                       Half16Kind copy_kind = Half16Kind::BF16);

// The AdamElem of a 16-bit kind.
inline AdamElem elem_of(Half16Kind kind) {
  return kind == Half16Kind::FP16 ? AdamElem::FP16 : AdamElem::BF16;
}

// Instruction-set paths of the kernel. All give bit-identical results.
enum class AdamIsa { Scalar, Avx2, Avx512 };

// The path adam_step uses now: "avx512", "avx2" or "scalar" (for logs and benchmarks).
const char* adam_kernel_isa();

// Whether this CPU can run the given path (Avx2 needs AVX2+FMA+F16C, Avx512 needs AVX512F).
bool adam_isa_supported(AdamIsa isa);

// Forces a path (tests, benchmarks); reset_adam_isa() returns to the best supported one.
// The env var DS_ADAM_ISA=scalar|avx2|avx512 does the same at first use.
// Not thread-safe against concurrent adam_step calls. Throws std::invalid_argument for a path
// this CPU cannot run.
void set_adam_isa(AdamIsa isa);
void reset_adam_isa();

}  // namespace deepspeed::optim
