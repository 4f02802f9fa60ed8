// Trains a one-layer model for two steps through the installed headers and library.
#include <cstdio>

#include <deepspeed/deepspeed.h>
#include <torch/torch.h>

struct Tiny : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  Tiny() { fc = register_module("fc", torch::nn::Linear(4, 1)); }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(fc->forward(x), y);
  }
};

int main() {
  auto model = std::make_shared<Tiny>();
  if (deepspeed::count_parameters(*model) != 5) return 1;  // 4 weights + 1 bias
  nlohmann::json config = {{"train_batch_size", 2},
                           {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
                           {"zero_optimization", {{"stage", 2}}}};
  auto [engine, optimizer, loader, scheduler] =
      deepspeed::initialize<Tiny>({.model = model, .config_json = config});
  auto x = torch::ones({2, 4}), y = torch::zeros({2, 1});
  for (int i = 0; i < 2; ++i) {
    engine->backward(engine->forward(x, y));
    engine->step();
  }
  std::printf("consumer: %lld steps, loss %.4f\n", static_cast<long long>(engine->global_steps()),
              engine->last_loss());
  return engine->global_steps() == 2 ? 0 : 1;
}
