#include "comm/dtypes.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>


#include "deepspeed/errors.h"
#include "util/ascii.h"

namespace deepspeed {
namespace comm {

bool gloo_accepts(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

static CommError unsupported(at::ScalarType type, const char* op) {
  return CommError(fmt::format("{}: tensors of dtype {} are not supported by the Gloo backend", op,
                               dtype_name(type)));
}

at::ScalarType bits_dtype(at::ScalarType type, const char* op) {
  if (gloo_accepts(type)) return type;
  switch (type) {
    case at::kBFloat16:
    case at::kShort:
      return at::kHalf;
    case at::kBool:
      return at::kByte;
    default:
      throw unsupported(type, op);
  }
}

at::ScalarType reduce_dtype(at::ScalarType type, const char* op) {
  if (gloo_accepts(type)) return type;
  switch (type) {
    case at::kBFloat16:
      return at::kFloat;
    case at::kShort:
      return at::kInt;
    case at::kBool:
      return at::kByte;
    default:
      throw unsupported(type, op);
  }
}

at::ScalarType accumulate_dtype(at::ScalarType type) {
  if (type == at::kHalf || type == at::kBFloat16) return at::kFloat;
  return type;
}

at::Tensor bits_view(const at::Tensor& t, at::ScalarType wire) {
  at::Tensor dense = t.contiguous();
  return wire == dense.scalar_type() ? dense : dense.view(wire);
}

std::string dtype_name(at::ScalarType type) {
  return ascii_lower(c10::toString(type));
}

}  // namespace comm
}  // namespace deepspeed
