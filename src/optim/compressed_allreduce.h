// The error-compensated 1-bit compressed all-reduce of 1-bit Adam (Tang et al. 2021; DeepSpeed's
// runtime/comm/nccl.py compressed_allreduce), for a list of fp32 tensors averaged in one go.
//
// Vocabulary: each tensor i of n_i elements is zero-padded to C_i, a multiple of 8·W (W ranks),
// and cut into W *chunks* of c_i = C_i/W elements; rank r is the *server* of chunk r of every
// tensor. A *row* r lays chunk r of tensor 0, chunk r of tensor 1, ... end to end: S = Σ c_i
// elements, a multiple of 8. The worker error has W rows ([W, S]); the server error one ([S]).
//
// Per call (COLLECTIVE, 2 collectives whatever the number of tensors):
//   worker:  b = x + worker_error                        (x: the tensors, padded, in rows)
//            scale_i = ‖b_i‖ / sqrt(C_i)                 (one scale per tensor and worker)
//            worker_error = b - scale_i·sign(b)          (sign(0) = +1, as DeepSpeed)
//   phase 1: all_to_all of rows: row r (its signs packed 8 per byte, most significant bit
//            first as numpy.packbits, then the W-independent scales as fp32 bytes) to rank r.
//   server:  a = Σ_w scale_{w,i}/W · sign_w + server_error   (this rank's row: its chunks)
//            sscale_i = ‖a_i‖ / sqrt(c_i)                (one scale per tensor chunk)
//            server_error = a - sscale_i·sign(a)
//   phase 2: all_gather of (packed sign(a), sscales); every rank decodes all rows and writes
//            sign·sscale back into the tensors (padding dropped).
// Bytes this rank puts on the wire, for n = Σ n_i elements: phase 1 ≈ (W-1)/W · n/8, phase 2
// (W-1)/W · n/8 (its chunk to each of the W-1 others), plus 4 bytes per tensor and message:
// 1/32 of a ring all-reduce's 2(W-1)/W · 4n. The communicator's counters (stats()) count the
// all-to-all's whole input and the all-gather's input, ≈ n/8 + n/(8W): (W+1)/(32W) of the 4n an
// fp32 all-reduce counts (3/64 at W = 2).
// Error feedback: what compression drops this call is added back the next, so the running sum
// of the results tracks the running sum of the true averages to within the current errors:
//   Σ_t out_t = Σ_t avg_w(x_{w,t}) - avg_w(worker_error_w) - server_error   (exactly, in reals).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "deepspeed/comm.h"
#include "optim/extra_state.h"

namespace deepspeed {
namespace optim {

class CompressedAllReduce {
 public:
  // `numels`: the element count of each tensor that run() will be given, in order. `device`:
  // where those tensors and so the error buffers live.
  CompressedAllReduce(comm::CommunicatorPtr comm, std::vector<int64_t> numels,
                      c10::Device device = c10::Device(c10::kCPU));

  // Replaces each tensor (contiguous fp32, numels[i] elements, on the device) by the compressed
  // average over ranks. COLLECTIVE; every rank passes tensors of the same sizes. In host memory
  // the arithmetic is plain loops; elsewhere (a GPU) run_with_tensor_ops.
  void run(const std::vector<at::Tensor>& tensors);
  // The same exchange as tensor operations, on any device, with no host wait: the same message
  // layout and arithmetic, except that each sum of squares (the scales) is summed in another
  // order (the loops: fp32 lanes of 4096-element blocks, ~1e-6 relative), so scales may differ
  // from run()'s in their last bits, and an element that close to zero may change sign. Public so
  // that a CPU test can hold it against run().
  void run_with_tensor_ops(const std::vector<at::Tensor>& tensors);
  // Forgets the error feedback.
  void reset_errors();
  // Checkpoints (extra_state.h): both buffers as per-rank state "worker_error", "server_error";
  // restore_errors takes them back when `saved` has them (same world size), else resets.
  // Throws c10::Error naming the buffer when a saved one's shape differs.
  void save_errors(ExtraState& out) const;
  void restore_errors(const ExtraState& saved);

  // Bytes of both error buffers: 4·(W + 1)·S (the per-call messages are freed after each run()).
  int64_t error_bytes() const { return storage_bytes_of({worker_error_, server_error_}); }
  const at::Tensor& worker_error() const { return worker_error_; }  // [W, S]
  const at::Tensor& server_error() const { return server_error_; }  // [S]
  int64_t row_numel() const { return row_; }                         // S
  int64_t chunk_numel(size_t i) const { return chunk_[i]; }          // c_i
  int64_t chunk_offset(size_t i) const { return offset_[i]; }        // where chunk i lies in a row

 private:
  void check_tensors(const std::vector<at::Tensor>& tensors) const;
  void run_host_loops(const std::vector<at::Tensor>& tensors);
  // Per tensor i, the root mean square of its chunks in `rows` ([k, S]; count k·c_i each), as an
  // fp32 tensor [n] on the device; and `rows` -= scale·sign(rows), returning its signs packed
  // [k, S/8].
  at::Tensor scales_of(const at::Tensor& rows) const;
  at::Tensor compress_rows(at::Tensor& rows, const at::Tensor& scales) const;
  // [.., n] scales -> [.., S]: each tensor's scale repeated over its chunk.
  at::Tensor per_element(const at::Tensor& scales) const;

  comm::CommunicatorPtr comm_;
  std::vector<int64_t> numels_, chunk_, offset_;
  int64_t row_ = 0;
  c10::Device device_;
  at::Tensor chunk_sizes_;  // int64 [n] on the device: c_i (per_element's repeats)
  at::Tensor bit_weights_;  // uint8 [8] on the device: 128, 64, ..., 1 (packing and unpacking)
  at::Tensor worker_error_, server_error_;
};

// A compressor for `tensors`' sizes, on their device (created on an optimizer's first compressed
// step, or when a checkpoint's error feedback is restored before it).
std::unique_ptr<CompressedAllReduce> compressor_for(comm::CommunicatorPtr comm,
                                                    const std::vector<at::Tensor>& tensors);

// Signs packed 8 per byte along the last dimension, most significant bit first: bit set for
// x >= 0. REQUIRES: the last dimension is a multiple of 8. Returns uint8 [..., n/8].
at::Tensor pack_signs(const at::Tensor& x);
// The inverse: uint8 [..., m] -> fp32 [..., 8m] of +1 (bit set) and -1.
at::Tensor unpack_signs(const at::Tensor& bytes);

}  // namespace optim
}  // namespace deepspeed
