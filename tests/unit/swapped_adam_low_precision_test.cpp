// The NVMe optimizer swap with low-precision state (DeepSpeed's bf16/fp16_master_weights_and_grads,
// bf16_optimizer_states): a 16-bit master with fp32 or bf16 moments in the file. Each step must be
// bit for bit the in-memory update of the same formats (adam_step_buffers), the file and the
// buffers must hold 10 or 6 bytes an element instead of 12, and gradients in host memory must be
// read where they are, in their dtype, with no widened copy kept.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "offload/swapped_adam.h"
#include "support/files.h"

namespace swapped_adam_low_precision_test {

using deepspeed::offload::SwapOptions;
using deepspeed::offload::SwappedAdam;
using deepspeed::optim::AdamElem;

namespace {

deepspeed::optim::AdamStepParams hyper(int64_t step) {
  deepspeed::optim::AdamStepParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.step = step;
  hp.grad_scale = 0.5f;
  return hp;
}

at::ScalarType dtype_of(AdamElem e) {
  return e == AdamElem::F32 ? at::kFloat : e == AdamElem::BF16 ? at::kBFloat16 : at::kHalf;
}

SwapOptions options(const std::string& dir, int64_t sub_group, int buffers, AdamElem master,
                    AdamElem moments) {
  SwapOptions o;
  o.dir = dir;
  o.sub_group_size = sub_group;
  o.buffer_count = buffers;
  o.aio.block_size = 8192;
  o.aio.queue_depth = 4;
  o.master_format = master;
  o.moment_format = moments;
  return o;
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One sub-group's region: the three arrays on 64-byte boundaries, rounded up to 4096.
int64_t region_bytes(int64_t numel, int master_bytes, int moment_bytes) {
  return round_up(round_up(numel * master_bytes, 64) + 2 * round_up(numel * moment_bytes, 64),
                  4096);
}

// The in-memory reference: the same formats, stepped whole.
struct InMemory {
  at::Tensor master, exp_avg, exp_avg_sq;
  deepspeed::optim::AdamBuffers buffers() {
    deepspeed::optim::AdamBuffers b;
    b.param = master.data_ptr();
    b.param_format = master.scalar_type() == at::kFloat  ? AdamElem::F32
                     : master.scalar_type() == at::kHalf ? AdamElem::FP16
                                                         : AdamElem::BF16;
    b.exp_avg = exp_avg.data_ptr();
    b.exp_avg_sq = exp_avg_sq.data_ptr();
    b.moment_format = exp_avg.scalar_type() == at::kFloat ? AdamElem::F32 : AdamElem::BF16;
    return b;
  }
};

}  // namespace

struct Formats {
  AdamElem master, moments;
  int64_t sub_group;
  int buffers;
};

class SwappedLowPrecision : public ::testing::TestWithParam<Formats> {};

TEST_P(SwappedLowPrecision, BitForBitTheInMemoryUpdateWithTheStateSmaller) {
  const Formats f = GetParam();
  dstest::TempDir dir("swapped_adam_lp_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 10007;
  const at::ScalarType master_dtype = dtype_of(f.master), moment_dtype = dtype_of(f.moments);
  torch::manual_seed(5);
  const at::Tensor start = torch::randn({n}).to(master_dtype);
  InMemory ref{start.clone(), torch::zeros({n}, moment_dtype), torch::zeros({n}, moment_dtype)};

  SwappedAdam swapped(start, options(dir.path(), f.sub_group, f.buffers, f.master, f.moments));
  const int64_t group = std::min(f.sub_group, n), groups = (n + group - 1) / group;
  const int master_bytes = f.master == AdamElem::F32 ? 4 : 2;
  const int moment_bytes = f.moments == AdamElem::F32 ? 4 : 2;
  // The file: every sub-group's region in the formats' widths (10 or 6 bytes an element against
  // fp32's 12). Resident: the ring alone (host gradients are read where they are).
  int64_t file = 0;
  for (int64_t begin = 0; begin < n; begin += group)
    file += region_bytes(std::min(group, n - begin), master_bytes, moment_bytes);
  EXPECT_EQ(swapped.file_bytes(), file);
  EXPECT_EQ(swapped.resident_bytes(),
            std::min<int64_t>(f.buffers, groups) * region_bytes(group, master_bytes, moment_bytes));

  at::Tensor out = start.clone();
  for (int64_t step = 1; step <= 4; ++step) {
    // Gradients in the model's 16 bits, as the stages hand them over ("and grads").
    const at::Tensor grad = torch::randn({n}).to(master_dtype);
    const auto hp = hyper(step);
    deepspeed::optim::adam_step_buffers(ref.buffers(), grad.data_ptr(), ref.buffers().param_format,
                                        n, hp);
    swapped.step(grad, out, hp);
    ASSERT_TRUE(torch::equal(out, ref.master)) << "step " << step;
  }
  // The state read back widened (exact), and each sub-group's views in their formats.
  const auto state = swapped.read_state();
  EXPECT_EQ(state[0].scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::equal(state[0], ref.master.to(at::kFloat)));
  EXPECT_TRUE(torch::equal(state[1], ref.exp_avg.to(at::kFloat)));
  EXPECT_TRUE(torch::equal(state[2], ref.exp_avg_sq.to(at::kFloat)));
  const auto views = swapped.read_group(groups - 1);
  EXPECT_EQ(views[0].scalar_type(), master_dtype);
  EXPECT_EQ(views[1].scalar_type(), moment_dtype);
  EXPECT_TRUE(torch::equal(
      views[2], ref.exp_avg_sq.narrow(0, (groups - 1) * group, n - (groups - 1) * group)));
  // Every step read and wrote the file once (plus the initial write, read_state, read_group).
  EXPECT_EQ(swapped.stats().bytes_written, 5 * swapped.file_bytes());
}

INSTANTIATE_TEST_SUITE_P(Formats, SwappedLowPrecision,
                         ::testing::Values(Formats{AdamElem::BF16, AdamElem::F32, 1000, 3},
                                           Formats{AdamElem::BF16, AdamElem::BF16, 1000, 2},
                                           Formats{AdamElem::FP16, AdamElem::F32, 3000, 4},
                                           Formats{AdamElem::BF16, AdamElem::BF16, int64_t{1} << 30,
                                                   4}));

// Gradients that cannot be read in place (not contiguous here; on a GPU, in device memory) are
// brought into one landing buffer of a sub-group, kept from then on: the same update.
TEST(SwappedLowPrecisionGrads, ALandingBufferOnlyForGradientsThatNeedIt) {
  dstest::TempDir dir("swapped_adam_lp_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 3000;
  torch::manual_seed(6);
  const at::Tensor start = torch::randn({n}).to(at::kBFloat16);
  const auto o = options(dir.path(), 1000, 2, AdamElem::BF16, AdamElem::BF16);
  SwappedAdam in_place(start, o), landed(start, o);
  const int64_t ring = in_place.resident_bytes();
  at::Tensor out_a = start.clone(), out_b = start.clone();
  for (int64_t step = 1; step <= 2; ++step) {
    const at::Tensor wide = torch::randn({n, 2}).to(at::kBFloat16);
    const at::Tensor strided = wide.select(1, 0);  // every other element: not contiguous
    ASSERT_FALSE(strided.is_contiguous());
    in_place.step(strided.contiguous(), out_a, hyper(step));
    landed.step(strided, out_b, hyper(step));
  }
  EXPECT_TRUE(torch::equal(out_a, out_b));
  EXPECT_EQ(in_place.resident_bytes(), ring);
  EXPECT_EQ(landed.resident_bytes(), ring + round_up(1000 * 4, 4096));

  // Where gradients may be in device memory, the landing buffer is there from the start.
  SwapOptions device = o;
  device.device_gradients = true;
  SwappedAdam on_device(start, device);
  EXPECT_EQ(on_device.resident_bytes(), ring + round_up(1000 * 4, 4096));
}

// Masters written from outside (a checkpoint's fp32 values, an edited parameter) are rounded to
// nearest even into the 16-bit format, as Tensor::to rounds; the moments are kept.
TEST(SwappedLowPrecisionState, WrittenValuesAreRoundedIntoTheFormats) {
  dstest::TempDir dir("swapped_adam_lp_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 2500;
  torch::manual_seed(7);
  const at::Tensor a = torch::randn({n}), b = torch::randn({n}), c = torch::rand({n});
  SwappedAdam swapped(a, options(dir.path(), 1024, 2, AdamElem::BF16, AdamElem::BF16));
  swapped.write_state(a, b, c);
  auto s = swapped.read_state();
  EXPECT_TRUE(torch::equal(s[0], a.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(torch::equal(s[1], b.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(torch::equal(s[2], c.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_FALSE(torch::equal(s[0], a)) << "the masters would be fp32";

  const at::Tensor edit = torch::randn({300});
  swapped.set_masters(900, edit);  // crosses the first sub-group's end
  s = swapped.read_state();
  EXPECT_TRUE(torch::equal(s[0].narrow(0, 900, 300), edit.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(
      torch::equal(s[0].narrow(0, 0, 900), a.narrow(0, 0, 900).to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(torch::equal(s[1], b.to(at::kBFloat16).to(at::kFloat)));
}

TEST(SwappedLowPrecisionErrors, Fp16MomentsAreRefused) {
  dstest::TempDir dir("swapped_adam_lp_test", dstest::TempDir::Base::kDisk);
  EXPECT_THROW(SwappedAdam(torch::ones({10}).to(at::kHalf),
                           options(dir.path(), 64, 2, AdamElem::FP16, AdamElem::FP16)),
               c10::Error);
}

}  // namespace swapped_adam_low_precision_test
