#include "gpt/train_tensor_parallel.h"

#include "gpt/tp_model.h"
#include "gpt/train_loop.h"

namespace gpt_train {

int train_tensor_parallel(const Options& opt, const std::string& config_path,
                          const deepspeed::comm::CommunicatorPtr& comm) {
  gpt::check_tensor_parallel(opt.model, opt.tensor_parallel);
  if (opt.zero_init) throw deepspeed::ConfigError("gpt_train: --zero_init with --tensor_parallel");
  auto topology = std::make_shared<deepspeed::comm::Topology>(
      comm, deepspeed::comm::TopologySizes{1, opt.tensor_parallel});
  auto [run, model] = prepare_run(opt, config_path, comm, opt.tensor_parallel);
  run.topology = topology;
  // The split model's random initialisation is overwritten by copy_from; restoring the generator
  // after it keeps the run's random stream (dropout masks) that of the unsplit GPT.
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle to the default one
  const at::Tensor rng = generator.get_state();
  auto split = std::make_shared<gpt::TPGPTImpl>(opt.model, topology->tensor_parallel());
  split->copy_from(*model);
  generator.set_state(rng);
  model.reset();
  if (run.client_optimizer) run.client_optimizer = make_adamw(*split, opt);
  return train(run, split);
}

}  // namespace gpt_train
