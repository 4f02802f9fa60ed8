#include <torch/torch.h>

#include "comm/launch_world.h"
#include "deepspeed/zero_init.h"
#include "deepspeed/zero_unit.h"
#include "partition/partition.h"
#include "zero/stage3/init_shard.h"

namespace deepspeed {
namespace zero {
namespace {
thread_local Init* current_scope = nullptr;
}

Init::Init(comm::CommunicatorPtr comm, bool enabled, std::optional<at::ScalarType> dtype)
    : enabled_(enabled), dtype_(dtype) {
  if (!enabled_) return;
  // Without a comm or init_distributed(), a launched job is joined here (comm/launch_world.h).
  comm_ = comm::world_or_launch("zero::Init", comm);
  previous_ = current_scope;
  current_scope = this;
}

Init::~Init() {
  if (enabled_) current_scope = previous_;
}

Init* Init::current() { return current_scope; }

// Rank 0's values, flattened in registration order, padded to world * alignment; this rank keeps
// its slice and every full parameter is released. Parameters of nested units (already released,
// numel 0) are left to their own unit.
void Init::partition(ZeroUnitBase& unit) {
  torch::NoGradGuard no_grad;
  auto& held = detail::ZeroUnitAccess::shard(unit);
  held = std::make_shared<InitShard>();
  InitShard& shard = *held;
  std::vector<at::Tensor> params;
  int64_t numel = 0;
  for (auto& p : unit.parameters()) {
    bool seen = false;
    for (auto& q : params) seen = seen || q.is_same(p);
    if (seen || p.numel() == 0) continue;
    params.push_back(p);
    numel += p.numel();
  }
  const int world = comm_->world_size();
  auto layout = make_partition_layout(numel, world);
  const auto own = params.empty() ? torch::kFloat : params.front().scalar_type();
  at::Tensor flat = torch::zeros({layout.padded_numel}, torch::TensorOptions().dtype(dtype_.value_or(own)));
  int64_t offset = 0;
  for (auto& p : params) {
    TORCH_CHECK(p.scalar_type() == own, "zero::Init: a unit's parameters must share one dtype");
    auto view = flat.narrow(0, offset, p.numel());
    view.copy_(p.reshape({-1}));
    offset += p.numel();
  }
  if (world > 1) comm_->broadcast(flat, 0)->wait();
  shard.slice = flat.narrow(0, layout.begin(comm_->rank()), layout.partition_numel).clone();
  shard.padded_numel = layout.padded_numel;
  shard.world_size = world;
  for (auto& p : params) {
    shard.params.push_back(p);
    shard.shapes.push_back(p.sizes().vec());
    p.set_data(torch::empty({0}, p.options()));
  }
}

void restore_init_shard(ZeroUnitBase& unit, comm::Communicator& comm, c10::Device device) {
  auto& held = detail::ZeroUnitAccess::shard(unit);
  if (!held || !held->slice.defined()) return;
  const InitShard& shard = *held;
  if (shard.world_size != comm.world_size())
    throw ConfigError("zero::Init partitioned the model over " + std::to_string(shard.world_size) +
                      " ranks, but initialize() runs over " + std::to_string(comm.world_size()) +
                      " (zero_optimization.stage 3 needs the same data-parallel group)");
  torch::NoGradGuard no_grad;
  // On the device, so that the parameters are there before stage 3 hooks their gradients (a
  // gradient accumulator made for another device is dropped when the data moves, and its hook
  // with it).
  at::Tensor slice = shard.slice.to(device);
  at::Tensor full = torch::empty({shard.padded_numel}, slice.options());
  comm.all_gather(full, slice)->wait();
  int64_t offset = 0;
  for (size_t i = 0; i < shard.params.size(); ++i) {
    int64_t n = 1;
    for (auto d : shard.shapes[i]) n *= d;
    at::Tensor p = shard.params[i];
    p.set_data(full.narrow(0, offset, n).view(shard.shapes[i]).to(p.scalar_type()).clone());
    offset += n;
  }
  held.reset();
}

}  // namespace zero
}  // namespace deepspeed
