// Where initialize() puts the client's module before the stage is built (build_engine.cpp).
#pragma once
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <vector>

namespace deepspeed {

// Stages 0-2 hold every parameter whole on the device: the module moves there, as DeepSpeed's
// initialize() moves it. Stage 3 on a GPU partitions unit by unit: the trainable parameters of
// its units (deepspeed::ZeroUnit) stay where they are here and zero::Stage3 moves each unit just
// before slicing it, so the whole model is never on the GPU at once (DeepSpeed needs zero.Init
// for that); the rest (parameters outside every unit, frozen ones, buffers) moves now. A module
// is never moved to the CPU (a device of CPU leaves it where it is, as before).
// At stage 3 the registered parameters and buffers are moved one by one (as Module::to does it),
// so a client module that overrides to() to move tensors it did not register is not called there.
void move_module_to_device(torch::nn::Module& module, c10::Device device, int zero_stage);

// What stage 3 moves itself: the trainable parameters of the module's units (nested units and
// the module itself, when it is one, included), each once.
std::vector<at::Tensor> parameters_stage3_moves(torch::nn::Module& module);

}  // namespace deepspeed
