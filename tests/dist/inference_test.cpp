// deepspeed::init_inference (AutoTP): the placement it picks on the example GPT, logits of tp 1,
// 2 and 4 equal to the unsplit model's, weights read from ZeRO-3 and pipeline checkpoints of
// gpt_train and from a safetensors file, gpt_generate --tensor_parallel under dsrun, and each
// bad input named.
#include "deepspeed/inference.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>

#include "checkpoint/safetensors.h"
#include "checkpoint/shard_plan.h"
#include "checkpoint/torch_save.h"
#include "deepspeed/comm.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "gpt/generate.h"
#include "gpt/model.h"
#include "gpt/pipeline_model.h"
#include "support/commands.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/autotp_trees.h"
#include "support/expect.h"

namespace inference_test {

namespace {
using deepspeed::comm::CommunicatorPtr;

std::mutex rng_mutex;  // the rank threads share the global RNG

const gpt::GPTConfig kModel{256, 32, 2, 4, 32};

std::shared_ptr<gpt::GPTImpl> seeded_gpt(const gpt::GPTConfig& c, uint64_t seed = 13) {
  std::lock_guard<std::mutex> lock(rng_mutex);
  torch::manual_seed(seed);
  return std::make_shared<gpt::GPTImpl>(c);
}

torch::Tensor prompts() {
  auto gen = at::detail::createCPUGenerator(3);
  return torch::randint(256, {3, 12}, gen, torch::kLong);
}

TEST(AutoTP, PlacesTheGptLikeDeepSpeed) {
  run_ranks(2, [](CommunicatorPtr comm) {
    auto engine = deepspeed::init_inference(seeded_gpt(kModel), {.tp_size = 2, .comm = comm});
    std::map<std::string, std::pair<deepspeed::ShardedLinear::Kind, int>> got;
    for (const auto& s : engine->sharded()) got[s.name] = {s.kind, s.fused_parts};
    using K = deepspeed::ShardedLinear;
    EXPECT_EQ(got.size(), 9u);  // 4 per block, and the head
    EXPECT_EQ(got["block0.attn.qkv"], std::make_pair(K::kColumn, 3));
    EXPECT_EQ(got["block0.attn.proj"], std::make_pair(K::kRow, 1));
    EXPECT_EQ(got["block1.mlp.fc"], std::make_pair(K::kColumn, 1));
    EXPECT_EQ(got["block1.mlp.proj"], std::make_pair(K::kRow, 1));
    // DeepSpeed's LmHeadLinearAllreduce: the head keeps its input columns, the vocabulary whole.
    EXPECT_EQ(got["head"], std::make_pair(K::kRow, 1));
    auto params = engine->module().named_parameters();
    EXPECT_EQ(params["block0.attn.qkv.weight"].sizes(), (std::vector<int64_t>{48, 32}));
    EXPECT_EQ(params["block0.mlp.proj.weight"].sizes(), (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(params["head.weight"].sizes(), (std::vector<int64_t>{256, 16}));
    EXPECT_EQ(params["wte.weight"].sizes(), (std::vector<int64_t>{256, 32}));
  });
}

// AutoTP on module trees it was not written for (support/autotp_trees.h: GPT-NeoX-like and
// BERT-like).
using dstest::TreeNode;

std::map<std::string, std::pair<deepspeed::ShardedLinear::Kind, int>> placement(
    std::shared_ptr<TreeNode> root) {
  auto engine = deepspeed::init_inference(root, {.tp_size = 1});
  std::map<std::string, std::pair<deepspeed::ShardedLinear::Kind, int>> out;
  for (const auto& s : engine->sharded()) out[s.name] = {s.kind, s.fused_parts};
  return out;
}

TEST(AutoTP, PlacesNeoXAndBertLikeLayers) {
  using K = deepspeed::ShardedLinear;
  auto neox = dstest::neox_like_tree();
  auto got = placement(neox);
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(got["embed_out"], std::make_pair(K::kRow, 1));  // the LM head
  EXPECT_EQ(got["layers.0.attention.query_key_value"], std::make_pair(K::kColumn, 3));
  EXPECT_EQ(got["layers.0.attention.dense"], std::make_pair(K::kRow, 1));
  EXPECT_EQ(got["layers.0.mlp.dense_h_to_4h"], std::make_pair(K::kColumn, 1));
  EXPECT_EQ(got["layers.0.mlp.dense_4h_to_h"], std::make_pair(K::kRow, 1));

  // Two BERT layers: no LayerNorm is a direct child of a layer; the stack is what marks them.
  auto bert = dstest::bert_like_tree();
  got = placement(bert);
  EXPECT_EQ(got.size(), 12u);
  EXPECT_EQ(got["encoder.layer0.attention.self.query"].first, K::kColumn);
  EXPECT_EQ(got["encoder.layer0.attention.output.dense"].first, K::kRow);
  EXPECT_EQ(got["encoder.layer0.intermediate.dense"].first, K::kColumn);
  EXPECT_EQ(got["encoder.layer0.output.dense"].first, K::kRow);
  EXPECT_EQ(got["encoder.layer1.intermediate.dense"].first, K::kColumn);
}

// HF's Phi: attention and MLP side by side after one LayerNorm, so the attention output
// self_attn.dense is neither before a LayerNorm nor the layer's last Linear. DeepSpeed's AutoTP
// names it a row layer; here it used to be placed by columns (a dotted suffix attn.dense does
// not match self_attn.dense), and tp 2 failed in the forward with an unnamed shape error.
TEST(AutoTP, PlacesPhiLikeLayers) {
  using K = deepspeed::ShardedLinear;
  auto got = placement(dstest::phi_like_tree());
  EXPECT_EQ(got["layers.0.self_attn.q_proj"], std::make_pair(K::kColumn, 1));
  EXPECT_EQ(got["layers.0.self_attn.dense"], std::make_pair(K::kRow, 1));
  EXPECT_EQ(got["layers.1.self_attn.dense"], std::make_pair(K::kRow, 1));
  EXPECT_EQ(got["layers.0.mlp.fc1"], std::make_pair(K::kColumn, 1));
  EXPECT_EQ(got["layers.0.mlp.fc2"], std::make_pair(K::kRow, 1));
  // The LM head at the root: split by input columns, all-reduced (DeepSpeed's
  // LmHeadLinearAllreduce).
  EXPECT_EQ(got["lm_head"], std::make_pair(K::kRow, 1));
  EXPECT_EQ(got.size(), 13u);
}

// A head tied to the input embedding (one tensor under two names) cannot be cut by columns
// without cutting the embedding too: it stays whole, and so does the embedding.
TEST(AutoTP, ATiedHeadStaysWhole) {
  run_ranks(2, [](CommunicatorPtr comm) {
    auto tree = dstest::tied_head_tree();
    auto engine = deepspeed::init_inference(tree, {.tp_size = 2, .comm = comm});
    for (const auto& s : engine->sharded()) EXPECT_NE(s.name, "lm_head");
    auto params = tree->named_parameters();
    EXPECT_EQ(params["lm_head.weight"].sizes(), (std::vector<int64_t>{16, 8}));
    EXPECT_TRUE(params["lm_head.weight"].is_same(params["embed_in.weight"]));
    EXPECT_EQ(params["layers.0.attention.dense.weight"].sizes(), (std::vector<int64_t>{8, 4}));
  });
}

// The engine dropped at once (its scope ends; or init_inference's result discarded): the model
// stays split, so its row layers and head must still all-reduce. They stopped at the engine's
// destructor and returned each rank's partial sums: wrong logits, silently.
TEST(AutoTP, TheModelStaysCorrectAfterTheEngineIsGone) {
  auto ref_model = seeded_gpt(kModel);
  ref_model->eval();
  torch::NoGradGuard no_grad;
  const auto idx = prompts();
  const auto ref = ref_model->logits(idx);
  run_ranks(2, [&](CommunicatorPtr comm) {
    torch::NoGradGuard no_grad;
    auto model = seeded_gpt(kModel);
    { auto engine = deepspeed::init_inference(model, {.tp_size = 2, .comm = comm}); }
    EXPECT_EQ(model->named_parameters()["block0.mlp.proj.weight"].size(1), 64);  // still split
    EXPECT_LT((model->logits(idx) - ref).abs().max().item<double>(), 1e-5);
    gpt::KVCache cache;
    auto first = model->logits_cached(idx.narrow(1, 0, 7), cache);
    auto rest = model->logits_cached(idx.narrow(1, 7, 5), cache);
    EXPECT_LT((torch::cat({first, rest}, 1) - ref).abs().max().item<double>(), 1e-5);
  });
}

// A .safetensors file has no tags: a tag given with one named nothing and was ignored.
TEST(AutoTP, ATagWithASafetensorsFileIsRefused) {
  dstest::TempDir dir("autotp_tag");
  auto source = seeded_gpt(kModel);
  deepspeed::checkpoint::NamedTensors tensors;
  for (auto& p : source->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  for (auto& b : source->named_buffers()) tensors.emplace_back(b.key(), b.value());
  const std::string file = dir / "model.safetensors";
  deepspeed::checkpoint::write_safetensors(file, tensors);
  const auto msg = dstest::message_of<deepspeed::ConfigError>([&] {
    (void)deepspeed::init_inference(seeded_gpt(kModel),
                                    {.checkpoint = file, .tag = "global_step5"});
  });
  EXPECT_CONTAINS(msg, "InferenceConfig::tag \"global_step5\"");
  EXPECT_CONTAINS(msg, file);
}

// Logits of the whole and of the kv-cached forward at tp 1, 2 and 4 (world 4: tp 1 and 2 run
// several identical groups) equal the unsplit model's.
TEST(AutoTP, LogitsOfTp124EqualTheUnsplitModel) {
  for (bool tied : {false, true}) {
    gpt::GPTConfig c = kModel;
    c.tie_embeddings = tied;
    auto ref_model = seeded_gpt(c);
    ref_model->eval();
    torch::NoGradGuard no_grad;
    const auto idx = prompts();
    const auto ref = ref_model->logits(idx);
    for (int tp : {1, 2, 4}) {
      run_ranks(
          4,
          [&](CommunicatorPtr comm) {
            torch::NoGradGuard no_grad;
            auto model = seeded_gpt(c);
            auto engine = deepspeed::init_inference(model, {.tp_size = tp, .comm = comm});
            const double diff = (model->logits(idx) - ref).abs().max().item<double>();
            EXPECT_LT(diff, 1e-5) << "tp " << tp << (tied ? " tied" : "");
            gpt::KVCache cache;
            auto first = model->logits_cached(idx.narrow(1, 0, 7), cache);
            auto rest = model->logits_cached(idx.narrow(1, 7, 5), cache);
            EXPECT_LT((torch::cat({first, rest}, 1) - ref).abs().max().item<double>(), 1e-5)
                << "kv-cached, tp " << tp;
          },
          std::chrono::seconds(60));
    }
  }
}

// A batch of prompts of different lengths (left padding, kv-cache, sampling with a seed) gives
// the unsplit model's tokens at tp 2; bf16 stays close to fp32.
TEST(AutoTP, BatchedSamplingAndBf16AtTp2) {
  std::vector<std::vector<int64_t>> batch = {{84, 104, 101, 32}, {65}, {1, 2, 3, 4, 5, 6, 7}};
  gpt::SamplingOptions sampling;
  sampling.greedy = false;
  sampling.top_k = 20;
  sampling.seed = 5;
  auto ref_model = seeded_gpt(kModel);
  ref_model->eval();
  torch::NoGradGuard no_grad;
  const auto want = gpt::generate(*ref_model, batch, 10, sampling);
  const auto idx = prompts();
  const auto ref = ref_model->logits(idx);
  run_ranks(2, [&](CommunicatorPtr comm) {
    torch::NoGradGuard no_grad;
    auto model = seeded_gpt(kModel);
    auto engine = deepspeed::init_inference(model, {.tp_size = 2, .comm = comm});
    EXPECT_EQ(gpt::generate(*model, batch, 10, sampling), want);
    auto half = seeded_gpt(kModel);
    auto engine16 =
        deepspeed::init_inference(half, {.tp_size = 2, .dtype = torch::kBFloat16, .comm = comm});
    EXPECT_EQ(half->named_parameters()["block0.attn.qkv.weight"].scalar_type(), torch::kBFloat16);
    const auto got = half->logits(idx).to(torch::kFloat);
    // bf16 keeps 8 bits of mantissa: logits of magnitude ~1 agree to a few 1e-2.
    EXPECT_LT((got - ref).abs().max().item<double>(), 0.1 * ref.abs().max().item<double>());
  });
}

// The same weights from a safetensors file, a torch.save file (pytorch_model.bin, the default of
// ds_to_fp32 and save_16bit_model) and export folders as ds_to_fp32 writes them (split into
// shards with an index, in either format, or one pytorch_model.bin; the index may be named
// itself), each read slice by slice.
TEST(AutoTP, ReadsWeightsFilesAndExportFoldersSliceBySlice) {
  dstest::TempDir dir("autotp_st");
  auto source = seeded_gpt(kModel, 99);
  deepspeed::checkpoint::NamedTensors tensors;
  for (auto& p : source->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  for (auto& b : source->named_buffers()) tensors.emplace_back(b.key(), b.value());
  deepspeed::checkpoint::write_safetensors(dir / "model.safetensors", tensors);
  auto& fs = deepspeed::checkpoint::posix_file_system();
  deepspeed::checkpoint::write_torch_save(fs, dir / "pytorch_model.bin", tensors);
  using deepspeed::checkpoint::WeightsFormat;
  const auto sharded_bin = deepspeed::checkpoint::write_hf_export(
      fs, dir / "sharded_bin", WeightsFormat::torch_save, tensors, 16384);
  ASSERT_GT(sharded_bin.plan.shards.size(), 2u);
  deepspeed::checkpoint::write_hf_export(fs, dir / "sharded_st", WeightsFormat::safetensors,
                                         tensors, 16384);
  deepspeed::checkpoint::write_hf_export(fs, dir / "single", WeightsFormat::torch_save, tensors,
                                         uint64_t(1) << 30);
  torch::NoGradGuard no_grad;
  const auto idx = prompts();
  const auto ref = source->logits(idx);
  for (const std::string file :
       {"model.safetensors", "pytorch_model.bin", "sharded_bin", "sharded_st", "single",
        "sharded_st/model.safetensors.index.json"}) {
    SCOPED_TRACE(file);
    run_ranks(2, [&](CommunicatorPtr comm) {
      torch::NoGradGuard no_grad;
      auto model = seeded_gpt(kModel, 1);  // other weights: the file's must replace them
      auto engine = deepspeed::init_inference(
          model, {.tp_size = 2, .checkpoint = dir / file, .comm = comm});
      EXPECT_LT((model->logits(idx) - ref).abs().max().item<double>(), 1e-5);
    });
  }
}

// The last line of a dsrun log, without dsrun's "[rank 0] " prefix.
std::string last_line(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  std::string line = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  const std::string prefix = "[rank 0] ";
  return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line;
}

// Two micro-batches of 4 sequences of 12 tokens (inputs, and their shift as labels): English
// text, what gpt_train learnt (on random bytes every model is about equally bad, and a wrongly
// loaded one hardly differs).
std::vector<std::pair<torch::Tensor, torch::Tensor>> eval_micro_batches() {
  const std::string text =
      "You will be given a chance to take a long trip. Do not put off until tomorrow what can be "
      "done today. A fortune is hidden in the text of the day.";
  std::vector<int64_t> bytes(text.begin(), text.begin() + 8 * 13);
  const auto tokens = torch::tensor(bytes, torch::kLong).reshape({8, 13});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int64_t m = 0; m < 2; ++m) {
    const auto rows = tokens.narrow(0, 4 * m, 4);
    out.emplace_back(rows.narrow(1, 0, 12).contiguous(), rows.narrow(1, 1, 12).contiguous());
  }
  return out;
}

// The mean cross-entropy of `logits` ([B, T, V]) against `targets` ([B, T]): gpt_pipeline's loss.
double mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}))
      .item<double>();
}

// The reference that does not go through gpt::checkpoint_names: the pipeline that saved `ck`
// (gpt_pipeline on `stages` stages, config `cfg` with 2 micro-batches a step at data-parallel size
// 1) loads its own layer files (load_module_only) and returns eval_batch's mean loss over
// eval_micro_batches().
double pipeline_eval_loss(const std::string& ck, const std::string& cfg,
                          const gpt::GPTConfig& model, int stages) {
  const auto batches = eval_micro_batches();
  double loss = 0.0;
  std::mutex mu;
  run_ranks(stages, [&](CommunicatorPtr comm) {
    deepspeed::pipe::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(model);
    args.model.num_stages = stages;
    args.config = cfg;
    args.comm = comm;
    args.device = "cpu";
    auto engine = deepspeed::pipe::initialize_pipeline(args);
    EXPECT_FALSE(engine->load_checkpoint(ck, "", true, false, false, /*load_module_only=*/true)
                     .load_path.empty());
    size_t m = 0;
    const double mine = engine->eval_batch([&] {
      const auto& b = batches.at(m++);
      return deepspeed::pipe::MicroBatch{b.first, b.second};
    });
    EXPECT_EQ(m, batches.size());
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) loss = mine;
  });
  return loss;
}

// The mean loss of eval_micro_batches() from `logits_of` (tokens -> [B, T, V] logits).
double loss_from_logits(const std::function<torch::Tensor(const torch::Tensor&)>& logits_of) {
  std::vector<torch::Tensor> inputs, targets;
  for (auto& [x, y] : eval_micro_batches()) {
    inputs.push_back(x);
    targets.push_back(y);
  }
  return mean_cross_entropy(logits_of(torch::cat(inputs)), torch::cat(targets));
}

// gpt_train saves (ZeRO-3 at world 2; a 2-stage pipeline); the whole model loaded with
// gpt::load_weights and tp 2 through init_inference give the same logits and greedy tokens,
// and gpt_generate --tensor_parallel 2 under dsrun prints the same continuation. Both of those
// read the pipeline's layer files through gpt::checkpoint_names, so for the pipeline checkpoint
// their loss on a batch is also compared with that of the pipeline itself (loaded from its own
// layer files, eval_batch): a wrong name mapping (blocks in reverse, a head read from the
// embedding) loads the same wrong model on both sides and only this comparison sees it.
TEST(AutoTP, GeneratesFromZero3AndPipelineCheckpoints) {
  dstest::TempDir dir("autotp_ck");
  const std::string model = " --n_layer 2 --n_head 4 --n_embd 32 --block_size 32";
  struct Case {
    const char* name;
    int stage;
    const char* extra;
  };
  for (Case c : {Case{"zero3", 3, ""}, Case{"pipe", 1, " --pipeline_stages 2"}}) {
    const std::string cfg = dir / (std::string(c.name) + ".json"), ck = dir / c.name;
    std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
        "zero_optimization": {"stage": )"
                       << c.stage << "}}";
    const std::string train = dstest::dsrun_command(
        2, "gpt_train --deepspeed_config " + cfg + model + c.extra + " --steps 30 --save_dir " + ck +
               " --save_interval 30",
        dir / "train.log");
    ASSERT_EQ(std::system(train.c_str()), 0) << c.name << dstest::read_bytes(dir / "train.log");

    gpt::GPTConfig config{256, 32, 2, 4, 32};
    auto whole = std::make_shared<gpt::GPTImpl>(config);
    gpt::load_weights(*whole, ck);
    whole->eval();
    torch::NoGradGuard no_grad;
    std::vector<int64_t> prompt;
    for (unsigned char ch : std::string("The ")) prompt.push_back(ch);
    const auto ref_tokens = gpt::generate(*whole, {prompt}, 16, {}).front();
    const auto idx = prompts();
    const auto ref = whole->logits(idx);
    // Only summation orders differ from the pipeline's loss (about 1e-7 relative); blocks 0 and 1
    // swapped move it by 3e-3 relative.
    const bool pipe = std::string(c.name) == "pipe";
    const double pipe_loss = pipe ? pipeline_eval_loss(ck, cfg, config, 2) : 0.0;
    if (pipe) {
      const double whole_loss = loss_from_logits([&](auto& x) { return whole->logits(x); });
      EXPECT_NEAR(whole_loss, pipe_loss, 2e-6 * pipe_loss) << "gpt::load_weights";
    }
    run_ranks(2, [&](CommunicatorPtr comm) {
      torch::NoGradGuard no_grad;
      auto split = std::make_shared<gpt::GPTImpl>(config);
      auto engine = deepspeed::init_inference(
          split, {.tp_size = 2,
                  .checkpoint = ck,
                  .checkpoint_names =
                      [config](const std::string& n) { return gpt::checkpoint_names(n, config); },
                  .comm = comm});
      EXPECT_LT((split->logits(idx) - ref).abs().max().item<double>(), 1e-5) << c.name;
      EXPECT_EQ(gpt::generate(*split, {prompt}, 16, {}).front(), ref_tokens) << c.name;
      if (pipe) {
        const double tp_loss = loss_from_logits([&](auto& x) { return split->logits(x); });
        EXPECT_NEAR(tp_loss, pipe_loss, 2e-6 * pipe_loss) << "init_inference tp 2";
      }
    });

    const std::string gen = dstest::dsrun_command(
        2, "gpt_generate --tensor_parallel 2 --load_dir " + ck + model +
               " --prompt 'The ' --max_new_tokens 16 --greedy",
        dir / "gen.log");
    ASSERT_EQ(std::system(gen.c_str()), 0) << dstest::read_bytes(dir / "gen.log");
    std::string want = "The ";
    for (int64_t t : ref_tokens) want.push_back(static_cast<char>(t));
    EXPECT_EQ(last_line(dstest::read_bytes(dir / "gen.log")), want) << c.name;
  }
}

// A fused q/k/v of a grouped-query attention (q 8 wide, k and v 2 each: 12 output features for 8
// input features) cannot be cut into equal thirds: refused at tp 2 naming the layer, where its
// equal thirds of 4 rows were cut across q, k and v silently. At tp 1 nothing is cut; it loads.
TEST(AutoTP, AGroupedQueryFusedProjectionIsRefused) {
  auto gqa_tree = [] {
    auto root = std::make_shared<dstest::TreeNode>();
    auto layer = root->child("layers")->child("0");
    layer->norm("input_layernorm");
    auto attn = layer->child("attention");
    attn->linear("query_key_value", 8, 12);  // the q/k/v heads: 8 + 2 + 2
    attn->linear("dense", 8, 8);
    auto mlp = layer->child("mlp");
    mlp->linear("dense_h_to_4h", 8, 32);
    mlp->linear("dense_4h_to_h", 32, 8);
    return root;
  };
  run_ranks(2, [&](CommunicatorPtr comm) {
    const std::string msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::init_inference(gqa_tree(), {.tp_size = 2, .comm = comm}); });
    EXPECT_CONTAINS(msg, "fused q/k/v layer layers.0.attention.query_key_value has 12 output "
                         "features for 8 input features, not 3 x 8");
  });
  EXPECT_EQ(placement(gqa_tree()).size(), 4u);
}

// AutoTP's blocks need a LayerNorm: an RMSNorm model has none, so at tp 2 nothing is split and
// every rank runs the whole model. Said on stderr (once, by rank 0), naming the model, instead of
// silently.
struct RMSNorm : torch::nn::Module {
  RMSNorm() { register_parameter("weight", torch::ones({8})); }
};
TEST(AutoTP, NoBlockFoundAtTp2IsWarned) {
  auto rms_tree = [] {
    auto root = std::make_shared<dstest::TreeNode>();
    auto layers = root->child("layers");
    for (const char* name : {"0", "1"}) {
      auto layer = layers->child(name);
      layer->register_module("norm", std::make_shared<RMSNorm>());
      layer->linear("q_proj", 8, 8);
      layer->linear("o_proj", 8, 8);
    }
    return root;
  };
  std::vector<size_t> sharded(2, 99);
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](CommunicatorPtr comm) {
    auto engine = deepspeed::init_inference(rms_tree(), {.tp_size = 2, .comm = comm});
    sharded[comm->rank()] = engine->sharded().size();
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sharded, (std::vector<size_t>{0, 0}));
  EXPECT_CONTAINS(err, "init_inference: tp_size 2, but AutoTP found no transformer block in the "
                       "model (dstest::TreeNode)");
  EXPECT_EQ(err.find("found no transformer block"), err.rfind("found no transformer block"))
      << "said once";
}

TEST(AutoTP, BadInputIsNamed) {
  dstest::TempDir dir("autotp_bad");
  auto write = [&](const std::string& name, const gpt::GPTConfig& c) {
    auto m = seeded_gpt(c);
    deepspeed::checkpoint::NamedTensors tensors;
    for (auto& p : m->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
    for (auto& b : m->named_buffers()) tensors.emplace_back(b.key(), b.value());
    deepspeed::checkpoint::write_safetensors(dir / name, tensors);
  };
  write("wide.safetensors", {256, 32, 2, 4, 64});
  write("shallow.safetensors", {256, 32, 1, 4, 32});
  deepspeed::checkpoint::write_torch_save(deepspeed::checkpoint::posix_file_system(),
                                          dir / "pytorch_model.bin",
                                          {{"wte.weight", torch::zeros({256, 32})}});
  dstest::write_bytes(dir / "notes.txt", "not weights");
  std::filesystem::create_directories(dir / "nothing");
  {  // a sharded folder that lost a shard
    auto m = seeded_gpt(kModel);
    deepspeed::checkpoint::NamedTensors tensors;
    for (auto& p : m->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
    for (auto& b : m->named_buffers()) tensors.emplace_back(b.key(), b.value());
    const auto sharded = deepspeed::checkpoint::write_hf_export(
        deepspeed::checkpoint::posix_file_system(), dir / "lost_shard",
        deepspeed::checkpoint::WeightsFormat::torch_save, tensors, 16384);
    ASSERT_GT(sharded.plan.shards.size(), 2u);
    std::filesystem::remove(dir / ("lost_shard/" + sharded.plan.shards[1].file));
  }
  run_ranks(3, [&](CommunicatorPtr comm) {
    // tp 3 does not divide 32 (the q/k/v rows, 4 heads x 8).
    auto msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::init_inference(seeded_gpt(kModel), {.tp_size = 3, .comm = comm}); });
    EXPECT_NE(msg.find("tp_size 3 does not divide the output features (32 per q/k/v) of "
                       "column-parallel layer block0.attn.qkv"),
              std::string::npos)
        << msg;
  });
  run_ranks(2, [&](CommunicatorPtr comm) {
    auto msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(
          seeded_gpt(kModel), {.tp_size = 2, .checkpoint = dir / "wide.safetensors", .comm = comm});
    });
    EXPECT_NE(msg.find("tensor \"wte.weight\" of '" + dir / "wide.safetensors" +
                       "' has shape [256, 64], the model's is [256, 32]"),
              std::string::npos)
        << msg;
    msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(
          seeded_gpt(kModel),
          {.tp_size = 2, .checkpoint = dir / "shallow.safetensors", .comm = comm});
    });
    EXPECT_NE(msg.find("has no tensor \"block1.ln1.weight\""), std::string::npos) << msg;
    // A torch.save file lacking a tensor, and a file that is no weights file, are named.
    msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(
          seeded_gpt(kModel),
          {.tp_size = 2, .checkpoint = dir / "pytorch_model.bin", .comm = comm});
    });
    EXPECT_CONTAINS(msg, dir / "pytorch_model.bin");
    EXPECT_CONTAINS(msg, "has no tensor");
    msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(seeded_gpt(kModel),
                                {.tp_size = 2, .checkpoint = dir / "notes.txt", .comm = comm});
    });
    EXPECT_CONTAINS(msg, "torch.save file '" + dir / "notes.txt" + "': not a zip archive");
    // A folder with neither a model's weights nor a checkpoint says what it looked for.
    msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(seeded_gpt(kModel),
                                {.tp_size = 2, .checkpoint = dir / "nothing", .comm = comm});
    });
    EXPECT_CONTAINS(msg, "init_inference: '" + dir / "nothing" +
                             "' holds neither a model's weights (model.safetensors, ");
    msg = dstest::message_of<deepspeed::CheckpointError>([&] {
      deepspeed::init_inference(seeded_gpt(kModel),
                                {.tp_size = 2, .checkpoint = dir / "lost_shard", .comm = comm});
    });
    EXPECT_CONTAINS(msg, "' named by index '" + dir / "lost_shard/pytorch_model.bin.index.json" +
                             "' does not exist");
    msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::init_inference(seeded_gpt(kModel), {.tp_size = 3, .comm = comm}); });
    EXPECT_NE(msg.find("tp_size 3 does not divide the world size 2"), std::string::npos) << msg;
  });
  // 6 heads of 8 at tp 4: 4 divides the 48 features of q, k and v (12 a rank, 1.5 heads), so
  // only head_dim tells; without it the first forward failed in the model's reshape, naming
  // nothing.
  run_ranks(4, [&](CommunicatorPtr comm) {
    const gpt::GPTConfig six_heads{256, 32, 1, 6, 48};
    auto msg = dstest::message_of<deepspeed::ConfigError>([&] {
      deepspeed::init_inference(seeded_gpt(six_heads), {.tp_size = 4, .head_dim = 8, .comm = comm});
    });
    EXPECT_CONTAINS(msg, "init_inference: tp_size 4 does not divide the 6 heads (head_dim 8, 48 "
                         "features per q/k/v) of column-parallel layer block0.attn.qkv");
    // tp 2 divides them (3 heads a rank).
    auto model = seeded_gpt(six_heads);
    auto engine = deepspeed::init_inference(model, {.tp_size = 2, .head_dim = 8, .comm = comm});
    EXPECT_EQ(model->named_parameters()["block0.attn.qkv.weight"].size(0), 3 * 24);
  });
  // The example's own check names the flag (gpt_generate --tensor_parallel).
  const std::string out = dir / "gen.log";
  const std::string cmd = dstest::bin_dir() + "/gpt_generate --load_dir " + dir.path() +
                          " --n_head 3 --n_embd 48 --tensor_parallel 2 --prompt x > " + out +
                          " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(dstest::read_bytes(out).find("--tensor_parallel 2 does not divide --n_head (3)"),
            std::string::npos)
      << dstest::read_bytes(out);
}

}  // namespace

}  // namespace inference_test
