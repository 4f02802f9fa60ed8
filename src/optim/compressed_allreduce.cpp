#include "optim/compressed_allreduce.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

namespace deepspeed {
namespace optim {
namespace {

// Bit weights of one packed byte, most significant first (numpy.packbits' order).
at::Tensor bit_weights() {
  return torch::tensor({128, 64, 32, 16, 8, 4, 2, 1}, torch::kUInt8);
}

// fp32 [n] -> its bytes, uint8 [4n]; and back.
at::Tensor float_bytes(const at::Tensor& f) {
  at::Tensor c = f.to(torch::kFloat).contiguous();
  at::Tensor out = torch::empty({c.numel() * 4}, torch::kUInt8);
  if (c.numel() > 0) std::memcpy(out.data_ptr(), c.data_ptr(), c.numel() * 4);
  return out;
}
at::Tensor bytes_float(const at::Tensor& b) {
  at::Tensor c = b.contiguous();
  at::Tensor out = torch::empty({c.numel() / 4}, torch::kFloat);
  if (c.numel() > 0) std::memcpy(out.data_ptr(), c.data_ptr(), c.numel());
  return out;
}

// ±1 with sign(0) = +1: DeepSpeed's x.sign().add_(1).bool() read as ±1.
at::Tensor signs_of(const at::Tensor& x) { return x.ge(0).to(torch::kFloat).mul_(2).sub_(1); }

}  // namespace

at::Tensor pack_signs(const at::Tensor& x) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(n % 8 == 0, "pack_signs: last dimension ", n, " is not a multiple of 8");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n / 8;
  shape.push_back(8);
  at::Tensor bits = x.ge(0).to(torch::kUInt8).reshape(shape);
  return bits.mul(bit_weights()).sum(-1).to(torch::kUInt8);
}

at::Tensor unpack_signs(const at::Tensor& bytes) {
  at::Tensor set = bytes.unsqueeze(-1).bitwise_and(bit_weights()).ne(0);
  std::vector<int64_t> shape = bytes.sizes().vec();
  shape.back() *= 8;
  return set.to(torch::kFloat).mul_(2).sub_(1).reshape(shape);
}

CompressedAllReduce::CompressedAllReduce(comm::CommunicatorPtr comm, std::vector<int64_t> numels)
    : comm_(std::move(comm)), numels_(std::move(numels)) {
  const int64_t w = comm_->world_size();
  std::vector<int64_t> owner;
  for (size_t i = 0; i < numels_.size(); ++i) {
    const int64_t unit = 8 * w;
    const int64_t padded = (numels_[i] + unit - 1) / unit * unit;
    chunk_.push_back(padded / w);
    offset_.push_back(row_);
    row_ += chunk_.back();
    owner.insert(owner.end(), chunk_.back(), static_cast<int64_t>(i));
  }
  segment_of_ = torch::tensor(owner, torch::kLong);
  reset_errors();
}

void CompressedAllReduce::reset_errors() {
  worker_error_ = torch::zeros({comm_->world_size(), row_}, torch::kFloat);
  server_error_ = torch::zeros({row_}, torch::kFloat);
}

at::Tensor CompressedAllReduce::to_rows(const std::vector<at::Tensor>& tensors) const {
  const int64_t w = comm_->world_size();
  at::Tensor rows = torch::empty({w, row_}, torch::kFloat);
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor flat = tensors[i].reshape({-1}).to(torch::kFloat);
    at::Tensor padded = torch::constant_pad_nd(flat, {0, w * chunk_[i] - numels_[i]}, 0);
    rows.narrow(1, offset_[i], chunk_[i]).copy_(padded.view({w, chunk_[i]}));
  }
  return rows;
}

// rows: [R, S] -> [R, P] when per_chunk (each row's chunk of tensor i over c_i), else [P] (the
// whole padded tensor i over C_i = W·c_i).
at::Tensor CompressedAllReduce::scales(const at::Tensor& rows, bool per_chunk) const {
  const int64_t p = static_cast<int64_t>(numels_.size());
  at::Tensor squares = rows.pow(2);
  if (!per_chunk) squares = squares.sum(0, /*keepdim=*/true);
  at::Tensor sums = torch::zeros({squares.size(0), p}, torch::kFloat)
                        .index_add_(1, segment_of_, squares);
  std::vector<float> counts(p);
  for (int64_t i = 0; i < p; ++i)
    counts[i] = static_cast<float>(std::max<int64_t>(1, chunk_[i] * (per_chunk ? 1 : rows.size(0))));
  at::Tensor result = sums.div_(torch::tensor(counts)).sqrt_();
  return per_chunk ? result : result.squeeze(0);
}

at::Tensor CompressedAllReduce::expand(const at::Tensor& s) const {
  return s.index_select(-1, segment_of_);
}

void CompressedAllReduce::run(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() == numels_.size(), "CompressedAllReduce::run: ", tensors.size(),
              " tensors, built for ", numels_.size());
  torch::NoGradGuard no_grad;
  const int64_t w = comm_->world_size();
  const int64_t p = static_cast<int64_t>(numels_.size());
  const int64_t sign_bytes = row_ / 8, msg = sign_bytes + 4 * p;

  // Worker: compensate, compress, keep what compression dropped.
  at::Tensor b = to_rows(tensors).add_(worker_error_);
  at::Tensor scale = scales(b, /*per_chunk=*/false);  // [P]
  worker_error_ = b - signs_of(b) * expand(scale);
  at::Tensor send = torch::empty({w, msg}, torch::kUInt8);
  send.narrow(1, 0, sign_bytes).copy_(pack_signs(b));
  send.narrow(1, sign_bytes, 4 * p).copy_(float_bytes(scale).unsqueeze(0).expand({w, 4 * p}));

  // Phase 1: row r to server r.
  at::Tensor recv = torch::empty({w, msg}, torch::kUInt8);
  comm_->all_to_all(recv, send)->wait();

  // Server: average this rank's chunks, compensate, compress again.
  at::Tensor worker_signs = unpack_signs(recv.narrow(1, 0, sign_bytes));            // [W, S]
  at::Tensor worker_scales = bytes_float(recv.narrow(1, sign_bytes, 4 * p)).view({w, p});
  at::Tensor a = (worker_signs * expand(worker_scales.mul(1.0 / w))).sum(0).add_(server_error_);
  at::Tensor sscale = scales(a.unsqueeze(0), /*per_chunk=*/true).squeeze(0);      // [P]
  server_error_ = a - signs_of(a) * expand(sscale);
  at::Tensor mine = torch::empty({msg}, torch::kUInt8);
  mine.narrow(0, 0, sign_bytes).copy_(pack_signs(a));
  mine.narrow(0, sign_bytes, 4 * p).copy_(float_bytes(sscale));

  // Phase 2: every server's compressed chunks to everyone.
  at::Tensor all = torch::empty({w * msg}, torch::kUInt8);
  comm_->all_gather(all, mine)->wait();
  all = all.view({w, msg});
  at::Tensor server_scales = bytes_float(all.narrow(1, sign_bytes, 4 * p)).view({w, p});
  at::Tensor rows = unpack_signs(all.narrow(1, 0, sign_bytes)).mul_(expand(server_scales));
  for (size_t i = 0; i < numels_.size(); ++i) {
    at::Tensor whole = rows.narrow(1, offset_[i], chunk_[i]).reshape({-1});
    tensors[i].view({-1}).copy_(whole.narrow(0, 0, numels_[i]));
  }
}

}  // namespace optim
}  // namespace deepspeed
