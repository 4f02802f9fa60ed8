// ZeRO++'s block quantization (comm/quantize.h) and its config keys: the round trip stays within
// half a quantization step of every block (|x - q * s| <= s / 2, s = max|x| / qmax), the wire
// size is what the header says, and the keys are read, ignored below stage 3 with a warning, and
// refused where hpz does not divide the world.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "comm/quantize.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"
#include "zero/stage3/zeropp_options.h"

namespace quantize_test {

namespace {
using deepspeed::comm::dequantize;
using deepspeed::comm::quantize;
using deepspeed::comm::quantized_bytes;

// The largest |x - dequantized| of each block, over that block's scale (must be <= 0.5).
double worst_error_in_steps(const at::Tensor& x, int bits, int64_t block) {
  at::Tensor wire = quantize(x, bits, block);
  EXPECT_EQ(wire.numel(), quantized_bytes(x.numel(), bits, block));
  at::Tensor back = torch::empty_like(x);
  dequantize(wire, back, bits, block);
  const double qmax = bits == 8 ? 127 : 7;
  double worst = 0;
  for (int64_t start = 0; start < x.numel(); start += block) {
    const int64_t len = std::min(block, x.numel() - start);
    at::Tensor xb = x.narrow(0, start, len), bb = back.narrow(0, start, len);
    const double scale = xb.abs().max().item<double>() / qmax;
    const double err = (xb - bb).abs().max().item<double>();
    if (scale == 0) {
      EXPECT_EQ(err, 0.0);
      continue;
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}
}  // namespace

TEST(Quantize, RoundTripWithinHalfAStepPerBlock) {
  torch::manual_seed(3);
  for (int bits : {8, 4}) {
    for (int64_t n : {1, 2, 7, 31, 1000, 8000, 8001, 20011}) {
      for (int64_t block : {2, 64, 8000}) {
        // Blocks of very different magnitudes: each gets its own scale.
        at::Tensor x = torch::randn({n}) * torch::logspace(-3, 2, n);
        const double worst = worst_error_in_steps(x, bits, block);
        // Half a step, plus float rounding of x * (1 / s) against x / s.
        EXPECT_LE(worst, 0.5 + 1e-5) << bits << " bits, n " << n << ", block " << block;
      }
    }
  }
}

TEST(Quantize, ExtremesAndZerosAreExact) {
  for (int bits : {8, 4}) {
    at::Tensor x = torch::tensor({0.f, 3.f, -3.f, 0.f, 0.f, 0.f, 0.f, 0.f, 1.5f});
    at::Tensor back = torch::empty_like(x);
    dequantize(quantize(x, bits, 4), back, bits, 4);
    EXPECT_FLOAT_EQ(back[1].item<float>(), 3.f);  // max|x| maps to qmax exactly
    EXPECT_FLOAT_EQ(back[2].item<float>(), -3.f);
    EXPECT_TRUE(torch::equal(back.narrow(0, 4, 4), torch::zeros({4})));  // an all-zero block
    EXPECT_FLOAT_EQ(back[8].item<float>(), 1.5f);  // a block of one: its own max
  }
}

TEST(Quantize, WireSizes) {
  // int8: one byte per value; int4: two per byte; both padded to 4 bytes, then a float per block.
  EXPECT_EQ(quantized_bytes(8000, 8), 8000 + 4);
  EXPECT_EQ(quantized_bytes(8001, 8), 8004 + 8);
  EXPECT_EQ(quantized_bytes(8000, 4), 4000 + 4);
  EXPECT_EQ(quantized_bytes(9, 4, 2), 8 + 5 * 4);
  EXPECT_EQ(quantized_bytes(0, 8), 0);
  EXPECT_CONTAINS(dstest::message_of<std::invalid_argument>([] { quantized_bytes(10, 2); }),
                  "quantize: 2 bits (4 or 8 supported)");
  // int4 blocks start on a byte
  EXPECT_CONTAINS(dstest::message_of<std::invalid_argument>([] { quantized_bytes(10, 4, 3); }),
                  "quantize: block of 3 elements (4 bits needs a positive, even block)");
}

TEST(Quantize, AddAccumulatesAndOtherDtypesConvert) {
  at::Tensor x = torch::randn({100});
  at::Tensor acc = torch::ones({100});
  dequantize(quantize(x, 8), acc, 8, deepspeed::comm::kQuantBlock, /*add=*/true);
  EXPECT_LE((acc - 1 - x).abs().max().item<double>(), x.abs().max().item<double>() / 127 / 2 + 1e-6);
  at::Tensor half = torch::empty({100}, torch::kBFloat16);
  dequantize(quantize(x.to(torch::kBFloat16), 8), half, 8);
  EXPECT_LE((half.to(torch::kFloat) - x).abs().max().item<double>(), 0.05);
  at::Tensor wrong = torch::empty({50});  // (99 would pad to the same 100 bytes)
  EXPECT_THROW(dequantize(quantize(x, 8), wrong, 8), std::invalid_argument);
}

// What a GPU runs (tensor operations on the tensors' device, no host round trip) writes the
// kernels' bytes and decodes to their values, bit for bit: int8 and int4, several blocks with
// very different scales, an all-zero block, odd lengths, 16-bit input and output, and add.
TEST(Quantize, TensorOperationsGiveTheKernelsBytesAndValues) {
  using deepspeed::comm::dequantize_by_tensor_ops;
  using deepspeed::comm::quantize_by_tensor_ops;
  torch::manual_seed(11);
  for (int bits : {8, 4}) {
    for (int64_t n : {1, 7, 64, 1001, 20011}) {
      for (int64_t block : {2, 64, 8000}) {
        at::Tensor x = torch::randn({n}) * torch::logspace(-3, 2, n);
        if (n > 200) x.narrow(0, 64, 128).zero_();  // whole blocks of zeros at block 64
        for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
          const std::string what = std::to_string(bits) + " bits, n " + std::to_string(n) +
                                   ", block " + std::to_string(block);
          at::Tensor wire = quantize(x.to(dtype), bits, block);
          ASSERT_TRUE(torch::equal(quantize_by_tensor_ops(x.to(dtype), bits, block), wire)) << what;
          at::Tensor kernel = torch::empty({n}, dtype), ops = torch::empty({n}, dtype);
          dequantize(wire, kernel, bits, block);
          dequantize_by_tensor_ops(wire, ops, bits, block);
          EXPECT_TRUE(torch::equal(ops, kernel)) << what;
          at::Tensor kernel_sum = torch::ones({n}, dtype), ops_sum = torch::ones({n}, dtype);
          dequantize(wire, kernel_sum, bits, block, /*add=*/true);
          dequantize_by_tensor_ops(wire, ops_sum, bits, block, /*add=*/true);
          EXPECT_TRUE(torch::equal(ops_sum, kernel_sum)) << what;
        }
      }
    }
  }
  at::Tensor wrong = torch::empty({50});
  EXPECT_THROW(dequantize_by_tensor_ops(quantize(torch::ones({100}), 8), wrong, 8),
               std::invalid_argument);
}

// A NaN or inf in a block (an fp16 overflow in a gradient) makes the whole block NaN after the
// round trip, on the CPU kernels and the tensor operations alike and with the same bytes, so
// qgZ's quantized reduction cannot hide an overflow from the loss scaler; other blocks keep
// their values.
TEST(Quantize, ANonFiniteValueMakesItsBlockNaN) {
  using deepspeed::comm::dequantize_by_tensor_ops;
  using deepspeed::comm::quantize_by_tensor_ops;
  for (int bits : {8, 4}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      at::Tensor x = torch::linspace(-1, 1, 40);
      x[13] = bad;  // block [8, 16) of 8
      at::Tensor wire = quantize(x, bits, 8);
      EXPECT_TRUE(torch::equal(quantize_by_tensor_ops(x, bits, 8), wire)) << bits << " bits, " << bad;
      for (bool ops : {false, true}) {
        at::Tensor out = torch::empty({40});
        if (ops)
          dequantize_by_tensor_ops(wire, out, bits, 8);
        else
          dequantize(wire, out, bits, 8);
        const std::string what = std::to_string(bits) + " bits, " + std::to_string(bad) +
                                 (ops ? ", tensor ops" : ", kernels");
        EXPECT_TRUE(out.narrow(0, 8, 8).isnan().all().item<bool>()) << what;
        at::Tensor rest = torch::cat({out.narrow(0, 0, 8), out.narrow(0, 16, 24)});
        EXPECT_TRUE(rest.isfinite().all().item<bool>()) << what;
        at::Tensor want = torch::cat({x.narrow(0, 0, 8), x.narrow(0, 16, 24)});
        EXPECT_LE((rest - want).abs().max().item<float>(), bits == 8 ? 0.01f : 0.1f) << what;
      }
    }
  }
}

// A block whose max|x| is below qmax * FLT_MIN (here 1e-37) has a subnormal scale whose
// reciprocal is inf: its values are divided by the scale, and the round trip gives them back
// within half a step, as any block. Before, x * inf cast to int32 (undefined) gave INT_MIN on
// x86: every value, positive ones too, came back as -max, and the kernels' bytes differed from
// the tensor operations'.
TEST(Quantize, AValueBelowTheSmallestNormalScaleKeepsItsSign) {
  using deepspeed::comm::quantize_by_tensor_ops;
  for (int bits : {8, 4}) {
    at::Tensor x = torch::tensor({1e-37f, -1e-37f, 5e-38f, 0.f, -2e-38f, 1e-37f, 0.f, -1e-37f});
    at::Tensor wire = quantize(x, bits, 8);
    EXPECT_TRUE(torch::equal(quantize_by_tensor_ops(x, bits, 8), wire)) << bits << " bits";
    at::Tensor out = torch::empty({8});
    dequantize(wire, out, bits, 8);
    EXPECT_TRUE(torch::equal(out.sign(), x.sign())) << bits << " bits: " << out;
    EXPECT_LE((out - x).abs().max().item<float>(), 0.5f * 1e-37f / (bits == 8 ? 127 : 7)) << out;
  }
}

namespace {
deepspeed::Config parse(const nlohmann::json& zero, std::vector<std::string>* warnings = nullptr) {
  nlohmann::json doc = {{"train_micro_batch_size_per_gpu", 1}, {"zero_optimization", zero}};
  return deepspeed::parse_config(doc, 4, {}, warnings);
}
}  // namespace

TEST(ZeroPPConfig, KeysAreReadAtStage3) {
  auto c = parse({{"stage", 3}, {"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2},
                  {"zero_quantized_gradients", true}});
  EXPECT_TRUE(c.zero_optimization.zero_quantized_weights);
  EXPECT_TRUE(c.zero_optimization.zero_quantized_gradients);
  EXPECT_EQ(c.zero_optimization.zero_hpz_partition_size, 2);
  auto d = parse({{"stage", 3}});  // DeepSpeed's defaults: false / 1 / false
  EXPECT_FALSE(d.zero_optimization.zero_quantized_weights);
  EXPECT_FALSE(d.zero_optimization.zero_quantized_gradients);
  EXPECT_EQ(d.zero_optimization.zero_hpz_partition_size, 1);
}

TEST(ZeroPPConfig, IgnoredBelowStage3WithAWarningNamingTheKey) {
  // DeepSpeed hands these to its stage-3 optimizer only; stages 1/2 never read them.
  std::vector<std::string> warnings;
  auto c = parse({{"stage", 2}, {"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2},
                  {"zero_quantized_gradients", true}},
                 &warnings);
  EXPECT_FALSE(c.zero_optimization.zero_quantized_weights);
  EXPECT_FALSE(c.zero_optimization.zero_quantized_gradients);
  EXPECT_EQ(c.zero_optimization.zero_hpz_partition_size, 1);
  std::string all;
  for (auto& w : warnings) all += w + "\n";
  EXPECT_CONTAINS(all, "zero_optimization.zero_quantized_weights' (ZeRO++) applies to stage 3 only");
  EXPECT_CONTAINS(all, "zero_optimization.zero_quantized_gradients'");
  EXPECT_CONTAINS(all, "zero_optimization.zero_hpz_partition_size'");
}

TEST(ZeroPPConfig, BadValuesAreRefusedNamingTheKey) {
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [] { parse({{"stage", 3}, {"zero_hpz_partition_size", -1}}); }),
                  "zero_optimization.zero_hpz_partition_size");
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [] { parse({{"stage", 3}, {"zero_quantized_weights", "yes"}}); }),
                  "zero_optimization.zero_quantized_weights");
  deepspeed::ZeroConfig z;
  z.stage = 3;
  z.zero_hpz_partition_size = 3;
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [&] { deepspeed::zero::resolve_zeropp(z, 4); });
  EXPECT_CONTAINS(msg, "'zero_optimization.zero_hpz_partition_size' is 3");
  EXPECT_CONTAINS(msg, "world size 4");
  z.zero_hpz_partition_size = 8;  // more than the world: cut to it, as DeepSpeed's min()
  EXPECT_EQ(deepspeed::zero::resolve_zeropp(z, 4).hpz, 4);
  z.zero_hpz_partition_size = 2;
  EXPECT_EQ(deepspeed::zero::resolve_zeropp(z, 4).hpz, 2);
}

}  // namespace quantize_test
