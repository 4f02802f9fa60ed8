#include "optim/compressed_allreduce.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace optim {
namespace {

// Bit weights of one packed byte, most significant first (numpy.packbits' order).
at::Tensor bit_weights(c10::Device device) {
  return torch::tensor({128, 64, 32, 16, 8, 4, 2, 1}, torch::kUInt8).to(device);
}

// `weights`: bit_weights() on the tensor's device (made once by a caller that packs often: on a
// GPU each one is a copy from pageable host memory, which waits for the stream).
at::Tensor pack_signs_with(const at::Tensor& x, const at::Tensor& weights) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(n % 8 == 0, "pack_signs: last dimension ", n, " is not a multiple of 8");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n / 8;
  shape.push_back(8);
  at::Tensor bits = x.ge(0).to(torch::kUInt8).reshape(shape);
  return bits.mul(weights).sum(-1).to(torch::kUInt8);
}

at::Tensor unpack_signs_with(const at::Tensor& bytes, const at::Tensor& weights) {
  at::Tensor set = bytes.unsqueeze(-1).bitwise_and(weights).ne(0);
  std::vector<int64_t> shape = bytes.sizes().vec();
  shape.back() *= 8;
  return set.to(torch::kFloat).mul_(2).sub_(1).reshape(shape);
}

// The fp32 scales at byte columns [begin, begin + 4p) of a [W, msg] message, as [W, p]. Copied
// into a buffer of their own: a view of bytes as floats needs its start and row stride divisible
// by 4, and with one row (world size 1) libtorch takes the column slice as contiguous, so
// contiguous() would return the slice itself, starting at the signs' byte count.
at::Tensor scale_columns(const at::Tensor& message, int64_t begin, int64_t p) {
  const at::Tensor bytes = message.narrow(1, begin, 4 * p);
  return at::empty(bytes.sizes(), bytes.options()).copy_(bytes).view(at::kFloat);
}

}  // namespace

at::Tensor pack_signs(const at::Tensor& x) { return pack_signs_with(x, bit_weights(x.device())); }

at::Tensor unpack_signs(const at::Tensor& bytes) {
  return unpack_signs_with(bytes, bit_weights(bytes.device()));
}

CompressedAllReduce::CompressedAllReduce(comm::CommunicatorPtr comm, std::vector<int64_t> numels,
                                         c10::Device device)
    : comm_(std::move(comm)),
      numels_(std::move(numels)),
      // With its index ("cuda" is "cuda:<current>"): run() compares the tensors' devices with it.
      device_(at::empty({0}, at::TensorOptions().device(device)).device()) {
  const int64_t w = comm_->world_size();
  for (size_t i = 0; i < numels_.size(); ++i) {
    const int64_t unit = 8 * w;
    const int64_t padded = (numels_[i] + unit - 1) / unit * unit;
    chunk_.push_back(padded / w);
    offset_.push_back(row_);
    row_ += chunk_.back();
  }
  chunk_sizes_ = torch::tensor(chunk_, torch::kLong).to(device_);
  bit_weights_ = bit_weights(device_);
  reset_errors();
}

void CompressedAllReduce::reset_errors() {
  const auto fp32 = torch::dtype(torch::kFloat).device(device_);
  worker_error_ = torch::zeros({comm_->world_size(), row_}, fp32);
  server_error_ = torch::zeros({row_}, fp32);
}

void CompressedAllReduce::save_errors(ExtraState& out) const {
  out.per_rank["worker_error"] = worker_error_;
  out.per_rank["server_error"] = server_error_;
}

void CompressedAllReduce::restore_errors(const ExtraState& saved) {
  auto worker = saved.per_rank.find("worker_error"), server = saved.per_rank.find("server_error");
  if (worker == saved.per_rank.end() || server == saved.per_rank.end()) {
    reset_errors();
    return;
  }
  TORCH_CHECK(worker->second.sizes() == worker_error_.sizes(), "saved worker_error has shape ",
              worker->second.sizes(), ", this optimizer's is ", worker_error_.sizes());
  TORCH_CHECK(server->second.sizes() == server_error_.sizes(), "saved server_error has shape ",
              server->second.sizes(), ", this optimizer's is ", server_error_.sizes());
  worker_error_.copy_(worker->second);
  server_error_.copy_(server->second);
}

std::unique_ptr<CompressedAllReduce> compressor_for(comm::CommunicatorPtr comm,
                                                    const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> numels;
  for (const auto& t : tensors) numels.push_back(t.numel());
  const c10::Device device = tensors.empty() ? c10::Device(c10::kCPU) : tensors.front().device();
  return std::make_unique<CompressedAllReduce>(std::move(comm), std::move(numels), device);
}

namespace {

// The loops below are branch-free (a sign is 2·bit - 1, and scale·(±1) is exact) so the compiler
// vectorises them; n is always a multiple of 8 (chunks are).

// x[0, n) -> packed signs in out[0, n/8); x becomes x - scale·sign(x).
void compress_in_place(float* x, int64_t n, float scale, uint8_t* out) {
  for (int64_t j = 0; j < n / 8; ++j) {
    float* y = x + 8 * j;
    uint32_t byte = 0;
    for (int b = 0; b < 8; ++b) {
      const uint32_t pos = y[b] >= 0.0f;
      byte |= pos << (7 - b);
      y[b] -= scale * (2.0f * static_cast<float>(pos) - 1.0f);
    }
    out[j] = static_cast<uint8_t>(byte);
  }
}

// out[0, n) (+)= scale·sign for the n bits of `bits`.
template <bool kAdd>
void expand_signs(const uint8_t* bits, int64_t n, float scale, float* out) {
  for (int64_t j = 0; j < n / 8; ++j) {
    const uint32_t byte = bits[j];
    for (int b = 0; b < 8; ++b) {
      const float v = scale * (2.0f * static_cast<float>((byte >> (7 - b)) & 1u) - 1.0f);
      if (kAdd)
        out[8 * j + b] += v;
      else
        out[8 * j + b] = v;
    }
  }
}

// Σ x², in fp32 lanes over blocks of 4096 elements, the blocks summed in fp64.
double squares(const float* x, int64_t n) {
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += 4096) {
    const int64_t end = std::min(n, begin + 4096);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = begin;
    for (; k + 8 <= end; k += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += x[k + l] * x[k + l];
    for (; k < end; ++k) lanes[0] += x[k] * x[k];
    for (float l : lanes) total += l;
  }
  return total;
}

float rms(double squares, int64_t count) {
  return count > 0 ? static_cast<float>(std::sqrt(squares / static_cast<double>(count))) : 0.0f;
}

}  // namespace

void CompressedAllReduce::check_tensors(const std::vector<at::Tensor>& tensors) const {
  TORCH_CHECK(tensors.size() == numels_.size(), "CompressedAllReduce::run: ", tensors.size(),
              " tensors, built for ", numels_.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    TORCH_CHECK(tensors[i].numel() == numels_[i] && tensors[i].scalar_type() == at::kFloat &&
                    tensors[i].is_contiguous() && tensors[i].device() == device_,
                "CompressedAllReduce::run: tensor ", i, " must be a contiguous fp32 tensor of ",
                numels_[i], " elements on ", device_, " (it is ", tensors[i].scalar_type(), ", ",
                tensors[i].numel(), " elements on ", tensors[i].device(), ")");
}

void CompressedAllReduce::run(const std::vector<at::Tensor>& tensors) {
  if (device_.is_cpu())
    run_host_loops(tensors);
  else
    run_with_tensor_ops(tensors);
}

// The arithmetic runs as plain loops over the row buffers (one pass each for compensation,
// norms, and sign/pack/error), which on one CPU core is several times faster than the same
// steps as tensor operations; the message layout is the one pack_signs() documents.
void CompressedAllReduce::run_host_loops(const std::vector<at::Tensor>& tensors) {
  check_tensors(tensors);
  torch::NoGradGuard no_grad;
  const int64_t w = comm_->world_size(), s = row_;
  const size_t p = numels_.size();
  const int64_t sign_bytes = s / 8, msg = sign_bytes + 4 * static_cast<int64_t>(p);

  // Worker: b = x + worker_error, built in the error buffer itself (row r, chunk r of each
  // tensor; zero padding past its end).
  float* b = worker_error_.data_ptr<float>();
  std::vector<float> scale(p);
  for (size_t i = 0; i < p; ++i) {
    const float* x = tensors[i].data_ptr<float>();
    double sq = 0;
    for (int64_t r = 0; r < w; ++r) {
      float* row = b + r * s + offset_[i];
      const int64_t begin = r * chunk_[i];
      const int64_t have = std::max<int64_t>(0, std::min(chunk_[i], numels_[i] - begin));
      for (int64_t k = 0; k < have; ++k) row[k] += x[begin + k];
      sq += squares(row, chunk_[i]);
    }
    scale[i] = rms(sq, w * chunk_[i]);  // ‖b_i‖ / sqrt(C_i)
  }
  at::Tensor send = torch::empty({w, msg}, torch::kUInt8);
  uint8_t* out = send.data_ptr<uint8_t>();
  for (int64_t r = 0; r < w; ++r) {
    for (size_t i = 0; i < p; ++i)
      compress_in_place(b + r * s + offset_[i], chunk_[i], scale[i],
                        out + r * msg + offset_[i] / 8);
    std::memcpy(out + r * msg + sign_bytes, scale.data(), 4 * p);
  }

  // Phase 1: row r to server r.
  at::Tensor recv = torch::empty({w, msg}, torch::kUInt8);
  comm_->all_to_all(recv, send)->wait();

  // Server: a = Σ_w scale_w/W · sign_w + server_error, then compress again; the server error
  // buffer becomes a and then a - sscale·sign(a).
  const uint8_t* in = recv.data_ptr<uint8_t>();
  at::Tensor avg = torch::zeros({s}, torch::kFloat);
  float* a = avg.data_ptr<float>();
  for (int64_t v = 0; v < w; ++v) {
    std::vector<float> their(p);
    std::memcpy(their.data(), in + v * msg + sign_bytes, 4 * p);
    const uint8_t* bits = in + v * msg;
    for (size_t i = 0; i < p; ++i) {
      const float sv = their[i] * (1.0f / static_cast<float>(w));
      expand_signs<true>(bits + offset_[i] / 8, chunk_[i], sv, a + offset_[i]);
    }
  }
  float* e = server_error_.data_ptr<float>();
  for (int64_t k = 0; k < s; ++k) e[k] += a[k];
  at::Tensor mine = torch::empty({msg}, torch::kUInt8);
  uint8_t* mine_bytes = mine.data_ptr<uint8_t>();
  std::vector<float> sscale(p);
  for (size_t i = 0; i < p; ++i) {
    sscale[i] = rms(squares(e + offset_[i], chunk_[i]), chunk_[i]);  // ‖a_i‖ / sqrt(c_i)
    compress_in_place(e + offset_[i], chunk_[i], sscale[i], mine_bytes + offset_[i] / 8);
  }
  std::memcpy(mine_bytes + sign_bytes, sscale.data(), 4 * p);

  // Phase 2: every server's compressed chunks to everyone; decode straight into the tensors.
  at::Tensor all = torch::empty({w * msg}, torch::kUInt8);
  comm_->all_gather(all, mine)->wait();
  const uint8_t* got = all.data_ptr<uint8_t>();
  for (int64_t r = 0; r < w; ++r) {
    std::vector<float> theirs(p);
    std::memcpy(theirs.data(), got + r * msg + sign_bytes, 4 * p);
    for (size_t i = 0; i < p; ++i) {
      float* x = tensors[i].data_ptr<float>();
      const int64_t begin = r * chunk_[i];
      const int64_t have = std::max<int64_t>(0, std::min(chunk_[i], numels_[i] - begin));
      const uint8_t* bits = got + r * msg + offset_[i] / 8;
      const int64_t whole = have / 8 * 8;  // full bytes straight into the tensor
      expand_signs<false>(bits, whole, theirs[i], x + begin);
      for (int64_t k = whole; k < have; ++k)
        x[begin + k] = theirs[i] * (2.0f * static_cast<float>((bits[k / 8] >> (7 - k % 8)) & 1u) - 1.0f);
    }
  }
}

at::Tensor CompressedAllReduce::per_element(const at::Tensor& scales) const {
  return at::repeat_interleave(scales, chunk_sizes_, scales.dim() - 1, row_);
}

// Σ x² of each tensor's chunks: fp32 squares (as the loops) summed in fp64, one reduction per
// tensor (a segment sum over a whole row would lose a small tensor's sum beside a large one's).
// An empty tensor's chunks (0 elements) have scale 0, as rms() gives the loops.
at::Tensor CompressedAllReduce::scales_of(const at::Tensor& rows) const {
  std::vector<at::Tensor> sums;
  for (size_t i = 0; i < numels_.size(); ++i)
    sums.push_back(at::sum(rows.narrow(1, offset_[i], chunk_[i]).square(), at::kDouble));
  at::Tensor counts =
      chunk_sizes_.to(at::kDouble).mul_(static_cast<double>(rows.size(0))).clamp_min_(1);
  return at::stack(sums).div_(counts).sqrt_().to(at::kFloat);  // ‖·‖ / sqrt(count)
}

// Row by row (the temporaries are a row's, not the buffer's): rows[r] -= scale·sign(rows[r])
// (sign(0) = +1; scale·(±1) is exact, as in the loops); returns the signs packed, taken before.
at::Tensor CompressedAllReduce::compress_rows(at::Tensor& rows, const at::Tensor& scales) const {
  at::Tensor scale = per_element(scales), minus = scale.neg();
  std::vector<at::Tensor> packed;
  for (int64_t r = 0; r < rows.size(0); ++r) {
    at::Tensor row = rows[r];
    packed.push_back(pack_signs_with(row, bit_weights_));
    row.sub_(at::where(row.ge(0), scale, minus));
  }
  return at::stack(packed);
}

// The loops' steps as tensor operations, no host wait: everything stays on the device, the scales
// too (their bytes go into the messages as a view of them). Temporaries are one row's (S
// elements) at a time, but for the decoded result of phase 2 ([W, S] fp32: the size of the
// momentum) from which each tensor takes its chunks in one copy.
void CompressedAllReduce::run_with_tensor_ops(const std::vector<at::Tensor>& tensors) {
  check_tensors(tensors);
  if (numels_.empty()) return;
  torch::NoGradGuard no_grad;
  const int64_t w = comm_->world_size(), s = row_;
  const int64_t p = static_cast<int64_t>(numels_.size()), msg = s / 8 + 4 * p;
  const auto bytes = torch::dtype(torch::kUInt8).device(device_);

  // Worker: b = x + worker_error in the error buffer, row r holding chunk r of each tensor.
  at::Tensor& b = worker_error_;
  for (int64_t i = 0; i < p; ++i) {
    at::Tensor x = tensors[i].reshape({-1});
    const int64_t padded = w * chunk_[i];
    if (padded != numels_[i]) x = at::constant_pad_nd(x, {0, padded - numels_[i]});
    b.narrow(1, offset_[i], chunk_[i]).add_(x.view({w, chunk_[i]}));
  }
  at::Tensor scales = scales_of(b);  // ‖b_i‖ / sqrt(C_i)
  at::Tensor send =
      at::cat({compress_rows(b, scales), scales.view(at::kByte).unsqueeze(0).expand({w, 4 * p})}, 1);

  // Phase 1: row r to server r.
  at::Tensor recv = torch::empty({w, msg}, bytes);
  comm_->all_to_all(recv, send)->wait();

  // Server: a = Σ_v scale_v/W · sign_v (summed in the loops' order) + server_error.
  at::Tensor their = scale_columns(recv, s / 8, p);  // [W, p]
  at::Tensor shares = their.mul(1.0f / static_cast<float>(w));
  at::Tensor a;
  for (int64_t v = 0; v < w; ++v) {
    at::Tensor term = unpack_signs_with(recv[v].narrow(0, 0, s / 8), bit_weights_)
                          .mul_(per_element(shares[v]));
    if (v == 0)
      a = term;
    else
      a.add_(term);
  }
  server_error_.add_(a);
  at::Tensor e = server_error_.view({1, s});
  at::Tensor sscales = scales_of(e);  // ‖a_i‖ / sqrt(c_i)
  at::Tensor mine = at::cat({compress_rows(e, sscales).view({-1}), sscales.view(at::kByte)});

  // Phase 2: every server's compressed chunks to everyone; decode into the tensors.
  at::Tensor all = torch::empty({w * msg}, bytes);
  comm_->all_gather(all, mine)->wait();
  at::Tensor got = all.view({w, msg});
  at::Tensor sent_scales = scale_columns(got, s / 8, p);  // [W, p]
  at::Tensor values = torch::empty({w, s}, torch::dtype(torch::kFloat).device(device_));
  for (int64_t r = 0; r < w; ++r) {
    at::Tensor out = values[r];
    at::mul_out(out, unpack_signs_with(got[r].narrow(0, 0, s / 8), bit_weights_),
                per_element(sent_scales[r]));
  }
  for (int64_t i = 0; i < p; ++i)
    tensors[i].view({-1}).copy_(
        values.narrow(1, offset_[i], chunk_[i]).reshape({-1}).narrow(0, 0, numels_[i]));
}

}  // namespace optim
}  // namespace deepspeed
