// Lamb's and the 1-bit family's "optimizer.params", with DeepSpeed's names and defaults.
#include <limits>

#include "deepspeed/errors.h"
#include "optim/adam_keys.h"
#include "optim/optimizer_params.h"
#include "optim/param_reader.h"

namespace deepspeed {
namespace optim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ParamReader reader_for(const OptimizerConfig& config) {
  return ParamReader(config.params, "optimizer.params");
}

// REQUIRES hi >= lo for a pair of bounds (max_coeff/min_coeff, factor_max/factor_min).
void check_not_below(const ParamReader& r, const std::string& hi_key, double hi,
                     const std::string& lo_key, double lo) {
  if (!(hi >= lo))
    throw ConfigError(r.path(hi_key) + " = " + std::to_string(hi) + " is below " + r.path(lo_key) +
                      " = " + std::to_string(lo));
}

// comm_backend_name picks NCCL, MPI or the "compressed" packbits backend in DeepSpeed; here the
// compressed all-reduce always runs over the build's communicator (Gloo on CPU).
std::string read_backend(ParamReader& r, const std::string& type,
                         std::vector<std::string>* warnings) {
  std::string name = r.get_string("comm_backend_name", "nccl");
  if (name != "nccl" && name != "mpi" && name != "compressed")
    throw ConfigError(r.path("comm_backend_name") + " = \"" + name + "\" is not one of \"nccl\", " +
                      "\"mpi\", \"compressed\"");
  if (r.has("comm_backend_name"))
    warn(warnings, r.path("comm_backend_name") + " = \"" + name + "\": " + type +
                       "'s compressed all-reduce runs over the engine's communicator (the "
                       "build's backend) whatever this names");
  return name;
}

}  // namespace

LambHyper parse_lamb_params(const OptimizerConfig& config) {
  ParamReader r = reader_for(config);
  LambHyper h;
  read_adam_keys(r, h, "FusedLamb");
  h.bias_correction = r.get_bool("bias_correction", h.bias_correction);
  h.eps_inside_sqrt = r.get_bool("eps_inside_sqrt", h.eps_inside_sqrt);
  h.max_coeff = r.get_double("max_coeff", h.max_coeff);
  h.min_coeff = r.get_double("min_coeff", h.min_coeff);
  reject_unread(r, "Lamb");
  check_range(r, "min_coeff", h.min_coeff, 0, kInf);
  check_not_below(r, "max_coeff", h.max_coeff, "min_coeff", h.min_coeff);
  return h;
}

OneBitAdamHyper parse_onebit_adam_params(const OptimizerConfig& config,
                                         std::vector<std::string>* warnings) {
  ParamReader r = reader_for(config);
  OneBitAdamHyper h;
  read_adam_keys(r, h, "OnebitAdam");
  h.freeze_step = r.get_int("freeze_step", h.freeze_step);
  h.cuda_aware = r.get_bool("cuda_aware", h.cuda_aware);
  h.comm_backend_name = read_backend(r, "OneBitAdam", warnings);
  // OnebitAdam takes these and ignores them: no bias correction, eps outside the sqrt.
  r.get_bool("bias_correction", true);
  r.get_bool("eps_inside_sqrt", false);
  reject_unread(r, "OneBitAdam");
  check_range(r, "freeze_step", static_cast<double>(h.freeze_step), 0, kInf);
  return h;
}

ZeroOneAdamHyper parse_zero_one_adam_params(const OptimizerConfig& config,
                                            std::vector<std::string>* warnings) {
  ParamReader r = reader_for(config);
  ZeroOneAdamHyper h;
  read_adam_keys(r, h, "ZeroOneAdam");
  h.var_freeze_step = r.get_int("var_freeze_step", h.var_freeze_step);
  h.var_update_scaler = r.get_int("var_update_scaler", h.var_update_scaler);
  h.local_step_scaler = r.get_int("local_step_scaler", h.local_step_scaler);
  h.local_step_clipper = r.get_int("local_step_clipper", h.local_step_clipper);
  h.cuda_aware = r.get_bool("cuda_aware", h.cuda_aware);
  h.comm_backend_name = read_backend(r, "ZeroOneAdam", warnings);
  r.get_bool("bias_correction", true);
  r.get_bool("eps_inside_sqrt", false);
  reject_unread(r, "ZeroOneAdam");
  check_range(r, "var_freeze_step", static_cast<double>(h.var_freeze_step), 0, kInf);
  check_range(r, "var_update_scaler", static_cast<double>(h.var_update_scaler), 1, kInf);
  check_range(r, "local_step_scaler", static_cast<double>(h.local_step_scaler), 1, kInf);
  check_range(r, "local_step_clipper", static_cast<double>(h.local_step_clipper), 1, kInf);
  return h;
}

OneBitLambHyper parse_onebit_lamb_params(const OptimizerConfig& config,
                                         std::vector<std::string>* warnings) {
  ParamReader r = reader_for(config);
  OneBitLambHyper h;
  read_adam_keys(r, h, "OnebitLamb");
  h.max_coeff = r.get_double("max_coeff", h.max_coeff);
  h.min_coeff = r.get_double("min_coeff", h.min_coeff);
  h.freeze_step = r.get_int("freeze_step", h.freeze_step);
  h.coeff_beta = r.get_double("coeff_beta", h.coeff_beta);
  h.factor_max = r.get_double("factor_max", h.factor_max);
  h.factor_min = r.get_double("factor_min", h.factor_min);
  h.factor_threshold = r.get_double("factor_threshold", h.factor_threshold);
  h.cuda_aware = r.get_bool("cuda_aware", h.cuda_aware);
  h.comm_backend_name = read_backend(r, "OneBitLamb", warnings);
  // OnebitLamb takes these and ignores them: its update has no bias correction and adds eps
  // outside the sqrt.
  r.get_bool("bias_correction", true);
  r.get_bool("eps_inside_sqrt", false);
  reject_unread(r, "OneBitLamb");
  check_range(r, "freeze_step", static_cast<double>(h.freeze_step), 0, kInf);
  check_range(r, "min_coeff", h.min_coeff, 0, kInf);
  check_range(r, "coeff_beta", h.coeff_beta, 0, 1);
  check_range(r, "factor_min", h.factor_min, 0, kInf);
  check_range(r, "factor_threshold", h.factor_threshold, 0, kInf);
  check_not_below(r, "max_coeff", h.max_coeff, "min_coeff", h.min_coeff);
  check_not_below(r, "factor_max", h.factor_max, "factor_min", h.factor_min);
  return h;
}

}  // namespace optim
}  // namespace deepspeed
