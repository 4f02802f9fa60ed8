// Batch-size resolution: train_batch_size = micro-batch * accumulation steps * data-parallel size.
// DeepSpeed derives a missing value by floor division and then asserts; here a combination
// that does not divide exactly is rejected with every value and the world size in the message.
#include <optional>
#include <string>

#include "config/blocks.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

const char* kTbs = "train_batch_size";
const char* kMbs = "train_micro_batch_size_per_gpu";
const char* kGas = "gradient_accumulation_steps";

std::string shown(int64_t v) { return v > 0 ? std::to_string(v) : "not given"; }

// "train_batch_size (16), train_micro_batch_size_per_gpu (3), ..., world size (2)".
std::string all_values(const BatchSizes& b, int dp) {
  return std::string(kTbs) + " (" + shown(b.train_batch_size) + "), " + kMbs + " (" +
         shown(b.train_micro_batch_size_per_gpu) + "), " + kGas + " (" +
         shown(b.gradient_accumulation_steps) + "), data-parallel world size (" +
         std::to_string(dp) + ")";
}

[[noreturn]] void batch_error(const std::string& why, const BatchSizes& given, int dp) {
  throw ConfigError("invalid batch sizes: " + why + " [given: " + all_values(given, dp) + "]");
}

int64_t checked_product(int64_t a, int64_t b, const BatchSizes& given, int dp) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) batch_error("the product overflows 64 bits", given, dp);
  return r;
}

// Exact quotient of tbs by `divisor`, or an error naming what could not be derived.
int64_t derive(int64_t tbs, int64_t divisor, const std::string& divisor_text,
               const char* derived_key, const BatchSizes& given, int dp) {
  if (tbs % divisor != 0 || tbs < divisor) {
    batch_error(std::string(kTbs) + " (" + std::to_string(tbs) +
                    ") is not a positive multiple of " + divisor_text + " (" +
                    std::to_string(divisor) + "), so " + derived_key + " cannot be derived",
                given, dp);
  }
  return tbs / divisor;
}

}  // namespace

BatchSizes resolve_batch_sizes(BatchSizes given, int dp_world_size) {
  const int dp = dp_world_size;
  if (dp < 1) {
    throw ConfigError("invalid data-parallel world size " + std::to_string(dp) +
                      " for batch-size resolution; expected >= 1");
  }
  if (given.train_batch_size < 0 || given.train_micro_batch_size_per_gpu < 0 ||
      given.gradient_accumulation_steps < 0) {
    batch_error("batch sizes must be positive", given, dp);
  }
  BatchSizes b = given;
  int64_t& tbs = b.train_batch_size;
  int64_t& mbs = b.train_micro_batch_size_per_gpu;
  int64_t& gas = b.gradient_accumulation_steps;
  const std::string world = "world size";
  if (tbs == 0 && mbs == 0) {
    batch_error(std::string("either ") + kTbs + " or " + kMbs + " must be given", given, dp);
  }
  if (tbs > 0 && mbs > 0 && gas == 0) {
    gas = derive(tbs, checked_product(mbs, dp, given, dp), std::string(kMbs) + " * " + world, kGas,
                 given, dp);
  } else if (tbs > 0 && mbs == 0 && gas > 0) {
    mbs = derive(tbs, checked_product(gas, dp, given, dp), std::string(kGas) + " * " + world, kMbs,
                 given, dp);
  } else if (tbs > 0 && mbs == 0) {  // only train_batch_size: DeepSpeed takes 1 accumulation step
    gas = 1;
    mbs = derive(tbs, dp, world, kMbs, given, dp);
  } else if (tbs == 0) {  // micro-batch given, accumulation steps given or 1
    if (gas == 0) gas = 1;
    tbs = checked_product(checked_product(mbs, gas, given, dp), dp, given, dp);
  }
  int64_t product = checked_product(checked_product(mbs, gas, given, dp), dp, given, dp);
  if (tbs != product) {
    batch_error(std::string(kTbs) + " (" + std::to_string(tbs) + ") != " + kMbs + " (" +
                    std::to_string(mbs) + ") * " + kGas + " (" + std::to_string(gas) +
                    ") * world size (" + std::to_string(dp) + ") = " + std::to_string(product),
                given, dp);
  }
  return b;
}

namespace config {
namespace {

struct BatchKey {
  const char* name;
  std::optional<int64_t> ConfigOverrides::*override_value;
  int64_t BatchSizes::*slot;
};

const BatchKey kBatchKeys[] = {
    {kTbs, &ConfigOverrides::train_batch_size, &BatchSizes::train_batch_size},
    {kMbs, &ConfigOverrides::train_micro_batch_size_per_gpu,
     &BatchSizes::train_micro_batch_size_per_gpu},
    {kGas, &ConfigOverrides::gradient_accumulation_steps, &BatchSizes::gradient_accumulation_steps},
};


// One key: the config's value, "auto" (filled from the override, else left for derivation),
// or absent (the override, if any, counts as given, unless the overrides are fill_only). An explicit value must agree with the
// override, since silently preferring either would train with a batch the user did not ask for
// (unless the overrides are fill_only: a program's defaults, which explicit values replace).
int64_t read_one(ObjectReader& top, const BatchKey& key, const ConfigOverrides& overrides,
                 bool& was_auto) {
  const std::optional<int64_t>& over = overrides.*(key.override_value);
  if (over && *over <= 0) {
    throw ConfigError(std::string("initialize() was given ") + key.name + " = " +
                      std::to_string(*over) + "; expected a positive integer");
  }
  const json* v = top.find(key.name);
  was_auto = v && is_auto(*v);
  if (!v && overrides.fill_only) return 0;  // fill_only values fill "auto" keys, nothing else
  if (!v || was_auto) return over.value_or(0);
  int64_t value = to_int64(*v, key.name);
  if (value <= 0) fail(key.name, *v, "a positive integer");
  if (over && *over != value && !overrides.fill_only) {
    throw ConfigError(std::string("config key '") + key.name + "' is " + std::to_string(value) +
                      " but initialize() was given " + key.name + " = " + std::to_string(*over) +
                      "; make them agree or write \"auto\" in the config");
  }
  return value;
}

}  // namespace

std::vector<std::string> read_batch_sizes(ObjectReader& top, int dp_world_size,
                                          const ConfigOverrides& overrides, Config& cfg) {
  BatchSizes given;
  std::vector<std::string> auto_keys;
  std::vector<std::string> unfilled_auto;
  for (const BatchKey& key : kBatchKeys) {
    bool was_auto = false;
    given.*(key.slot) = read_one(top, key, overrides, was_auto);
    if (was_auto) auto_keys.push_back(key.name);
    if (was_auto && given.*(key.slot) == 0) unfilled_auto.push_back(key.name);
  }
  BatchSizes resolved;
  try {
    resolved = resolve_batch_sizes(given, dp_world_size);
  } catch (const ConfigError& e) {
    if (unfilled_auto.empty()) throw;
    std::string names;
    for (const auto& k : unfilled_auto) names += (names.empty() ? "" : ", ") + k;
    throw ConfigError(std::string(e.what()) + ". Keys set to \"auto\" (" + names +
                      ") need their value from initialize() or initialize_pipeline() (their "
                      "`overrides`, a ConfigOverrides) or a number in the config");
  }
  cfg.train_batch_size = resolved.train_batch_size;
  cfg.train_micro_batch_size_per_gpu = resolved.train_micro_batch_size_per_gpu;
  cfg.gradient_accumulation_steps = resolved.gradient_accumulation_steps;
  return auto_keys;
}

}  // namespace config
}  // namespace deepspeed
