#include "support/moved_values.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace dstest {

const std::vector<at::ScalarType>& moved_dtypes() {
  static const std::vector<at::ScalarType> types = {
      at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt,
      at::kLong,  at::kShort,  at::kChar, at::kByte,     at::kBool};
  return types;
}

at::Tensor random_values(at::ScalarType type, int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (type == at::kBool) return at::randint(0, 2, {n}, gen, at::kLong).to(at::kBool);
  if (at::isFloatingType(type)) return at::randn({n}, gen, at::kDouble).to(type);
  return at::randint(-100, 101, {n}, gen, at::kLong).to(type);
}

void issue_all_reduce_beside(deepspeed::comm::Communicator& c, std::vector<at::Tensor>& sums,
                             std::vector<deepspeed::comm::WorkPtr>& works) {
  sums.push_back(at::arange(3000, at::kFloat).add(c.rank()));
  works.push_back(c.all_reduce(sums.back()));
}

void expect_all_reduces_beside(const std::vector<at::Tensor>& sums, int world) {
  // sum over ranks r of (k + r): exact in fp32.
  const at::Tensor want = at::arange(3000, at::kFloat).mul(world).add(world * (world - 1) / 2);
  for (size_t i = 0; i < sums.size(); ++i)
    EXPECT_TRUE(sums[i].equal(want)) << "the all-reduce issued beside case " << i;
}

}  // namespace dstest
