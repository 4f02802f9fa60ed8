// ds_config.json parsing: the real configs from the project's seed documents, DeepSpeed's code
// defaults, value forms, and one test per kind of error or warning.
#include "deepspeed/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"

namespace deepspeed {
namespace config_test {

using nlohmann::json;

ConfigOverrides micro_batch(int64_t mbs) {
  ConfigOverrides o;
  o.train_micro_batch_size_per_gpu = mbs;
  return o;
}

// From seed 001 ("the full ds_config.json reference"), comments included: DeepSpeed reads
// config files with hjson, so real files carry comments like these.
const char* kSeed001Config = R"(// ds_config.json
{
  "train_batch_size": 16, // 训练批次大小 (全局批次大小 = train_batch_size)
  "train_micro_batch_size_per_gpu": 2, // 每个 GPU 上的微批次大小
  "gradient_accumulation_steps": 8, // 梯度累积步数
  "optimizer": { // 优化器配置
    "type": "AdamW", // 优化器类型,例如 AdamW
    "params": {
      "lr": 1e-5, // 学习率
      "betas": [0.9, 0.999], // AdamW 参数
      "eps": 1e-8,
      "weight_decay": 0.01 // 权重衰减
    }
  },
  "scheduler": { // 学习率调度器配置
    "type": "WarmupLR", // 调度器类型,例如 WarmupLR
    "params": {
      "warmup_min_lr": 0,
      "warmup_max_lr": 1e-5,
      "warmup_num_steps": 1000
    }
  },
  "fp16": { // 混合精度训练配置
    "enabled": true, // 启用混合精度
    "loss_scale": 0, // 0表示DeepSpeed自动管理,否则为固定值
    "initial_scale_power": 12, // 初始梯度缩放因子 (2^12 = 4096)
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "zero_optimization": { // ZeRO 优化器配置
    "stage": 2, // ZeRO 阶段 (0, 1, 2, 3)
    "offload_optimizer": { // 优化器状态卸载到 CPU
      "device": "cpu", // 卸载到 CPU
      "pin_memory": true // 锁定 CPU 内存,提高传输速度
    },
    "offload_param": { // 参数卸载到 CPU (仅 Stage 3 配合使用)
      "device": "cpu",
      "pin_memory": true
    },
    "overlap_comm": true, // 开启通信与计算重叠
    "contiguous_gradients": true, // 尝试使梯度内存连续
    "sub_group_size": 1e9, // 较大的值表示禁用子组优化
    "stage3_prefetch_bucket_size": 0, // stage3预取大小,0为禁用
    "stage3_param_persistence_threshold": 1e5, // 仅对Stage3,参数持久化阈值
    "stage3_max_live_parameters": 1e9, // Stage3 最大驻留参数
    "stage3_max_act_size": 1e9 // Stage3 最大激活值大小
  },
  "gradient_clipping": 1.0, // 梯度裁剪,防止梯度爆炸
  "prescale_gradients": false, // 启用 prescale_gradients 可能会提高 Stage3 的性能
  "wall_clock_breakdown": false, // 是否详细记录训练时间分解
  "sparse_attention": false, // 稀疏注意力 (针对稀疏模型)
  "flops_profiler": { // FLOPS 分析器
    "enabled": false,
    "profile_step": 1,
    "module_depth": -1,
    "top_modules": 1,
    "detailed": true,
    "output_file": null
  },
  "activation_checkpointing": { // 激活值检查点 (类似于梯度检查点,节省显存)
    "enabled": false,
    "cpu_checkpointing": false, // 激活值检查点是否卸载到 CPU
    "partition_activations": false // 激活值是否分片 (只适用于 ZeRO Stage 3)
  },
  "pipeline": { // 管道并行配置 (如果启用)
    "seed_layers": false,
    "micro_batch_size": 0
  },
  "steps_per_print": 10, // 每隔多少步打印一次日志
  "seed": 1234, // 随机种子
  "tensorboard": { // TensorBoard 日志
    "enabled": true,
    "output_path": "tensorboard_logs/",
    "job_name": "my_deepspeed_experiment"
  }
}
)";

// Seed 003: zero2_config_accelerate.json, verbatim.
const char* kSeed003Zero2 = R"({
    "fp16": {
        "enabled": "true",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 15,
        "hysteresis": 2,
        "min_loss_scale": 1
    },
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": "auto",
            "weight_decay": "auto",
            "torch_adam": true,
            "adam_w_mode": true
        }
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto"
        }
    },
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": true,
        "allgather_bucket_size": 2e8,
        "overlap_comm": true,
        "reduce_scatter": true,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": true
    },
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
})";

// Seed 003: zero3_offload_config_accelerate.json, verbatim.
const char* kSeed003Zero3Offload = R"({
    "fp16": {
        "enabled": true,
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1
    },
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": "auto",
            "weight_decay": "auto"
        }
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto"
        }
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {
            "device": "cpu",
            "pin_memory": true
        },
        "offload_param": {
            "device": "cpu",
            "pin_memory": true
        },
        "overlap_comm": true,
        "contiguous_gradients": true,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
})";

// What the Hugging Face layer writes over the non-batch "auto" values (run_seq2seq settings:
// lr 1e-6, weight decay 0, 100 warmup steps; hidden size 1280 for the ZeRO-3 sizes).
void fill_auto_like_accelerate(json& doc) {
  doc["optimizer"]["params"]["lr"] = 1e-6;
  doc["optimizer"]["params"]["weight_decay"] = 0.0;
  doc["scheduler"]["params"] = {{"warmup_min_lr", 0},
                                {"warmup_max_lr", 1e-6},
                                {"warmup_num_steps", 100},
                                {"total_num_steps", 50}};
  doc["gradient_clipping"] = 1.0;
  if (doc["zero_optimization"]["stage"] == 3) {
    doc["zero_optimization"]["reduce_bucket_size"] = 1280 * 1280;
    doc["zero_optimization"]["stage3_prefetch_bucket_size"] = 0.9 * 1280 * 1280;
    doc["zero_optimization"]["stage3_param_persistence_threshold"] = 10 * 1280;
  }
}

json parse_with_comments(const char* text) {
  return json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
}

// Parses and returns the ConfigError message; fails the test if nothing is thrown.
std::string error_of(const json& doc, int dp = 1, const ConfigOverrides& over = {}) {
  std::vector<std::string> warnings;
  try {
    parse_config(doc, dp, over, &warnings);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << doc.dump();
  return "";
}

// A valid minimal config plus `extra` merged in at the top level.
json with(const json& extra) {
  json doc = {{"train_batch_size", 8}};
  doc.merge_patch(extra);
  return doc;
}

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v) {
    if (s.find(needle) != std::string::npos) return true;
  }
  return false;
}

// ---- the seed documents' real configs -------------------------------------------------------

// Seed 001 without its one key DeepSpeed rejects (zero_optimization is a strict block).
json seed001_without_act_size() {
  json doc = parse_with_comments(kSeed001Config);
  doc["zero_optimization"].erase("stage3_max_act_size");
  return doc;
}

TEST(ConfigSeeds, Seed001FullReferenceParses) {
  std::vector<std::string> warnings;
  Config c = parse_config(seed001_without_act_size(), 1, {}, &warnings);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer->params["lr"].get<double>(), 1e-5);
  ASSERT_TRUE(c.scheduler.has_value());
  EXPECT_EQ(c.scheduler->type, "WarmupLR");
  EXPECT_EQ(c.scheduler->params["warmup_num_steps"], 1000);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_TRUE(c.fp16.dynamic_keys_given);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  // offload_param only exists at stage 3: DeepSpeed ignores it here, and so do we (with a note).
  EXPECT_FALSE(c.zero_optimization.offload_param.enabled());
  EXPECT_TRUE(any_contains(warnings, "zero_optimization.offload_param applies to stage 3 only"));
  EXPECT_TRUE(c.zero_optimization.overlap_comm_enabled());
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 0);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100000);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_TRUE(c.flops_profiler.output_file.empty());
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "tensorboard_logs/");
  EXPECT_EQ(c.tensorboard.job_name, "my_deepspeed_experiment");
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.seed, 1234u);
  // Keys this (real) config has that DeepSpeed silently ignores: we name each one.
  EXPECT_TRUE(any_contains(warnings, "unknown config key 'activation_checkpointing.enabled'"));
  EXPECT_TRUE(any_contains(warnings, "unknown config key 'pipeline.micro_batch_size'"));
  EXPECT_EQ(warnings.size(), 3u);
}

TEST(ConfigSeeds, Seed001AsWrittenIsRefusedForItsUnknownZeroKey) {
  // DeepSpeed's pydantic zero_optimization model rejects this key too.
  EXPECT_CONTAINS(error_of(parse_with_comments(kSeed001Config)),
                  "unknown config key 'zero_optimization.stage3_max_act_size'");
}

TEST(ConfigSeeds, Seed001NeedsWorldSizeOne) {
  // 16 = 2 * 8 * world size only holds for one rank.
  EXPECT_CONTAINS(error_of(parse_with_comments(kSeed001Config), 2),
                  "train_batch_size (16) != train_micro_batch_size_per_gpu (2) * "
                  "gradient_accumulation_steps (8) * world size (2)");
}

TEST(ConfigSeeds, Seed003AutoValuesAreNamed) {
  std::string msg = error_of(json::parse(kSeed003Zero2), 2, micro_batch(40));
  for (const char* key :
       {"optimizer.params.lr", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
        "scheduler.params.total_num_steps", "gradient_clipping"}) {
    EXPECT_CONTAINS(msg, key);
  }
  EXPECT_EQ(msg.find("train_batch_size,"), std::string::npos);  // batch keys may stay "auto"
}

TEST(ConfigSeeds, Seed003Zero2ParsesOnceAutoIsFilled) {
  json doc = json::parse(kSeed003Zero2);
  fill_auto_like_accelerate(doc);
  std::vector<std::string> warnings;
  Config c = parse_config(doc, 2, micro_batch(40), &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 40);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 80);
  EXPECT_EQ(c.raw["train_batch_size"], 80);  // resolved "auto" recorded
  EXPECT_TRUE(c.fp16.enabled);               // written as the string "true"
  EXPECT_EQ(c.fp16.initial_scale_power, 15);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000);
  EXPECT_TRUE(c.zero_optimization.reduce_scatter);
  EXPECT_EQ(c.steps_per_print, 2000);
  EXPECT_EQ(c.optimizer->params["torch_adam"], true);
  EXPECT_EQ(c.scheduler->type, "WarmupDecayLR");
}

TEST(ConfigSeeds, Seed003Zero3OffloadParsesOnceAutoIsFilled) {
  json doc = json::parse(kSeed003Zero3Offload);
  fill_auto_like_accelerate(doc);
  std::vector<std::string> warnings;
  Config c = parse_config(doc, 1, micro_batch(16), &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(c.train_batch_size, 16);
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 3);
  EXPECT_EQ(z.offload_optimizer.device, "cpu");
  EXPECT_EQ(z.offload_param.device, "cpu");
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.reduce_bucket_size, 1280 * 1280);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 1474560);  // 0.9 * 1280^2, an integral double
  EXPECT_EQ(z.stage3_param_persistence_threshold, 12800);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save);
}

TEST(ConfigSeeds, Seed001LoadsFromFileWithComments) {
  auto path = std::filesystem::path(::testing::TempDir()) / "seed001_ds_config.json";
  // Without the key DeepSpeed rejects; the comma before it now trails, which hjson allows.
  std::string text = kSeed001Config;
  size_t key = text.find("\"stage3_max_act_size\"");
  text.erase(key, text.find('\n', key) - key);
  std::ofstream(path) << text;
  std::vector<std::string> warnings;
  Config c = load_config(path.string(), 1, {}, &warnings);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  std::filesystem::remove(path);
}

// ---- defaults ----------------------------------------------------------------------------------

TEST(ConfigDefaults, MatchDeepSpeedCodeDefaults) {
  std::vector<std::string> warnings;
  Config c = parse_config(json{{"train_micro_batch_size_per_gpu", 4}}, 2, {}, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.fp16.dynamic_keys_given);
  EXPECT_FALSE(c.bf16.enabled);
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm.has_value());
  EXPECT_FALSE(z.overlap_comm_enabled());
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_model_persistence_threshold, INT64_MAX);
  // /work/shared/reference/deepspeed.md:248-249: both 1e9 in DeepSpeed.
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(z.offload_param.device, "none");
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  // deepspeed.md:281-282: offload_param buffer_size 1e8 elements, max_in_cpu 1e9 elements.
  EXPECT_EQ(z.offload_param.buffer_size, 100000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_DOUBLE_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.pipeline.stages, "auto");
  EXPECT_EQ(c.pipeline.partition, "best");
  // deepspeed.md:323: seed_layers false, activation_checkpoint_interval 0, pipe/grad_partitioned true.
  EXPECT_FALSE(c.pipeline.seed_layers);
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 0);
  EXPECT_TRUE(c.pipeline.pipe_partitioned);
  EXPECT_TRUE(c.pipeline.grad_partitioned);
  // deepspeed.md:310-315: every activation_checkpointing switch off, number_checkpoints None.
  const auto& ac = c.activation_checkpointing;
  EXPECT_FALSE(ac.partition_activations);
  EXPECT_FALSE(ac.cpu_checkpointing);
  EXPECT_FALSE(ac.contiguous_memory_optimization);
  EXPECT_FALSE(ac.number_checkpoints.has_value());
  EXPECT_FALSE(ac.synchronize_checkpoint_boundary);
  EXPECT_FALSE(ac.profile);
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_TRUE(c.comms_logger.prof_all);
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_EQ(c.communication_data_type, "");
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.comm_timeout_seconds, 1800);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_EQ(c.raw, json({{"train_micro_batch_size_per_gpu", 4}}));
}

TEST(ConfigDefaults, OverlapCommDefaultsOnForStage3) {
  Config c = parse_config(with({{"zero_optimization", {{"stage", 3}}}}), 1);
  EXPECT_TRUE(c.zero_optimization.overlap_comm_enabled());
}

TEST(ConfigDefaults, TopLevelScalarsAreRead) {
  Config c = parse_config(with({{"seed", 7},
                                {"comm_timeout_seconds", 30},
                                {"steps_per_print", 0},
                                {"prescale_gradients", true},
                                {"gradient_predivide_factor", 2.0},
                                {"wall_clock_breakdown", true}}),
                          1);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.comm_timeout_seconds, 30);
  EXPECT_EQ(c.steps_per_print, 0);
  EXPECT_TRUE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 2.0);
  EXPECT_TRUE(c.wall_clock_breakdown);
}

TEST(ConfigDefaults, FlopsProfilerTurnsOnTimers) {
  Config c = parse_config(with({{"flops_profiler", {{"enabled", true}}}}), 1);
  EXPECT_TRUE(c.wall_clock_breakdown);
}

// ---- value forms -------------------------------------------------------------------------------

TEST(ConfigValueForms, IntegersAsDoublesAndStrings) {
  Config c = parse_config(with({{"zero_optimization",
                                 {{"stage", "2"},
                                  {"reduce_bucket_size", 5e8},
                                  {"allgather_bucket_size", "5e8"},
                                  {"sub_group_size", "1000000"}}}}),
                          1);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000);
}

TEST(ConfigValueForms, BooleansAsStrings) {
  Config c =
      parse_config(with({{"fp16", {{"enabled", "true"}}}, {"prescale_gradients", "False"}}), 1);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.prescale_gradients);
}

// DeepSpeed's plain-dict blocks test a value's truth (1 is on) and its pydantic blocks take 0 and 1
// as booleans: both integers read as booleans everywhere, lenient and strict blocks alike.
TEST(ConfigValueForms, BooleansAsOneAndZero) {
  Config c = parse_config(with({{"fp16", {{"enabled", 1}}},
                                {"prescale_gradients", 0},
                                {"zero_optimization", {{"overlap_comm", 1}, {"reduce_scatter", 0}}},
                                {"wandb", {{"enabled", 0}}},
                                {"amp", {{"enabled", 0}}}}),
                          1);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  EXPECT_FALSE(c.zero_optimization.reduce_scatter);
  EXPECT_CONTAINS(error_of(with({{"amp", {{"enabled", 1}}}})), "'amp.enabled' is true");
  // Any case, as the strings were read before.
  EXPECT_TRUE(parse_config(with({{"fp16", {{"enabled", "TRUE"}}}}), 1).fp16.enabled);
}

// Other numbers are more likely a value written under the wrong key: still errors naming it.
TEST(ConfigErrors, NumbersOtherThanOneAndZeroForBooleans) {
  for (json bad : {json(2), json(-1), json(0.5), json(1.0), json("1")}) {
    std::string msg = error_of(with({{"fp16", {{"enabled", bad}}}}));
    EXPECT_CONTAINS(msg, "'fp16.enabled' has value " + bad.dump() + "; expected a boolean");
    EXPECT_CONTAINS(msg, "1 or 0");
  }
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"overlap_comm", 2}}}})),
                  "'zero_optimization.overlap_comm' has value 2");
}

TEST(ConfigValueForms, RealsAsStrings) {
  Config c =
      parse_config(with({{"gradient_clipping", "1e-1"}, {"fp16", {{"loss_scale", 128}}}}), 1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.1);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 128.0);
}

TEST(ConfigValueForms, NullKeepsDefault) {
  Config c = parse_config(with({{"gradient_clipping", nullptr}, {"optimizer", nullptr}}), 1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_FALSE(c.optimizer.has_value());
}

// ---- errors: one per kind -------------------------------------------------------------------

TEST(ConfigErrors, WrongTypeNamesPathValueAndExpectation) {
  std::string msg = error_of(with({{"zero_optimization", {{"reduce_bucket_size", "lots"}}}}));
  EXPECT_CONTAINS(msg, "'zero_optimization.reduce_bucket_size'");
  EXPECT_CONTAINS(msg, "\"lots\"");
  EXPECT_CONTAINS(msg, "expected an integer");
}

TEST(ConfigErrors, FractionForIntegerKey) {
  std::string msg = error_of(with({{"zero_optimization", {{"reduce_bucket_size", 5.5}}}}));
  EXPECT_CONTAINS(msg, "'zero_optimization.reduce_bucket_size' has value 5.5");
}

TEST(ConfigErrors, WrongTypeForBoolAndString) {
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"enabled", "yes"}}}})),
                  "'fp16.enabled' has value \"yes\"; expected a boolean");
  EXPECT_CONTAINS(error_of(with({{"tensorboard", {{"job_name", 3}}}})),
                  "'tensorboard.job_name' has value 3; expected a string");
  EXPECT_CONTAINS(error_of(with({{"aio", 5}})), "'aio' has value 5; expected a JSON object");
}

TEST(ConfigErrors, StageOutOfRange) {
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"stage", 4}}}})),
                  "'zero_optimization.stage' has value 4; expected 0, 1, 2 or 3");
}

TEST(ConfigErrors, NegativeBucketSize) {
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"allgather_bucket_size", -1}}}})),
                  "'zero_optimization.allgather_bucket_size' has value -1");
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"stage3_prefetch_bucket_size", -5}}}})),
                  "zero_optimization.stage3_prefetch_bucket_size");
}

// allgather_bucket_size 0 would all-gather one element at a time (DeepSpeed divides by it:
// ZeroDivisionError); reduce_bucket_size 0 is DeepSpeed's one parameter per bucket, accepted.
TEST(ConfigErrors, ZeroAllgatherBucketSizeIsRefusedNamingTheKey) {
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"stage", 2}, {"allgather_bucket_size", 0}}}})),
                  "'zero_optimization.allgather_bucket_size' has value 0; expected a value > 0");
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", true}, {"allgather_size", 0}})),
                  "'allgather_size' has value 0; expected a value > 0");
  Config c = parse_config(with({{"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 0}}}}), 1);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);
}

// zero_optimization.leaf_module (DeepSpeed's DeepSpeedZeroLeafModuleConfig): lists of
// strings, one string as a list of one; other keys and types refused naming the path.
TEST(ConfigZero, LeafModuleListsAndStrictKeys) {
  Config c = parse_config(
      with({{"zero_optimization",
             {{"stage", 3},
              {"leaf_module",
               {{"classes", {"gpt::MLPImpl", "Block"}}, {"names", "block0.attn"}}}}}}),
      1);
  EXPECT_EQ(c.zero_optimization.leaf_module.classes,
            (std::vector<std::string>{"gpt::MLPImpl", "Block"}));
  EXPECT_EQ(c.zero_optimization.leaf_module.names, (std::vector<std::string>{"block0.attn"}));
  EXPECT_TRUE(c.zero_optimization.leaf_module.name_suffixes.empty());
  EXPECT_TRUE(parse_config(with(json::object()), 1).zero_optimization.leaf_module.empty());
  EXPECT_CONTAINS(
      error_of(with({{"zero_optimization", {{"leaf_module", {{"classes", 3}}}}}})),
      "'zero_optimization.leaf_module.classes' has value 3; expected a list of strings");
  EXPECT_CONTAINS(
      error_of(with({{"zero_optimization", {{"leaf_module", {{"names", {"a", 1}}}}}}})),
      "zero_optimization.leaf_module.names[1]");
  EXPECT_CONTAINS(
      error_of(with({{"zero_optimization", {{"leaf_module", {{"clases", {"a"}}}}}}})),
      "zero_optimization.leaf_module.clases");
}

TEST(ConfigErrors, OtherRanges) {
  EXPECT_CONTAINS(error_of(with({{"comm_timeout_seconds", 0}})), "'comm_timeout_seconds'");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"hysteresis", 0}}}})), "'fp16.hysteresis'");
  EXPECT_CONTAINS(error_of(with({{"seed", -3}})), "'seed'");
}

TEST(ConfigErrors, AutoNeedsAValue) {
  // (ZeRO's size knobs keep their defaults instead: ConfigAuto.LeftoverZeroSizes...)
  std::string msg =
      error_of(with({{"gradient_clipping", "auto"}, {"zero_optimization", {{"stage", "auto"}}}}));
  EXPECT_CONTAINS(msg, "gradient_clipping");
  EXPECT_CONTAINS(msg, "zero_optimization.stage");
  EXPECT_CONTAINS(msg, "need a value");
}

TEST(ConfigErrors, Fp16AndBf16Together) {
  std::string msg = error_of(with({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}));
  EXPECT_CONTAINS(msg, "fp16.enabled");
  EXPECT_CONTAINS(msg, "bf16.enabled");
}

// One aio block is one O_DIRECT request: page-aligned, and at most 1 GiB (the kernel cuts one
// read or write at 0x7ffff000 bytes; 2 GiB failed at the first swap as a "short read").
TEST(ConfigErrors, AioBlockSizeIsAlignedAndAtMostOneGiB) {
  for (int64_t bad : {int64_t{0}, int64_t{1000}, int64_t{1} << 31, (int64_t{1} << 30) + 4096}) {
    const std::string msg = error_of(with({{"aio", {{"block_size", bad}}}}));
    EXPECT_CONTAINS(msg, "'aio.block_size' has value " + std::to_string(bad));
    EXPECT_CONTAINS(msg, "multiple of 4096");
  }
  EXPECT_EQ(parse_config(with({{"aio", {{"block_size", int64_t{1} << 30}}}}), 1).aio.block_size,
            int64_t{1} << 30);
}

TEST(ConfigErrors, NvmeWithoutPath) {
  json zero = {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}};
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", zero}})),
                  "'zero_optimization.offload_param.nvme_path' is not set");
}

TEST(ConfigErrors, BadOffloadDevice) {
  json zero = {{"stage", 2}, {"offload_optimizer", {{"device", "gpu"}}}};
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", zero}})),
                  "'zero_optimization.offload_optimizer.device' has value \"gpu\"");
}

// DeepSpeed allows nvme optimizer offload at stage 3 only; this library swaps at stages 1-3.
TEST(ConfigOffload, NvmeOptimizerOffloadAtStages1To3) {
  for (int stage : {1, 2, 3}) {
    json zero = {{"stage", stage}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/tmp"}}}};
    EXPECT_EQ(parse_config(with({{"zero_optimization", zero}}), 1).zero_optimization.offload_optimizer.device,
              "nvme")
        << "stage " << stage;
  }
}

TEST(ConfigErrors, PartialOffloadRatioNeedsStage3) {
  json zero = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}};
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", zero}})),
                  "zero_optimization.offload_optimizer.ratio");
  zero["stage"] = 3;
  std::vector<std::string> warnings;
  EXPECT_DOUBLE_EQ(parse_config(with({{"zero_optimization", zero}}), 1, {}, &warnings)
                       .zero_optimization.offload_optimizer.ratio,
                   0.5);
  // Accepted at stage 3, but Twin-Flow's split is not implemented: said, not ignored.
  std::string said;
  for (const auto& w : warnings) said += w + "\n";
  EXPECT_CONTAINS(said, "zero_optimization.offload_optimizer.ratio 0.5: partial offload (Twin-Flow)");
  warnings.clear();
  zero["offload_optimizer"]["ratio"] = 1.0;
  parse_config(with({{"zero_optimization", zero}}), 1, {}, &warnings);
  for (const auto& w : warnings) EXPECT_EQ(w.find("ratio"), std::string::npos) << w;
}

// MiCS, LoCo and ZeRO++'s quantized frozen weights are not implemented: turned on, each gets a
// warning naming its key; at DeepSpeed's defaults, and DeepSpeed's internals, say nothing.
TEST(ConfigZero, UnimplementedZeroExtensionsAreWarnedWhenOn) {
  auto warnings_for = [](const json& zero) {
    std::vector<std::string> warnings;
    parse_config(with({{"zero_optimization", zero}}), 1, {}, &warnings);
    std::string all;
    for (const auto& w : warnings) all += w + "\n";
    return all;
  };
  const std::string quiet =
      warnings_for({{"stage", 3},
                    {"mics_shard_size", -1},
                    {"mics_hierarchical_params_gather", false},
                    {"zero_quantized_nontrainable_weights", false},
                    {"zeropp_loco_param", json::object()},
                    {"memory_efficient_linear", true},
                    {"override_module_apply", true}});
  EXPECT_EQ(quiet, "");
  const std::vector<std::pair<json, std::string>> on = {
      {{{"stage", 3}, {"mics_shard_size", 8}}, "zero_optimization.mics_shard_size': MiCS"},
      {{{"stage", 3}, {"mics_hierarchical_params_gather", true}},
       "zero_optimization.mics_hierarchical_params_gather': MiCS"},
      {{{"stage", 3}, {"zero_quantized_nontrainable_weights", true}},
       "zero_optimization.zero_quantized_nontrainable_weights': ZeRO++'s quantized storage"},
      {{{"stage", 3}, {"zeropp_loco_param", {{"err_beta", 0.8}, {"reset_T", 1024}}}},
       "zero_optimization.zeropp_loco_param': LoCo"},
  };
  for (const auto& [zero, expected] : on) EXPECT_CONTAINS(warnings_for(zero), expected) << zero;
}

TEST(ConfigErrors, MaxGradNormInOptimizerParams) {
  json opt = {{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"max_grad_norm", 1.0}}}};
  std::string msg = error_of(with({{"optimizer", opt}}));
  EXPECT_CONTAINS(msg, "optimizer.params.max_grad_norm");
  EXPECT_CONTAINS(msg, "gradient_clipping");
}

TEST(ConfigErrors, OptimizerWithoutType) {
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"params", {{"lr", 1}}}}}})), "'optimizer.type'");
}

TEST(ConfigErrors, CommunicationDataType) {
  EXPECT_EQ(parse_config(with({{"communication_data_type", "float32"}}), 1).communication_data_type,
            "fp32");
  EXPECT_EQ(
      parse_config(with({{"communication_data_type", "bfloat16"}}), 1).communication_data_type,
      "bf16");
  EXPECT_EQ(
      parse_config(with({{"data_types", {{"grad_accum_dtype", "fp16"}}}}), 1).grad_accum_dtype,
      "fp16");
  EXPECT_CONTAINS(error_of(with({{"communication_data_type", "int8"}})),
                  "'communication_data_type' has value \"int8\"");
}

TEST(ConfigErrors, TagValidation) {
  EXPECT_EQ(parse_config(with({{"checkpoint", {{"tag_validation", "fail"}}}}), 1)
                .checkpoint.tag_validation,
            "Fail");
  EXPECT_EQ(parse_config(with({{"checkpoint", {{"tag_validation", "IGNORE"}}}}), 1)
                .checkpoint.tag_validation,
            "Ignore");
  EXPECT_CONTAINS(error_of(with({{"checkpoint", {{"tag_validation", "maybe"}}}})),
                  "'checkpoint.tag_validation' has value \"maybe\"");
}

TEST(ConfigErrors, NotAnObject) {
  EXPECT_CONTAINS(error_of(json::array()), "must be a JSON object");
}

TEST(ConfigErrors, AliasAndNameTogether) {
  json zero = {{"stage3_prefetch_bucket_size", 10}, {"prefetch_bucket_size", 20}};
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", zero}})), "give only one");
  EXPECT_CONTAINS(
      error_of(with({{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}})),
      "'bf16' and 'bfloat16'");
}

// DeepSpeed 0.16 reads "seq_parallel_comm_data_type"; later releases (and the format string
// DeepSpeed shows for the key) spell it "seq_parallel_communication_data_type". Both load.
TEST(ConfigTopLevel, SequenceParallelDtypeUnderEitherName) {
  for (const char* key : {"seq_parallel_comm_data_type", "seq_parallel_communication_data_type"}) {
    std::vector<std::string> warnings;
    parse_config(with({{key, "bf16"}}), 1, {}, &warnings);
    EXPECT_TRUE(warnings.empty()) << key << ": " << (warnings.empty() ? "" : warnings[0]);
    EXPECT_CONTAINS(error_of(with({{key, "int8"}})), std::string("config key '") + key + "'");
  }
  EXPECT_CONTAINS(error_of(with({{"seq_parallel_comm_data_type", "fp32"},
                                 {"seq_parallel_communication_data_type", "fp32"}})),
                  "give only one");
}

// DeepSpeed clips only when gradient_clipping > 0 (engine: `if self.gradient_clipping() > 0`), so
// a negative value, which some configs write for "off", is off.
TEST(ConfigTopLevel, NegativeGradientClippingIsOff) {
  Config c = parse_config(with({{"gradient_clipping", -1.0}}), 1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, -1.0);
  EXPECT_FALSE(c.gradient_clipping > 0.0);
}

// ZeRO-2 with reduce_scatter (the default): DeepSpeed's stage_1_and_2.py asserts
// gradient_predivide_factor == 1.0 and postscale_gradients (not prescale_gradients) when
// `reduce_scatter and partition_gradients` (stage 2). Refused here when the config is read.
TEST(ConfigErrors, PrescaleOrPredivideWithStageTwoReduceScatter) {
  for (json extra :
       {json{{"prescale_gradients", true}}, json{{"gradient_predivide_factor", 2.0}}}) {
    json zero2 = with({{"zero_optimization", {{"stage", 2}}}});
    zero2.merge_patch(extra);
    std::string msg = error_of(zero2);
    EXPECT_CONTAINS(msg, extra.begin().key());
    EXPECT_CONTAINS(msg, "zero_optimization.reduce_scatter");
    EXPECT_CONTAINS(msg, "set zero_optimization.reduce_scatter to false");
    zero2["zero_optimization"]["reduce_scatter"] = false;
    EXPECT_NO_THROW(parse_config(zero2, 1)) << zero2.dump();
    // Stages 0 and 1 scale as asked (DeepSpeed asserts only where gradients are partitioned).
    for (int stage : {0, 1}) {
      json other = with({{"zero_optimization", {{"stage", stage}}}});
      other.merge_patch(extra);
      EXPECT_NO_THROW(parse_config(other, 1)) << other.dump();
    }
  }
}

// number_checkpoints sizes DeepSpeed's contiguous checkpoint buffer and is read nowhere else
// (default None): without contiguous_memory_optimization any count, 0 included, is accepted (and
// initialize() takes it: tests/unit/config_engine_test.cpp); with it the count must be positive.
TEST(ConfigFeatureBlocks, NumberCheckpointsMattersOnlyWithContiguousMemory) {
  Config c = parse_config(with({{"activation_checkpointing", {{"number_checkpoints", 0}}}}), 1);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 0);
  std::string msg =
      error_of(with({{"activation_checkpointing",
                      {{"contiguous_memory_optimization", true}, {"number_checkpoints", 0}}}}));
  EXPECT_CONTAINS(msg, "'activation_checkpointing.number_checkpoints' has value 0");
  EXPECT_CONTAINS(msg, "contiguous_memory_optimization");
}

// ---- warnings ---------------------------------------------------------------------------------

TEST(ConfigWarnings, UnknownKeyNamesFullPath) {
  std::vector<std::string> warnings;
  parse_config(with({{"fp16", {{"stage4", 1}}}}), 1, {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "unknown config key 'fp16.stage4'");
}

TEST(ConfigWarnings, MisspeltKeyGetsSuggestion) {
  std::vector<std::string> warnings;
  Config c = parse_config(with({{"gradient_cliping", 1.0}}), 1, {}, &warnings);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "did you mean 'gradient_clipping'");
}

TEST(ConfigWarnings, PrintedToStderrWithoutSink) {
  ::testing::internal::CaptureStderr();
  parse_config(with({{"fp16", {{"stage4", 1}}}}), 1);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, "[deepspeed] warning: unknown config key 'fp16.stage4'");
}

TEST(ConfigWarnings, RecognisedBlocksAcceptedSilently) {
  std::vector<std::string> warnings;
  json extra = {{"wandb", {{"enabled", false}, {"project", "x"}}},
                {"comet", {{"enabled", false}}},
                {"sparse_attention", {{"mode", "fixed"}, {"block", 16}}},
                {"elasticity", {{"enabled", false}}},
                {"autotuning", {{"enabled", false}, {"metric", "auto"}}},
                {"compression_training", json::object()},
                {"amp", {{"enabled", false}}}};
  Config c = parse_config(with(extra), 1, {}, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(c.raw["wandb"]["project"], "x");
}

TEST(ConfigWarnings, DeprecatedZeroAliasesAreRemapped) {
  std::vector<std::string> warnings;
  json zero = {{"stage", 3},
               {"cpu_offload", true},
               {"cpu_offload_param", true},
               {"stage3_gather_fp16_weights_on_model_save", true},
               {"prefetch_bucket_size", 1234}};
  Config c = parse_config(with({{"zero_optimization", zero}}), 1, {}, &warnings);
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.offload_optimizer.device, "cpu");
  EXPECT_EQ(z.offload_param.device, "cpu");
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 1234);
  EXPECT_EQ(warnings.size(), 4u);
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.cpu_offload' is deprecated"));
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.cpu_offload_param' is deprecated"));
  EXPECT_TRUE(any_contains(warnings, "stage3_gather_fp16_weights_on_model_save' is deprecated"));
  EXPECT_TRUE(any_contains(warnings, "'zero_optimization.prefetch_bucket_size' is read as"));
}

TEST(ConfigWarnings, DeprecatedCpuOffloadWithNewBlockIsAnError) {
  json zero = {{"stage", 2}, {"cpu_offload", true}, {"offload_optimizer", {{"device", "cpu"}}}};
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", zero}})), "are both given");
}

TEST(ConfigWarnings, LegacyBooleanZeroIsStage1) {
  std::vector<std::string> warnings;
  Config c =
      parse_config(with({{"zero_optimization", true}, {"allgather_size", 1000}}), 1, {}, &warnings);
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 1000);
  EXPECT_TRUE(any_contains(warnings, "deprecated"));
}

TEST(ConfigWarnings, AioThreadCountAlias) {
  std::vector<std::string> warnings;
  Config c = parse_config(with({{"aio", {{"thread_count", 4}}}}), 1, {}, &warnings);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(any_contains(warnings, "'aio.thread_count' is deprecated"));
}

TEST(ConfigWarnings, Bfloat16BlockAlias) {
  std::vector<std::string> warnings;
  Config c = parse_config(with({{"bfloat16", {{"enabled", true}}}}), 1, {}, &warnings);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(warnings.empty());
}

// bf16.check_grad_overflow turns on the overflow vote (precision/overflow_vote.h); read from the
// alias block too, its type error naming the key as written.
TEST(ConfigBf16, CheckGradOverflowIsRead) {
  EXPECT_FALSE(parse_config(with({{"bf16", {{"enabled", true}}}}), 1).bf16.check_grad_overflow);
  EXPECT_TRUE(parse_config(with({{"bf16", {{"enabled", true}, {"check_grad_overflow", true}}}}), 1)
                  .bf16.check_grad_overflow);
  EXPECT_TRUE(parse_config(with({{"bfloat16", {{"check_grad_overflow", true}}}}), 1)
                  .bf16.check_grad_overflow);
  EXPECT_CONTAINS(error_of(with({{"bf16", {{"check_grad_overflow", "yes"}}}})),
                  "'bf16.check_grad_overflow'");
  EXPECT_CONTAINS(error_of(with({{"bfloat16", {{"check_grad_overflow", 1.5}}}})),
                  "'bfloat16.check_grad_overflow'");
}

TEST(ConfigFp16, DynamicKeysGivenTracksTheFiveKeys) {
  EXPECT_FALSE(parse_config(with({{"fp16", {{"enabled", true}, {"loss_scale", 0}}}}), 1)
                   .fp16.dynamic_keys_given);
  for (const char* key : {"loss_scale_window", "hysteresis", "min_loss_scale",
                          "initial_scale_power", "consecutive_hysteresis"}) {
    json fp16 = {{"enabled", true},
                 {key, key == std::string("consecutive_hysteresis") ? json(true) : json(2)}};
    EXPECT_TRUE(parse_config(with({{"fp16", fp16}}), 1).fp16.dynamic_keys_given) << key;
  }
}

// DeepSpeed-Chat's fp16 block: min_loss_scale 0 is DeepSpeed's "no floor" (taken as any
// number there), and opt_level (apex AMP's key) is not read by DeepSpeed's fp16 block.
TEST(ConfigFp16, DeepSpeedChatBlockWithMinLossScaleZeroParses) {
  std::vector<std::string> warnings;
  Config c = parse_config(with(json::parse(R"({"fp16": {"enabled": true, "opt_level": "O2",
      "loss_scale_window": 100, "min_loss_scale": 0}})")),
                          1, {}, &warnings);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.0);
  EXPECT_EQ(c.fp16.loss_scale_window, 100);
  EXPECT_TRUE(c.fp16.dynamic_keys_given);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "'fp16.opt_level'");
  EXPECT_CONTAINS(warnings[0], "ignored, as in DeepSpeed");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"enabled", true}, {"min_loss_scale", -1}}}})),
                  "config key 'fp16.min_loss_scale' has value -1.0; expected a value >= 0");
}

// DeepSpeed: Field(1, ge=0), and its stage 3 makes the secondary group only above 1.
TEST(ConfigZero, HpzPartitionSizeZeroIsOff) {
  std::vector<std::string> warnings;
  for (int stage : {2, 3}) {
    Config c = parse_config(
        with({{"zero_optimization", {{"stage", stage}, {"zero_hpz_partition_size", 0}}}}), 1, {},
        &warnings);
    EXPECT_EQ(c.zero_optimization.zero_hpz_partition_size, 1) << stage;
  }
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"zero_hpz_partition_size", -1}}}})),
                  "'zero_optimization.zero_hpz_partition_size' has value -1");
}

// DeepSpeed 0.16.5 declares it deprecated with set_new_param=False: a warning, nothing set.
TEST(ConfigWarnings, CpuOffloadUsePinMemoryOnlyWarns) {
  std::vector<std::string> warnings;
  Config c = parse_config(
      with({{"zero_optimization",
             {{"stage", 3},
              {"offload_param", {{"device", "cpu"}}},
              {"offload_optimizer", {{"device", "cpu"}}},
              {"cpu_offload_use_pin_memory", true}}}}),
      1, {}, &warnings);
  EXPECT_FALSE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.pin_memory);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "'zero_optimization.cpu_offload_use_pin_memory'");
  EXPECT_CONTAINS(warnings[0], "has no effect");
  EXPECT_CONTAINS(warnings[0], "'zero_optimization.offload_param.pin_memory'");
  EXPECT_CONTAINS(warnings[0], "'zero_optimization.offload_optimizer.pin_memory'");
}

// The stage count in every form read_pipeline takes, normalised.
TEST(ConfigFeatureBlocks, PipelineStagesForms) {
  for (const json& v : {json(4), json(4.0), json("4"), json("4e0")}) {
    EXPECT_EQ(parse_config(with({{"pipeline", {{"stages", v}}}}), 1).pipeline.stages, "4")
        << v.dump();
  }
  EXPECT_EQ(parse_config(with({{"pipeline", {{"stages", "auto"}}}}), 1).pipeline.stages, "auto");
  for (const json& v : {json(0), json("four"), json(2.5)}) {
    EXPECT_CONTAINS(error_of(with({{"pipeline", {{"stages", v}}}})),
                    "'pipeline.stages' has value " + v.dump() +
                        "; expected \"auto\" or a positive number of stages");
  }
}

TEST(ConfigFeatureBlocks, AreReadIntoStructs) {
  json extra = {
      {"activation_checkpointing", {{"partition_activations", true}, {"number_checkpoints", 4}}},
      {"pipeline", {{"stages", 2}, {"activation_checkpoint_interval", 1}}},
      {"csv_monitor", {{"enabled", true}, {"output_path", "csv/"}}},
      {"comms_logger", {{"enabled", true}, {"prof_ops", {"all_reduce"}}}},
      {"checkpoint", {{"use_node_local_storage", true}}},
      {"aio", {{"block_size", 262144}, {"single_submit", true}}}};
  Config c = parse_config(with(extra), 1);
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 4);
  EXPECT_EQ(c.pipeline.stages, "2");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 1);
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "csv/");
  EXPECT_TRUE(c.comms_logger.enabled);
  EXPECT_TRUE(c.checkpoint.use_node_local_storage);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_TRUE(c.aio.single_submit);
}

// ---- load_config -------------------------------------------------------------------------------

class LoadConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::string load_error(const std::string& path) {
    try {
      load_config(path, 1);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a ConfigError for " << path;
    return "";
  }
  dstest::TempDir scratch_{"ds_config_test", dstest::TempDir::Base::kDisk};
  const std::filesystem::path dir_ = scratch_.path();
};

TEST_F(LoadConfigTest, MissingFileNamesThePath) {
  std::string path = (dir_ / "nope.json").string();
  std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "does not exist");
}

TEST_F(LoadConfigTest, MalformedJsonNamesPathAndLine) {
  std::string path =
      write("bad.json", "{\n  \"train_batch_size\": 8,\n  \"fp16\": {enabled true}\n}\n");
  std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "line 3, column 12");
  EXPECT_CONTAINS(msg, "byte");
}

TEST_F(LoadConfigTest, DuplicateKeyIsAnError) {
  std::string path = write("dup.json", R"({"train_batch_size": 8, "fp16": {"enabled": true,
                                           "enabled": false}})");
  EXPECT_CONTAINS(load_error(path), "'fp16.enabled' twice");
}

TEST_F(LoadConfigTest, ValueErrorsAlsoNameTheFile) {
  std::string path =
      write("stage.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 9}})");
  std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, "zero_optimization.stage");
  EXPECT_CONTAINS(msg, path);
}

TEST_F(LoadConfigTest, GoodFileLoads) {
  std::string path =
      write("good.json", R"({"train_batch_size": 8, "gradient_accumulation_steps": 2})");
  Config c = load_config(path, 2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
}

// DeepSpeed builds a (data_parallel_size, sequence_parallel_size) mesh from these two keys and
// resolves the batch with the mesh's data-parallel size: on 8 ranks, 4 x 2 gives GAS 2 for
// train_batch_size 32 / micro-batch 4 there, where 8-way data parallelism would give 1.
TEST(ConfigParallelSizes, SequenceParallelismIsRefused) {
  json doc = {{"train_batch_size", 32},
              {"train_micro_batch_size_per_gpu", 4},
              {"data_parallel_size", 4},
              {"sequence_parallel_size", 2}};
  std::string msg = error_of(doc, 8);
  EXPECT_CONTAINS(msg, "'sequence_parallel_size' is 2");
  EXPECT_CONTAINS(msg, "not provided");
  EXPECT_NO_THROW(parse_config(with({{"sequence_parallel_size", 1}}), 2));
}

TEST(ConfigParallelSizes, DataParallelSizeMustMatchTheWorld) {
  json mesh = with({{"data_parallel_size", 4}, {"sequence_parallel_size", 1}});
  std::string msg = error_of(mesh, 8);
  EXPECT_CONTAINS(msg, "'data_parallel_size' is 4");
  EXPECT_CONTAINS(msg, "data-parallel world size is 8");
  EXPECT_EQ(parse_config(mesh, 4).gradient_accumulation_steps, 1);  // equal: fine
  // Alone it builds no mesh in DeepSpeed, which ignores it: a warning naming both values.
  std::vector<std::string> warnings;
  parse_config(with({{"data_parallel_size", 4}}), 8, {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "'data_parallel_size' is 4");
  EXPECT_CONTAINS(warnings[0], "data-parallel world size is 8");
}

// OpenRLHF, TRL and Accelerate hand DeepSpeed these ZeRO sizes as "auto"; DeepSpeed's pydantic
// model drops a leftover "auto", keeping the default. The hidden-size ones are filled when
// ConfigOverrides::hidden_size is given, as Hugging Face fills them.
TEST(ConfigAuto, LeftoverZeroSizesKeepTheirDefaultsWithAWarning) {
  const char* kKeys[] = {"sub_group_size",
                         "stage3_max_live_parameters",
                         "stage3_max_reuse_distance",
                         "stage3_prefetch_bucket_size",
                         "stage3_param_persistence_threshold",
                         "reduce_bucket_size"};
  json zero = {{"stage", 3}};
  for (const char* k : kKeys) zero[k] = "auto";
  json doc = with({{"zero_optimization", zero}});
  std::vector<std::string> warnings;
  Config c = parse_config(doc, 1, {}, &warnings);
  const ZeroConfig defaults;
  EXPECT_EQ(c.zero_optimization.sub_group_size, defaults.sub_group_size);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, defaults.stage3_max_live_parameters);
  EXPECT_EQ(c.zero_optimization.stage3_max_reuse_distance, defaults.stage3_max_reuse_distance);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size,
            defaults.stage3_prefetch_bucket_size);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold,
            defaults.stage3_param_persistence_threshold);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, defaults.reduce_bucket_size);
  ASSERT_EQ(warnings.size(), 6u);
  for (const char* k : kKeys) {
    const std::string path = std::string("'zero_optimization.") + k + "' is \"auto\"";
    EXPECT_EQ(std::count_if(warnings.begin(), warnings.end(),
                            [&](const std::string& w) { return w.find(path) != w.npos; }),
              1)
        << k;
  }
  EXPECT_EQ(c.raw["zero_optimization"]["sub_group_size"], "auto");  // the config as given

  // With the hidden size, Hugging Face's three are filled; the other three keep their defaults.
  ConfigOverrides over;
  over.hidden_size = 64;
  warnings.clear();
  c = parse_config(doc, 1, over, &warnings);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 640);
  EXPECT_EQ(c.zero_optimization.sub_group_size, defaults.sub_group_size);
  EXPECT_EQ(warnings.size(), 3u);

  // An "auto" that would change what is trained stays an error naming the key.
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"stage", "auto"}}}})),
                  "zero_optimization.stage");
}

}  // namespace config_test
}  // namespace deepspeed
