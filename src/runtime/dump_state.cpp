#include "runtime/dump_state.h"

#include <c10/util/accumulate.h>
#include <torch/torch.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "monitor/memory_usage.h"

namespace deepspeed {
namespace {
// "  name ........ value", DeepSpeed's print_configuration layout.
std::string line(const std::string& name, const std::string& value) {
  std::string dots(name.size() < 29 ? 29 - name.size() : 1, '.');
  return "  " + name + " " + dots + " " + value + "\n";
}

std::string real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string count(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fM", static_cast<double>(n) / 1e6);
  return std::to_string(n) + " (" + buf + ")";
}
}  // namespace

std::string describe_engine_state(const EngineState& s) {
  const Config& c = s.config;
  const auto& grid = s.topology->grid();
  const auto at = s.topology->coordinates();
  std::string out = "[deepspeed] dump_state: the engine after initialize()\n";
  out += line("world", std::to_string(grid.world_size()) + " = pipe " +
                           std::to_string(grid.pipe_size()) + " x data " +
                           std::to_string(grid.data_size()) + " x tensor " +
                           std::to_string(grid.tensor_size()));
  out += line("this rank", std::to_string(s.topology->world()->rank()) + " (pipe " +
                               std::to_string(at.pipe) + ", data " + std::to_string(at.data) +
                               ", tensor " + std::to_string(at.tensor) + ")");
  out += line("device", s.device.str());
  out += line("zero_optimization.stage", std::to_string(c.zero_optimization.stage));
  out += line("offload_optimizer", c.zero_optimization.offload_optimizer.device);
  out += line("offload_param", c.zero_optimization.offload_param.device);
  out += line("train_batch_size", std::to_string(c.train_batch_size) + " = micro " +
                                      std::to_string(c.train_micro_batch_size_per_gpu) +
                                      " x accumulation " +
                                      std::to_string(c.gradient_accumulation_steps) + " x data " +
                                      std::to_string(grid.data_size()));
  int64_t trainable = 0;
  for (const auto& p : s.trainable) trainable += c10::multiply_integers(s.stage->whole_shape(p));
  int64_t frozen = 0, frozen_tensors = 0;
  for (const auto& p : s.module->parameters())
    if (!p.requires_grad()) {
      frozen += p.numel();
      ++frozen_tensors;
    }
  out += line("trainable parameters",
              count(trainable) + " in " + std::to_string(s.trainable.size()) + " tensors");
  out += line("frozen parameters",
              count(frozen) + " in " + std::to_string(frozen_tensors) + " tensors");
  out += line("parameter dtype", s.trainable.empty()
                                     ? std::string("-")
                                     : std::string(c10::toString(s.trainable[0].scalar_type())));
  out += line("optimizer",
              s.optimizer
                  ? (c.optimizer ? c.optimizer->type : std::string("client optimizer")) + ", " +
                        std::to_string(s.optimizer->param_groups().size()) + " parameter group(s)"
                  : std::string("none"));
  // What the optimizer steps: fp32 masters, or the 16-bit partition itself (low-precision masters).
  if (s.optimizer && !s.optimizer->param_groups().empty() &&
      !s.optimizer->param_groups()[0].params().empty())
    out += line("master weights", c10::toString(
                                      s.optimizer->param_groups()[0].params()[0].scalar_type()));
  out += line("lr_scheduler",
              s.scheduler ? (c.scheduler ? c.scheduler->type : std::string("client scheduler"))
                          : std::string("none"));
  out += line("loss scale",
              real(s.loss_scaler->scale()) + (c.fp16.enabled ? " (fp16)" : " (static: no fp16)"));
  out += line("gradient_clipping", real(c.gradient_clipping));
  for (const auto& l :
       monitor::memory_usage_lines("memory of this rank", s.stage->memory(), s.device))
    out += "  " + l + "\n";
  out += "  config (as read, \"auto\" keys filled):\n" + c.raw.dump(2) + "\n";
  return out;
}

}  // namespace deepspeed
