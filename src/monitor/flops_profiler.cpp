// The flops profiler's recording and attribution (include/deepspeed/flops_profiler.h explains the
// method); the report's text is flops_report.cpp.
#include "deepspeed/flops_profiler.h"

#include <ATen/record_function.h>
#include <c10/util/accumulate.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "deepspeed/errors.h"
#include "monitor/flop_formulas.h"
#include "monitor/flops_profiler_impl.h"
#include "zero/stage3/full_parameter_sizes.h"

namespace deepspeed {
namespace profiling {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "torch::nn::LinearImpl" -> "Linear", "deepspeed::ZeroUnit<gpt::BlockImpl>" -> "ZeroUnit<Block>".
std::string short_type(const std::string& name) {
  static const std::regex ns("[A-Za-z_][A-Za-z_0-9]*::");
  static const std::regex impl("Impl\\b");
  return std::regex_replace(std::regex_replace(name, ns, ""), impl, "");
}

// What a module says about itself beyond its type (libtorch's pretty_print "Linear(in=..)" ->
// "in=..."); custom modules print their name only, which gives "".
std::string extra_of(const torch::nn::Module& m) {
  std::ostringstream os;
  m.pretty_print(os);
  const std::string s = os.str();
  const auto open = s.find('('), close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close <= open) return "";
  return s.substr(open + 1, close - open - 1);
}

// The profiler recording on this thread (RecordFunction callbacks are plain function pointers).
thread_local FlopsProfiler::Impl* t_active = nullptr;

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (t_active) t_active->op_start(fn);
  return nullptr;
}
void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_active) t_active->op_end(fn);
}

}  // namespace

// ---- the module tree -------------------------------------------------------------------------

void FlopsProfiler::Impl::build_tree() {
  nodes.clear();
  owner_by_impl.clear();
  ranges.clear();
  on_cuda = false;
  cuda_index = -1;
  const auto numels = zero::partitioned_parameter_numels(*model);
  std::function<void(const std::shared_ptr<torch::nn::Module>&, const std::string&,
                     const std::string&, int, int)>
      add = [&](const std::shared_ptr<torch::nn::Module>& m, const std::string& name,
                const std::string& path, int parent, int depth) {
        const int id = static_cast<int>(nodes.size());
        ModuleProfile p;
        p.name = name;
        p.path = path;
        p.type = short_type(m->name());
        p.extra = extra_of(*m);
        p.parent = parent;
        p.depth = depth;
        nodes.push_back(p);
        if (parent >= 0) nodes[parent].children.push_back(id);
        // Parameters and buffers registered by this module itself mark its operators.
        for (const auto& kv : m->named_parameters(/*recurse=*/false)) own(kv.value(), id);
        for (const auto& kv : m->named_buffers(/*recurse=*/false)) own(kv.value(), id);
        // DeepSpeed's __params__: module.parameters(), recursively (a shared one once).
        std::unordered_map<const c10::TensorImpl*, bool> seen;
        for (const auto& t : m->parameters(/*recurse=*/true)) {
          if (!seen.emplace(t.unsafeGetTensorImpl(), true).second) continue;
          auto it = numels.find(t.unsafeGetTensorImpl());
          nodes[id].params += it != numels.end() ? it->second : t.numel();
        }
        for (const auto& kv : m->named_children())
          add(kv.value(), kv.key(), path.empty() ? kv.key() : path + "." + kv.key(), id, depth + 1);
      };
  add(model, "", "", -1, 0);
}

void FlopsProfiler::Impl::own(const at::Tensor& t, int node) {
  if (!t.defined()) return;
  if (!on_cuda && t.is_cuda()) on_cuda = true, cuda_index = t.device().index();
  owner_by_impl.emplace(t.unsafeGetTensorImpl(), node);  // a tied tensor: the first owner
  note_range(t, node);
}

void FlopsProfiler::Impl::note_range(const at::Tensor& t, int node) {
  if (!t.has_storage() || t.numel() == 0) return;
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (!start) return;
  ranges[start] = Range{start + static_cast<uintptr_t>(t.numel() * t.element_size()), node,
                        t.storage().unsafeGetStorageImpl()};
}

// The module owning `t`: the parameter or buffer itself, or a view into one's memory (the same
// storage and an address inside it: ZeRO 1/2 keep all parameters in one flat buffer).
int FlopsProfiler::Impl::owner_of(const at::Tensor& t) {
  if (!t.defined()) return -1;
  auto it = owner_by_impl.find(t.unsafeGetTensorImpl());
  if (it != owner_by_impl.end()) {
    note_range(t, it->second);  // ZeRO-3 gathers a parameter into new memory before it runs
    return it->second;
  }
  if (!t.has_storage() || ranges.empty()) return -1;
  const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
  auto r = ranges.upper_bound(p);
  if (r == ranges.begin()) return -1;
  --r;
  if (p >= r->second.end || r->second.storage != t.storage().unsafeGetStorageImpl()) return -1;
  return r->second.node;
}

// ---- recording -------------------------------------------------------------------------------

// DeepSpeed synchronizes the accelerator in every module's pre- and post-forward hook before
// reading the clock; the operators' callbacks are where modules begin and end here. Only
// top-level operators are timed, so nested ones cost no synchronize.
double FlopsProfiler::Impl::timestamp() {
  if (on_cuda) torch::cuda::synchronize(cuda_index);
  return now_s();
}

void FlopsProfiler::Impl::op_start(const at::RecordFunction& fn) {
  Frame f;
  const bool top = frames.empty();
  const auto inputs = fn.inputs();
  if (top) {
    if (!on_cuda) {  // a model whose tensors are not its parameters' (or a bare operator)
      for (const auto& v : inputs)
        if (v.isTensor() && v.toTensor().is_cuda()) {
          on_cuda = true;
          cuda_index = v.toTensor().device().index();
          break;
        }
    }
    ops.push_back(Op{fn.name(), -1, pass, timestamp(), 0.0, 0, 0});
    f.op = static_cast<int>(ops.size()) - 1;
  } else {
    f.op = frames.back().op;
  }
  Op& op = ops[f.op];
  if (op.owner < 0) {
    for (const auto& v : inputs) {
      if (!v.isTensor()) continue;
      const int o = owner_of(v.toTensor());
      if (o >= 0) {
        op.owner = o;
        break;
      }
    }
  }
  if (counted_depth == 0) {
    OpCount c = count_operator(fn.name(), inputs);
    if (c.counted) {
      f.counted = true;
      f.count = c;
      ++counted_depth;
    }
  }
  frames.push_back(f);
}

void FlopsProfiler::Impl::op_end(const at::RecordFunction& fn) {
  if (frames.empty()) return;  // an operator that began before start_profile()
  Frame f = frames.back();
  frames.pop_back();
  Op& op = ops[f.op];
  if (f.counted) {
    --counted_depth;
    if (f.count.macs_per_output || f.count.bias_per_output) {
      int64_t out = 0;
      const auto& outputs = fn.outputs();
      if (!outputs.empty() && outputs[0].isTensor()) out = outputs[0].toTensor().numel();
      finish(f.count, out);
    }
    op.flops += f.count.flops;
    op.macs += f.count.macs;
    counted.push_back({fn.name(), f.count.flops, f.count.macs, f.op});
  }
  if (frames.empty()) op.end = timestamp();
}

// ---- attribution -----------------------------------------------------------------------------

int FlopsProfiler::Impl::common_ancestor(int a, int b) const {
  while (nodes[a].depth > nodes[b].depth) a = nodes[a].parent;
  while (nodes[b].depth > nodes[a].depth) b = nodes[b].parent;
  while (a != b) {
    a = nodes[a].parent;
    b = nodes[b].parent;
  }
  return a;
}

// Gives each parameter-free operator to the deepest common ancestor of the modules of the nearest
// parameter-reading operators before and after it in the same forward pass (none: the root).
std::vector<int> FlopsProfiler::Impl::resolved_modules() const {
  const int n = static_cast<int>(ops.size());
  std::vector<int> prev(n, 0), next(n, 0), out(n, 0);
  for (int i = 0, last = -1; i < n; ++i) {
    if (i > 0 && ops[i].pass != ops[i - 1].pass) last = -1;
    prev[i] = last < 0 ? 0 : last;
    if (ops[i].owner >= 0) last = ops[i].owner;
  }
  for (int i = n - 1, last = -1; i >= 0; --i) {
    if (i < n - 1 && ops[i].pass != ops[i + 1].pass) last = -1;
    next[i] = last < 0 ? 0 : last;
    if (ops[i].owner >= 0) last = ops[i].owner;
  }
  for (int i = 0; i < n; ++i)
    out[i] = ops[i].owner >= 0 ? ops[i].owner : common_ancestor(prev[i], next[i]);
  return out;
}

void FlopsProfiler::Impl::aggregate() {
  for (auto& node : nodes) node.flops = node.macs = 0, node.latency_s = 0.0;
  const auto module = resolved_modules();
  const int n = static_cast<int>(ops.size());
  // Per module: the operator that last extended its current run, and the run's bounds.
  std::vector<int> last(nodes.size(), -2);
  std::vector<double> run_start(nodes.size(), 0.0), run_end(nodes.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    for (int a = module[i]; a >= 0; a = nodes[a].parent) {
      nodes[a].flops += ops[i].flops;
      nodes[a].macs += ops[i].macs;
      if (last[a] == i - 1 && ops[i - 1].pass == ops[i].pass) {
        run_end[a] = ops[i].end;
      } else {
        if (last[a] >= 0) nodes[a].latency_s += run_end[a] - run_start[a];
        run_start[a] = ops[i].start;
        run_end[a] = ops[i].end;
      }
      last[a] = i;
    }
  }
  for (size_t a = 0; a < nodes.size(); ++a)
    if (last[a] >= 0) nodes[a].latency_s += run_end[a] - run_start[a];
  aggregated = true;
}

// ---- the public face -------------------------------------------------------------------------

FlopsProfiler::FlopsProfiler(std::shared_ptr<torch::nn::Module> model)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = std::move(model);
}

FlopsProfiler::~FlopsProfiler() { end_profile(); }

void FlopsProfiler::start_profile() {
  auto& s = *impl_;
  if (s.recording) return;
#ifndef NDEBUG
  // at::RecordFunction's members differ with NDEBUG, and libtorch's binaries are built with it:
  // read from a build without it, an operator's inputs would be garbage.
  throw Error(
      "flops profiler: this build lacks NDEBUG (a Debug build); libtorch's RecordFunction "
      "is only readable from a Release or RelWithDebInfo build");
#endif
  s.ops.clear();
  s.counted.clear();
  s.pass = 0;
  s.build_tree();
  begin_recording();
}

void FlopsProfiler::resume_profile() {
  auto& s = *impl_;
  if (s.recording) return;
  if (!s.started) return start_profile();
  ++s.pass;  // another forward: runs of operators do not join across passes
  begin_recording();
}

void FlopsProfiler::begin_recording() {
  auto& s = *impl_;
  s.started = true;
  s.recording = true;
  s.aggregated = false;
  s.frames.clear();
  s.counted_depth = 0;
  t_active = impl_.get();
  s.handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_op_start, on_op_end)
                                            .needsInputs(true)
                                            .needsOutputs(true)
                                            .scopes({at::RecordScope::FUNCTION}));
}

void FlopsProfiler::stop_profile() {
  auto& s = *impl_;
  if (!s.recording) return;
  at::removeCallback(s.handle);
  if (t_active == impl_.get()) t_active = nullptr;
  s.recording = false;
}

void FlopsProfiler::end_profile() {
  stop_profile();
  impl_->started = false;
  impl_->ops.clear();
  impl_->counted.clear();
  impl_->nodes.clear();
  impl_->aggregated = false;
}

bool FlopsProfiler::started() const { return impl_->started; }

const std::vector<ModuleProfile>& FlopsProfiler::modules() const {
  if (!impl_->aggregated && !impl_->nodes.empty()) impl_->aggregate();
  return impl_->nodes;
}

int64_t FlopsProfiler::get_total_flops() const {
  return modules().empty() ? 0 : modules()[0].flops;
}
int64_t FlopsProfiler::get_total_macs() const { return modules().empty() ? 0 : modules()[0].macs; }
int64_t FlopsProfiler::get_total_params() const {
  return modules().empty() ? 0 : modules()[0].params;
}
double FlopsProfiler::get_total_duration() const {
  return modules().empty() ? 0.0 : modules()[0].latency_s;
}

std::vector<FlopsProfiler::CountedOp> FlopsProfiler::counted_ops() const {
  std::vector<CountedOp> out;
  if (impl_->nodes.empty()) return out;
  const auto module = impl_->resolved_modules();
  for (const auto& c : impl_->counted)
    out.push_back({c.name, c.flops, c.macs, impl_->nodes[module[c.op]].path});
  return out;
}

}  // namespace profiling
}  // namespace deepspeed
