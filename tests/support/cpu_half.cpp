#include "support/cpu_half.h"

#include <torch/torch.h>

#include "gpt/model.h"

namespace dstest {

bool cpu_runs_the_gpt_in_fp16() {
  static const bool runs = [] {
    auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
    model->to(torch::kHalf);
    auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
    try {
      model->forward(x, x).backward();
      return true;
    } catch (const c10::Error&) {  // "... not implemented for 'Half'"
      return false;
    }
  }();
  return runs;
}

}  // namespace dstest
