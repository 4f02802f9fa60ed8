// The flops profiler (DeepSpeed's deepspeed.profiling.flops_profiler): parameters, MACs, FLOPs and
// forward latency of every module of a model over the forward passes it watched, and DeepSpeed's
// report of them. The engine runs one at `flops_profiler.profile_step` (docs/monitoring.md); a
// program can run its own, as DeepSpeed's FlopsProfiler(model):
//     deepspeed::profiling::FlopsProfiler prof(model);
//     prof.start_profile();
//     auto loss = model->forward(x, y);
//     prof.stop_profile();
//     std::cout << prof.get_total_flops() << "\n" << prof.model_profile();
//
// How it counts. FLOPs come from the operators that actually ran: a thread-local at::RecordFunction
// callback sees every ATen operator with its input shapes, and DeepSpeed's formula for that
// operator (linear 2·numel(x)·out, matmul 2·numel(a)·b[-1], softmax numel, layer_norm 5·numel, ...;
// the list is in docs/monitoring.md) gives its MACs and FLOPs. An operator inside a counted one
// (aten::addmm inside aten::linear) is not counted again.
//
// How an operator finds its module. libtorch's C++ modules have no forward hooks, and a model
// calls its children's forward() directly, so nothing marks where a module's forward begins. The
// parameters do: an operator that reads a parameter (or a view of one) belongs to the module that
// registered it (qkv's linear to attn.qkv, a LayerNorm to its module). An operator that reads no
// parameter (the attention's two matmuls and softmax, a GELU, a residual add) belongs to the
// deepest common ancestor of the modules of the nearest parameter-reading operators before and
// after it (for the attention matmuls: attn, between attn.qkv and attn.proj). This needs no change
// to the model; it is exact for modules with parameters, and places parameter-free work in the
// module whose forward ran it as long as that forward uses a parameter before and after it (a
// module's trailing parameter-free work, like a block's last residual add, goes to its parent).
// A module's latency is the wall time of its operators: the sum, over each uninterrupted run of
// its (and its descendants') operators, of the first start to the last end.
//
// Thread-safety: records the operators of the thread that called start_profile() (and autograd's
// threads it hands them to); one profiler per thread at a time.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace deepspeed {
namespace profiling {

// One module of the profiled tree, with its totals (its own operators and its descendants').
struct ModuleProfile {
  std::string name;  // attribute name under its parent ("attn"); "" for the root
  std::string path;  // dotted path from the root ("block0.attn"); "" for the root
  std::string type;  // class name without namespaces and "Impl" ("Linear", "ZeroUnit<Block>")
  std::string
      extra;        // the module's own description ("in_features=256, out_features=768, bias=true")
  int parent = -1;  // index into FlopsProfiler::modules(); -1 for the root
  int depth = 0;    // root 0
  std::vector<int> children;
  int64_t params = 0;  // parameters of the module and its descendants (full sizes under ZeRO-3)
  int64_t macs = 0;
  int64_t flops = 0;
  double latency_s = 0.0;
};

// What the report's summary says about the run; the engine fills it (a standalone profiler
// leaves it as is and the summary shows the model's lines only, as DeepSpeed's does).
struct RunFacts {
  bool from_engine = false;  // print the world / parallel sizes and batch size lines
  int world_size = 1;
  int dp_size = 1;
  int mp_size = 1;
  int64_t micro_batch_size = 0;
  // The step's timers in seconds (wall_clock_breakdown); < 0: unknown, the lines are left out and
  // the fwd latency is the root module's.
  double fwd_latency_s = -1, bwd_latency_s = -1, step_latency_s = -1;
  int64_t samples_per_iter = 0;       // samples of all ranks in the timed step
  double recompute_fwd_factor = 0.0;  // flops_profiler.recompute_fwd_factor
  double peak_tflops = 0.0;           // flops_profiler.peak_tflops (ours): 0 leaves MFU out
};

struct ReportOptions {
  int64_t profile_step = 1;
  int64_t module_depth = -1;  // aggregated profile depth (-1: all)
  int64_t top_modules = 1;
  bool detailed = true;
};

class FlopsProfiler {
 public:
  // The module tree is read at start_profile(); the model must outlive the profiler.
  explicit FlopsProfiler(std::shared_ptr<torch::nn::Module> model);
  ~FlopsProfiler();
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  // Clears what was counted and starts recording this thread's operators (DeepSpeed's reset and
  // start). Does nothing while recording.
  void start_profile();
  // Records another forward pass into the counts kept since start_profile() (the engine's
  // micro-steps of one optimizer step); start_profile() when nothing was started.
  void resume_profile();
  // Stops recording; the counts stay until the next start_profile() or end_profile().
  void stop_profile();
  // Stops recording and drops the counts.
  void end_profile();
  bool started() const;

  int64_t get_total_flops() const;
  int64_t get_total_macs() const;
  int64_t get_total_params() const;
  double get_total_duration() const;  // seconds: the root module's latency
  // The tree in pre-order (modules()[0] is the root), with every module's totals.
  const std::vector<ModuleProfile>& modules() const;
  // The operators counted, in the order they ran: name, FLOPs and the path of the module they
  // were given to. For tests and for finding what a module's FLOPs are made of.
  struct CountedOp {
    std::string name;
    int64_t flops = 0;
    int64_t macs = 0;
    std::string module;
  };
  std::vector<CountedOp> counted_ops() const;

  // DeepSpeed's report: summary, "Aggregated Profile per GPU", and with `detailed` the module
  // tree annotated with params, MACs, latency and FLOPS.
  std::string model_profile(const ReportOptions& options = {}, const RunFacts& facts = {}) const;
  // The report to `output_file` (created with its directory; "" : stdout).
  void print_model_profile(const ReportOptions& options = {}, const RunFacts& facts = {},
                           const std::string& output_file = "") const;

  struct Impl;

 private:
  void begin_recording();
  std::unique_ptr<Impl> impl_;
};

// DeepSpeed's number formatting (number_to_string and friends): 2 decimals, %g, units T/G/M/K/m/u.
std::string number_to_string(double num, const std::string& units = "");
std::string flops_to_string(double flops);       // "1.23 GFLOPS"
std::string macs_to_string(double macs);         // "1.23 GMACs"
std::string params_to_string(double params);     // "1.23 M", "1.23 B"
std::string duration_to_string(double seconds);  // "1.23 ms"

}  // namespace profiling
}  // namespace deepspeed
