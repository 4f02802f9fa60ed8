#include "monitor/flop_formulas.h"

#include <string_view>
#include <unordered_map>

namespace deepspeed {
namespace profiling {
namespace {

enum class Kind {
  kLinear,         // 2·numel(x)·W.size(0), bias not counted (DeepSpeed's _linear_flops_compute)
  kMatmul,         // 2·numel(a)·b.size(-1)
  kAddmm,          // 2·numel(m1)·m2.size(-1) + numel(self)
  kElementwise,    // numel of the first input (activations, softmax, pooling)
  kNorm,           // numel·5 with affine weight, ·4 without (layer/group/instance norm)
  kBatchNorm,      // training: as kNorm; eval: numel·2 with affine, ·1 without
  kBinary,         // numel of the broadcast of the two operands (add, mul)
  kZero,           // counted as 0: embedding, dropout
  kConv,           // 2·numel(out)·(Cin/groups)·prod(kernel) + bias numel(out)
  kConvTranspose,  // 2·numel(in)·(Cout/groups)·prod(kernel) + bias numel(out)
  kAttention,      // scaled_dot_product_attention: q·kᵀ and att·v
  kUpsample,       // interpolate: numel(input) with a scale factor, else prod(output_size)
};

const std::unordered_map<std::string_view, Kind>& kinds() {
  static const std::unordered_map<std::string_view, Kind> table = {
      {"aten::linear", Kind::kLinear},
      {"aten::matmul", Kind::kMatmul},
      {"aten::mm", Kind::kMatmul},
      {"aten::bmm", Kind::kMatmul},
      {"aten::addmm", Kind::kAddmm},
      {"aten::baddbmm", Kind::kAddmm},
      {"aten::relu", Kind::kElementwise},
      {"aten::relu_", Kind::kElementwise},
      {"aten::prelu", Kind::kElementwise},
      {"aten::elu", Kind::kElementwise},
      {"aten::elu_", Kind::kElementwise},
      {"aten::leaky_relu", Kind::kElementwise},
      {"aten::leaky_relu_", Kind::kElementwise},
      {"aten::relu6", Kind::kElementwise},
      {"aten::hardtanh", Kind::kElementwise},  // F::relu6 in C++
      {"aten::hardtanh_", Kind::kElementwise},
      {"aten::silu", Kind::kElementwise},
      {"aten::silu_", Kind::kElementwise},
      {"aten::gelu", Kind::kElementwise},
      {"aten::gelu_", Kind::kElementwise},
      {"aten::softmax", Kind::kElementwise},
      {"aten::_softmax", Kind::kElementwise},
      {"aten::avg_pool1d", Kind::kElementwise},
      {"aten::avg_pool2d", Kind::kElementwise},
      {"aten::avg_pool3d", Kind::kElementwise},
      {"aten::max_pool1d", Kind::kElementwise},
      {"aten::max_pool2d", Kind::kElementwise},
      {"aten::max_pool3d", Kind::kElementwise},
      {"aten::adaptive_avg_pool1d", Kind::kElementwise},
      {"aten::adaptive_avg_pool2d", Kind::kElementwise},
      {"aten::adaptive_avg_pool3d", Kind::kElementwise},
      {"aten::adaptive_max_pool1d", Kind::kElementwise},
      {"aten::adaptive_max_pool2d", Kind::kElementwise},
      {"aten::adaptive_max_pool3d", Kind::kElementwise},
      {"aten::layer_norm", Kind::kNorm},
      {"aten::group_norm", Kind::kNorm},
      {"aten::instance_norm", Kind::kNorm},
      {"aten::batch_norm", Kind::kBatchNorm},
      {"aten::add", Kind::kBinary},
      {"aten::add_", Kind::kBinary},
      {"aten::mul", Kind::kBinary},
      {"aten::mul_", Kind::kBinary},
      {"aten::embedding", Kind::kZero},
      {"aten::dropout", Kind::kZero},
      {"aten::dropout_", Kind::kZero},
      {"aten::conv1d", Kind::kConv},
      {"aten::conv2d", Kind::kConv},
      {"aten::conv3d", Kind::kConv},
      {"aten::conv_transpose1d", Kind::kConvTranspose},
      {"aten::conv_transpose2d", Kind::kConvTranspose},
      {"aten::conv_transpose3d", Kind::kConvTranspose},
      {"aten::scaled_dot_product_attention", Kind::kAttention},
      // F::interpolate / nn::Upsample, by mode (area is adaptive_avg_pool, counted above).
      {"aten::upsample_nearest1d", Kind::kUpsample},
      {"aten::upsample_nearest2d", Kind::kUpsample},
      {"aten::upsample_nearest3d", Kind::kUpsample},
      {"aten::_upsample_nearest_exact1d", Kind::kUpsample},
      {"aten::_upsample_nearest_exact2d", Kind::kUpsample},
      {"aten::_upsample_nearest_exact3d", Kind::kUpsample},
      {"aten::upsample_linear1d", Kind::kUpsample},
      {"aten::upsample_bilinear2d", Kind::kUpsample},
      {"aten::_upsample_bilinear2d_aa", Kind::kUpsample},
      {"aten::upsample_bicubic2d", Kind::kUpsample},
      {"aten::_upsample_bicubic2d_aa", Kind::kUpsample},
      {"aten::upsample_trilinear3d", Kind::kUpsample},
  };
  return table;
}

const at::Tensor* tensor_at(c10::ArrayRef<const c10::IValue> in, size_t i) {
  if (i >= in.size() || !in[i].isTensor()) return nullptr;
  const at::Tensor& t = in[i].toTensor();
  return t.defined() ? &t : nullptr;
}

int64_t numel_at(c10::ArrayRef<const c10::IValue> in, size_t i) {
  const at::Tensor* t = tensor_at(in, i);
  return t ? t->numel() : 0;
}

// The number of elements of the broadcast result (a scalar operand counts as the other's shape;
// two scalars as 1). DeepSpeed's _elementwise_flops_compute aligns the shapes at the front, which
// over-counts operands of different ranks ([2, 16, 32] + [16, 32] would be 16·32·32); this aligns
// them at the back, as broadcasting does, which equals DeepSpeed's for equal ranks.
int64_t broadcast_numel(const at::Tensor* a, const at::Tensor* b) {
  if (!a && !b) return 1;
  if (!a) return b->numel();
  if (!b) return a->numel();
  const int64_t da = a->dim(), db = b->dim(), d = std::max(da, db);
  int64_t n = 1;
  for (int64_t i = 0; i < d; ++i) {
    const int64_t x = i < da ? a->size(da - 1 - i) : 1, y = i < db ? b->size(db - 1 - i) : 1;
    n *= std::max(x, y);
  }
  return n;
}

// MACs of a (batched) matrix product a·b: every element of a meets b's last dimension.
int64_t matmul_macs(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() * (b.dim() >= 2 ? b.size(-1) : 1);
}

// DeepSpeed's _upsample_flops_compute: prod(size) when F.interpolate got a size (the output's
// spatial size: batch and channels are not in it), else numel(input) (its `flops * scale...`
// lines discard their result, so a scale factor does not multiply). libtorch's interpolate always
// passes the output size it computed, and the scale factors only when it was given them: a scale
// argument (a float after the output size, or a float list in the .vec overloads) means
// "scale_factor given". Scales sit at 2 (nearest), or 3 (after linear modes' align_corners).
int64_t upsample_flops(c10::ArrayRef<const c10::IValue> in) {
  for (size_t i = 2; i < in.size(); ++i)
    if (in[i].isDouble() || (in[i].isDoubleList() && !in[i].toDoubleVector().empty()))
      return numel_at(in, 0);
  if (in.size() > 1 && in[1].isIntList()) {
    int64_t n = 1;
    for (int64_t d : in[1].toIntVector()) n *= d;
    return n;
  }
  return numel_at(in, 0);
}

}  // namespace

OpCount count_operator(const char* name, c10::ArrayRef<const c10::IValue> in) {
  OpCount c;
  const auto& table = kinds();
  auto it = table.find(std::string_view(name));
  if (it == table.end()) return c;
  c.counted = true;
  switch (it->second) {
    case Kind::kLinear: {
      const at::Tensor *x = tensor_at(in, 0), *w = tensor_at(in, 1);
      if (x && w) c.macs = x->numel() * w->size(0);
      c.flops = 2 * c.macs;
      break;
    }
    case Kind::kMatmul: {
      const at::Tensor *a = tensor_at(in, 0), *b = tensor_at(in, 1);
      if (a && b) c.macs = matmul_macs(*a, *b);
      c.flops = 2 * c.macs;
      break;
    }
    case Kind::kAddmm: {
      const at::Tensor *m1 = tensor_at(in, 1), *m2 = tensor_at(in, 2);
      if (m1 && m2) c.macs = matmul_macs(*m1, *m2);
      c.flops = 2 * c.macs + numel_at(in, 0);
      break;
    }
    case Kind::kElementwise:
      c.flops = numel_at(in, 0);
      break;
    case Kind::kNorm: {
      // layer_norm(input, shape, weight, ...), group_norm(input, groups, weight, ...),
      // instance_norm(input, weight, ...): the weight's position differs.
      const size_t w = std::string_view(name) == "aten::instance_norm" ? 1 : 2;
      c.flops = numel_at(in, 0) * (tensor_at(in, w) ? 5 : 4);
      break;
    }
    case Kind::kBatchNorm: {
      // batch_norm(input, weight, bias, running_mean, running_var, training, ...)
      const bool affine = tensor_at(in, 1) != nullptr;
      const bool training = in.size() > 5 && in[5].isBool() && in[5].toBool();
      c.flops = numel_at(in, 0) * (training ? (affine ? 5 : 4) : (affine ? 2 : 1));
      break;
    }
    case Kind::kBinary:
      c.flops = broadcast_numel(tensor_at(in, 0), tensor_at(in, 1));
      break;
    case Kind::kZero:
      break;
    case Kind::kConv: {
      // conv(input, weight [Cout, Cin/groups, k...], bias, ...): per output element,
      // (Cin/groups)·prod(k) MACs.
      const at::Tensor* w = tensor_at(in, 1);
      if (w && w->size(0) > 0) c.macs_per_output = w->numel() / w->size(0);
      c.bias_per_output = tensor_at(in, 2) != nullptr;
      break;
    }
    case Kind::kConvTranspose: {
      // conv_transpose(input, weight [Cin, Cout/groups, k...], bias, ...): per input element,
      // (Cout/groups)·prod(k) MACs, and the bias once per output element. The true count, which
      // differs from DeepSpeed's _conv_trans_flops_compute: it takes weight.shape[1] (already
      // Cout/groups) as Cout and divides by groups again, and counts the bias over an ordinary
      // convolution's output size (docs/monitoring.md has the figures).
      const at::Tensor *x = tensor_at(in, 0), *w = tensor_at(in, 1);
      if (x && w && w->size(0) > 0) c.macs = x->numel() * (w->numel() / w->size(0));
      c.flops = 2 * c.macs;
      c.bias_per_output = tensor_at(in, 2) != nullptr;
      break;
    }
    case Kind::kAttention: {
      const at::Tensor *q = tensor_at(in, 0), *k = tensor_at(in, 1), *v = tensor_at(in, 2);
      if (q && k && v) {
        const int64_t keys = k->size(-2);
        c.macs = q->numel() * keys + (q->numel() / q->size(-1)) * keys * v->size(-1);
      }
      c.flops = 2 * c.macs;
      break;
    }
    case Kind::kUpsample:
      c.flops = upsample_flops(in);
      break;
  }
  return c;
}

void finish(OpCount& c, int64_t output_numel) {
  c.macs += c.macs_per_output * output_numel;
  c.flops += 2 * c.macs_per_output * output_numel;
  if (c.bias_per_output) c.flops += output_numel;
  c.macs_per_output = 0;
  c.bias_per_output = false;
}

}  // namespace profiling
}  // namespace deepspeed
