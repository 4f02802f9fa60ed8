// FlopsProfiler's state (include/deepspeed/flops_profiler.h): the module tree, the parameter
// ownership maps and the operators recorded. Private to src/monitor.
#pragma once
#include <ATen/record_function.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepspeed/flops_profiler.h"
#include "monitor/flop_formulas.h"

namespace deepspeed {
namespace profiling {

struct FlopsProfiler::Impl {
  // One top-level operator (one called outside any other), with the FLOPs of every counted
  // operator in it.
  struct Op {
    std::string name;
    int owner = -1;  // module of the first parameter or buffer it (or an operator in it) read
    int pass = 0;    // which forward (start_profile call) of the profiled step
    double start = 0, end = 0;
    int64_t flops = 0, macs = 0;
  };
  struct Frame {
    int op = -1;
    bool counted = false;
    OpCount count;
  };
  struct Range {
    uintptr_t end = 0;
    int node = -1;
    const c10::StorageImpl* storage = nullptr;
  };
  struct Counted {
    std::string name;
    int64_t flops = 0, macs = 0;
    int op = -1;
  };

  void build_tree();
  void own(const at::Tensor& t, int node);
  void note_range(const at::Tensor& t, int node);
  int owner_of(const at::Tensor& t);
  void op_start(const at::RecordFunction& fn);
  void op_end(const at::RecordFunction& fn);
  // The wall clock for a top-level operator's start or end; on a GPU after the device finished
  // what was queued (kernels run asynchronously: without it, latency is the launch's).
  double timestamp();
  int common_ancestor(int a, int b) const;
  std::vector<int> resolved_modules() const;
  void aggregate();

  std::shared_ptr<torch::nn::Module> model;
  std::vector<ModuleProfile> nodes;  // pre-order; [0] the root
  std::unordered_map<const c10::TensorImpl*, int> owner_by_impl;
  std::map<uintptr_t, Range> ranges;  // by start address
  std::vector<Op> ops;
  std::vector<Counted> counted;
  std::vector<Frame> frames;  // operators open now
  int counted_depth = 0;      // open frames that are counted (nested ones are not counted again)
  int pass = 0;
  // The GPU the model computes on, from its parameters and buffers at start_profile() or, failing
  // that, the first CUDA input of a top-level operator; none: CPU timing needs no synchronize.
  bool on_cuda = false;
  c10::DeviceIndex cuda_index = -1;
  bool started = false, recording = false, aggregated = false;
  at::CallbackHandle handle = 0;
};

}  // namespace profiling
}  // namespace deepspeed
