#include "offload/swapped_adam.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"

namespace deepspeed::offload {
namespace {

// The three arrays of a sub-group start on 64-byte boundaries inside its buffer.
constexpr int64_t kArrayAlignment = 64;

int64_t bytes_of(optim::AdamElem format) { return format == optim::AdamElem::F32 ? 4 : 2; }

at::ScalarType dtype_of(optim::AdamElem format) {
  switch (format) {
    case optim::AdamElem::F32: return at::kFloat;
    case optim::AdamElem::BF16: return at::kBFloat16;
    case optim::AdamElem::FP16: return at::kHalf;
  }
  return at::kFloat;
}

// The update reads these gradient dtypes as they are; any other is widened first.
bool readable_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

optim::AdamElem elem_of(at::ScalarType t) {
  return t == at::kBFloat16 ? optim::AdamElem::BF16
         : t == at::kHalf   ? optim::AdamElem::FP16
                            : optim::AdamElem::F32;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

SwappedAdam::SwappedAdam(const at::Tensor& initial_master, SwapOptions options)
    : SwappedAdam(
          initial_master.numel(),
          [flat = initial_master.reshape({-1})](int64_t begin, int64_t n) { return flat.narrow(0, begin, n); },
          std::move(options)) {}

SwappedAdam::SwappedAdam(int64_t numel, const GroupSource& initial_master, SwapOptions options)
    : numel_(numel), options_(std::move(options)), queue_(options_.aio) {
  if (options_.sub_group_size < 1)
    throw ConfigError(fmt::format("zero_optimization.sub_group_size must be >= 1, got {}",
                                  options_.sub_group_size));
  if (options_.buffer_count < 1)
    throw ConfigError(fmt::format(
        "zero_optimization.offload_optimizer.buffer_count must be >= 1 with device \"nvme\", "
        "got {}",
        options_.buffer_count));
  TORCH_CHECK(options_.moment_format != optim::AdamElem::FP16,
              "SwappedAdam: moments in fp32 or bf16, not fp16");
  file_ = create_swap_file(options_.dir, "offload_optimizer.nvme_path", "optimizer_swap");
  path_ = file_->path();
  make_groups();
  const int buffers = static_cast<int>(std::min<int64_t>(options_.buffer_count, groups_.size()));
  int64_t max_bytes = 0;
  for (auto& g : groups_) {
    max_bytes = std::max(max_bytes, g.bytes);
    max_group_numel_ = std::max(max_group_numel_, g.numel);
  }
  for (int b = 0; b < buffers; ++b) ring_.emplace_back(max_bytes);
  if (options_.device_gradients) grad_landing_ = AlignedBuffer(max_group_numel_ * 4);
  torch::NoGradGuard no_grad;
  for (int64_t k = 0; k < static_cast<int64_t>(groups_.size()); ++k) {
    const Group& g = groups_[k];
    void* buf = ring_[0].data();
    std::memset(buf, 0, g.bytes);  // zero moments (0 in bf16 too)
    fill(k, buf, initial_master(g.begin, g.numel), 0);
    queue_.wait(queue_.write(*file_, g.offset, buf, g.bytes));
  }
}

void SwappedAdam::make_groups() {
  auto& cuts = options_.groups;
  if (cuts.empty()) {
    const int64_t size = std::min<int64_t>(options_.sub_group_size, std::max<int64_t>(numel_, 1));
    for (int64_t begin = 0; begin < numel_; begin += size)
      cuts.emplace_back(begin, std::min(size, numel_ - begin));
  }
  int64_t offset = 0, expected = 0;
  for (auto [begin, numel] : cuts) {
    TORCH_CHECK(begin == expected && numel > 0, "SwappedAdam: sub-groups must tile [0, ", numel_,
                ") in order; got one at ", begin, " of ", numel, " elements");
    Group g;
    g.begin = begin;
    g.numel = numel;
    g.offset = offset;
    const int64_t master_bytes =
        round_up(numel * bytes_of(options_.master_format), kArrayAlignment);
    const int64_t moment_bytes =
        round_up(numel * bytes_of(options_.moment_format), kArrayAlignment);
    g.at = {0, master_bytes, master_bytes + moment_bytes};
    g.bytes = round_up(master_bytes + 2 * moment_bytes, kDirectIoAlignment);
    offset += g.bytes;
    expected = begin + numel;
    groups_.push_back(g);
  }
  TORCH_CHECK(expected == numel_, "SwappedAdam: sub-groups cover ", expected, " of ", numel_, " elements");
}

SwappedAdam::~SwappedAdam() {
  try {
    queue_.wait_all();
  } catch (...) {
  }
}

at::Tensor SwappedAdam::view(void* base, const Group& g, int which) const {
  const optim::AdamElem format = which == 0 ? options_.master_format : options_.moment_format;
  return at::from_blob(static_cast<char*>(base) + g.at[which], {g.numel}, dtype_of(format));
}

optim::AdamBuffers SwappedAdam::buffers(void* base, const Group& g) const {
  char* bytes = static_cast<char*>(base);
  optim::AdamBuffers b;
  b.param = bytes + g.at[0];
  b.param_format = options_.master_format;
  b.exp_avg = bytes + g.at[1];
  b.exp_avg_sq = bytes + g.at[2];
  b.moment_format = options_.moment_format;
  return b;
}

int64_t SwappedAdam::resident_bytes() const {
  int64_t total = grad_landing_.bytes();
  for (auto& b : ring_) total += b.bytes();
  return total;
}

int64_t SwappedAdam::file_bytes() const {
  return groups_.empty() ? 0 : groups_.back().offset + groups_.back().bytes;
}

bool SwappedAdam::direct_io() const { return file_->direct(); }

namespace {
// The output is one tensor in memory.
class TensorSink : public ParamSink {
 public:
  explicit TensorSink(at::Tensor out) : out_(std::move(out)) {}
  void* begin_group(int64_t begin, int64_t) override {
    return static_cast<char*>(out_.data_ptr()) + begin * out_.element_size();
  }
  void end_group(int64_t, int64_t) override {}

 private:
  at::Tensor out_;
};

// The gradients are one tensor in memory.
class TensorGrads : public GradSource {
 public:
  explicit TensorGrads(const at::Tensor& grad) : grad_(grad.reshape({-1})) {}
  at::Tensor get(int64_t begin, int64_t numel) override { return grad_.narrow(0, begin, numel); }

 private:
  at::Tensor grad_;
};
}  // namespace

void SwappedAdam::step(const at::Tensor& grad, at::Tensor param_out,
                       const optim::AdamStepParams& hp) {
  groups_updated_ = 0;  // (as the checks below may throw)
  TORCH_CHECK(param_out.numel() == numel_ && param_out.is_contiguous(),
              "SwappedAdam::step: param_out must be contiguous with ", numel_, " elements");
  TensorSink sink(param_out);
  step(grad, sink, param_out.scalar_type(), hp);
}

void SwappedAdam::step(const at::Tensor& grad, ParamSink& sink, at::ScalarType out_dtype,
                       const optim::AdamStepParams& hp) {
  step(grad, sink, out_dtype, std::vector<optim::AdamHyperRun>{{0, numel_, hp}});
}

void SwappedAdam::step(GradSource& grads, ParamSink& sink, at::ScalarType out_dtype,
                       const optim::AdamStepParams& hp) {
  step(grads, sink, out_dtype, std::vector<optim::AdamHyperRun>{{0, numel_, hp}});
}

void SwappedAdam::step(const at::Tensor& grad, ParamSink& sink, at::ScalarType out_dtype,
                       const std::vector<optim::AdamHyperRun>& runs) {
  groups_updated_ = 0;
  TORCH_CHECK(grad.numel() == numel_, "SwappedAdam::step: grad must have ", numel_, " elements");
  TensorGrads grads(grad);
  step(grads, sink, out_dtype, runs);
}

void SwappedAdam::step(GradSource& grads, ParamSink& sink, at::ScalarType out_dtype,
                       const std::vector<optim::AdamHyperRun>& runs) {
  groups_updated_ = 0;
  int64_t covered = 0;  // checked before any sub-group changes
  for (const auto& r : runs) {
    TORCH_CHECK(r.begin == covered && r.numel >= 0, "SwappedAdam::step: the runs of "
                "hyper-parameters must cover the partition in order; one begins at ", r.begin,
                " where element ", covered, " was next");
    covered += r.numel;
  }
  TORCH_CHECK(covered == numel_, "SwappedAdam::step: the runs of hyper-parameters cover ", covered,
              " of ", numel_, " elements");
  TORCH_CHECK(out_dtype == torch::kFloat || out_dtype == torch::kBFloat16 || out_dtype == torch::kHalf,
              "SwappedAdam::step: output dtype must be fp32, bf16 or fp16");
  const int64_t G = static_cast<int64_t>(groups_.size());
  const int B = static_cast<int>(ring_.size());
  std::vector<AioQueue::Ticket> reading(B, -1), writing(B, -1);
  auto wait_write = [&](int b) {
    if (writing[b] < 0) return;
    auto t0 = std::chrono::steady_clock::now();
    queue_.wait(writing[b]);
    stats_.seconds_waiting_write += seconds_since(t0);
    writing[b] = -1;
  };
  int64_t next_read = 0;
  auto issue_read = [&]() {
    const int b = static_cast<int>(next_read % B);
    wait_write(b);  // the buffer still holds the previous sub-group on its way out
    const Group& g = groups_[next_read];
    reading[b] = queue_.read(*file_, g.offset, ring_[b].data(), g.bytes);
    grads.prefetch(g.begin, g.numel);
    ++next_read;
  };
  const bool fp32_out = out_dtype == torch::kFloat;
  group_in_buffer_ = -1;
  const auto kind = out_dtype == torch::kHalf ? optim::Half16Kind::FP16 : optim::Half16Kind::BF16;
  try {
    for (int64_t k = 0; k < G; ++k) {
      while (next_read <= k) issue_read();
      const int b = static_cast<int>(k % B);
      auto t0 = std::chrono::steady_clock::now();
      queue_.wait(reading[b]);
      stats_.seconds_waiting_read += seconds_since(t0);

      t0 = std::chrono::steady_clock::now();
      const Group& g = groups_[k];
      void* base = ring_[b].data();
      const at::Tensor grad = grads.get(g.begin, g.numel);
      TORCH_CHECK(grad.numel() == g.numel, "SwappedAdam::step: the gradient source gave ",
                  grad.numel(), " elements for a sub-group of ", g.numel);
      const auto [gptr, gformat] = readable_grads(grad, g);
      void* out = sink.begin_group(g.begin, g.numel);
      uint16_t* half = fp32_out ? nullptr : static_cast<uint16_t*>(out);
      ++groups_updated_;  // from here the parameters and the buffer hold the new values
      optim::adam_step_runs(runs, buffers(base, g), gptr, gformat, g.begin, g.numel, half, kind);
      if (fp32_out) at::from_blob(out, {g.numel}, at::kFloat).copy_(view(base, g, 0));
      sink.end_group(g.begin, g.numel);
      grads.release(g.begin, g.numel);
      stats_.seconds_updating += seconds_since(t0);

      writing[b] = queue_.write(*file_, g.offset, ring_[b].data(), g.bytes);
      // Keep B-1 sub-groups ahead: the read of k + B - 1 reuses the buffer of k - 1.
      while (next_read < std::min<int64_t>(G, k + B)) issue_read();
    }
    for (int b = 0; b < B; ++b) wait_write(b);
    sink.finish();
  } catch (...) {
    try {
      queue_.wait_all();
    } catch (...) {
    }
    throw;
  }
  stats_.bytes_read = queue_.bytes_read();
  stats_.bytes_written = queue_.bytes_written();
}

// Host gradients of a dtype the update reads are read where they are (in device memory they
// are copied down first: stages 1 and 2 keep the gradient partition on a GPU when the optimizer
// is swapped). Before the sub-group counts as updated: a failed allocation here leaves it clean.
std::pair<const void*, optim::AdamElem> SwappedAdam::readable_grads(const at::Tensor& grad,
                                                                    const Group& g) {
  if (grad.is_cpu() && grad.is_contiguous() && readable_dtype(grad.scalar_type()))
    return {grad.data_ptr(), elem_of(grad.scalar_type())};
  if (grad_landing_.bytes() == 0) grad_landing_ = AlignedBuffer(max_group_numel_ * 4);
  const at::ScalarType dtype = readable_dtype(grad.scalar_type()) ? grad.scalar_type() : at::kFloat;
  at::from_blob(grad_landing_.data(), {g.numel}, dtype).copy_(grad);
  return {grad_landing_.data(), elem_of(dtype)};
}

void SwappedAdam::fill(int64_t group, void* base, const at::Tensor& source, int which) const {
  const Group& g = groups_[group];
  TORCH_CHECK(source.numel() == g.numel, "SwappedAdam: sub-group source has ", source.numel(),
              " elements, expected ", g.numel);
  view(base, g, which).copy_(source.reshape({-1}));
}

void SwappedAdam::rewrite_groups(const std::function<void(const Group&, void* base)>& edit) {
  torch::NoGradGuard no_grad;
  group_in_buffer_ = -1;
  for (const Group& g : groups_) {
    void* buf = ring_[0].data();
    queue_.wait(queue_.read(*file_, g.offset, buf, g.bytes));
    edit(g, buf);
    queue_.wait(queue_.write(*file_, g.offset, buf, g.bytes));
  }
}

void SwappedAdam::write_state(const at::Tensor& master, const at::Tensor& exp_avg,
                              const at::Tensor& exp_avg_sq) {
  for (auto* t : {&master, &exp_avg, &exp_avg_sq})
    TORCH_CHECK(t->numel() == numel_, "SwappedAdam::write_state: expected ", numel_,
                " elements, got ", t->numel());
  group_in_buffer_ = -1;
  for (int64_t k = 0; k < static_cast<int64_t>(groups_.size()); ++k) {
    const Group& g = groups_[k];
    void* buf = ring_[0].data();
    std::memset(buf, 0, g.bytes);
    int which = 0;
    for (auto* t : {&master, &exp_avg, &exp_avg_sq})
      fill(k, buf, t->reshape({-1}).narrow(0, g.begin, g.numel), which++);
    queue_.wait(queue_.write(*file_, g.offset, buf, g.bytes));
  }
}

void SwappedAdam::reset_masters(const GroupSource& source) {
  int64_t k = 0;
  rewrite_groups([&](const Group& g, void* base) { fill(k++, base, source(g.begin, g.numel), 0); });
}

void SwappedAdam::set_masters(int64_t begin, const at::Tensor& values) {
  const int64_t end = begin + values.numel();
  TORCH_CHECK(begin >= 0 && end <= numel_, "SwappedAdam::set_masters: [", begin, ", ", end,
              ") is outside the ", numel_, " elements");
  torch::NoGradGuard no_grad;
  const at::Tensor flat = values.reshape({-1});
  for (size_t k = 0; k < groups_.size(); ++k) {
    const Group& g = groups_[k];
    const int64_t lo = std::max(begin, g.begin), hi = std::min(end, g.begin + g.numel);
    if (hi <= lo) continue;
    auto state = read_group(k);
    state[0].narrow(0, lo - g.begin, hi - lo).copy_(flat.narrow(0, lo - begin, hi - lo));
    write_group(k);
  }
}

std::array<at::Tensor, 3> SwappedAdam::read_state() {
  group_in_buffer_ = -1;
  std::array<at::Tensor, 3> out{torch::empty({numel_}), torch::empty({numel_}),
                                torch::empty({numel_})};
  for (const Group& g : groups_) {
    void* buf = ring_[0].data();
    queue_.wait(queue_.read(*file_, g.offset, buf, g.bytes));
    for (int i = 0; i < 3; ++i) out[i].narrow(0, g.begin, g.numel).copy_(view(buf, g, i));
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> SwappedAdam::group_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Group& g : groups_) out.emplace_back(g.begin, g.numel);
  return out;
}

std::array<at::Tensor, 3> SwappedAdam::read_group(size_t k) {
  TORCH_CHECK(k < groups_.size(), "SwappedAdam::read_group: no sub-group ", k, " of ",
              groups_.size());
  const Group& g = groups_[k];
  void* buf = ring_[0].data();
  queue_.wait(queue_.read(*file_, g.offset, buf, g.bytes));
  group_in_buffer_ = static_cast<int64_t>(k);
  return {view(buf, g, 0), view(buf, g, 1), view(buf, g, 2)};
}

void SwappedAdam::write_group(size_t k) {
  TORCH_CHECK(group_in_buffer_ == static_cast<int64_t>(k), "SwappedAdam::write_group(", k,
              ") without read_group(", k, ") just before");
  const Group& g = groups_[k];
  queue_.wait(queue_.write(*file_, g.offset, ring_[0].data(), g.bytes));
}

void SwappedAdam::write_masters(ParamSink& sink, at::ScalarType dtype) {
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "SwappedAdam::write_masters: dtype must be fp32, bf16 or fp16");
  torch::NoGradGuard no_grad;
  group_in_buffer_ = -1;
  for (const Group& g : groups_) {
    void* buf = ring_[0].data();
    queue_.wait(queue_.read(*file_, g.offset, buf, g.bytes));
    void* out = sink.begin_group(g.begin, g.numel);
    at::from_blob(out, {g.numel}, dtype).copy_(view(buf, g, 0));
    sink.end_group(g.begin, g.numel);
  }
  sink.finish();
}

}  // namespace deepspeed::offload
