// stage3_module_granularity_threshold: DeepSpeed's module granularity, its preorder choice of leaf
// modules, and which ZeroUnits are folded into the unit around them (no communication).
#include "zero/stage3/unit_granularity.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/zero_unit.h"
#include "support/expect.h"

namespace unit_granularity_test {

namespace {
using deepspeed::ZeroUnit;
using deepspeed::ZeroUnitBase;
using deepspeed::zero::choose_fetch_units;
using deepspeed::zero::describe_fetch_units;
using deepspeed::zero::FetchUnits;
using Small = ZeroUnit<torch::nn::Linear>;  // 4x4 + 4 = 20 parameters, no children: one layer

std::shared_ptr<Small> small() { return std::make_shared<Small>(torch::nn::Linear(4, 4)); }

// ln (8) and two small units: 4 layers with itself, 48 parameters: granularity 12.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
    a = register_module("a", small());
    b = register_module("b", small());
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::nn::LayerNorm ln{nullptr};
  std::shared_ptr<Small> a, b;
};
TORCH_MODULE(Block);
using BlockUnit = ZeroUnit<Block>;

// embed (40) + two blocks (48 each) + head (40) over 1 + 4 + 4 + 1 + 1 layers: granularity 16.
struct Model : torch::nn::Module {
  Model() {
    embed = register_module("embed", torch::nn::Embedding(10, 4));
    block0 = register_module("block0", std::make_shared<BlockUnit>(Block()));
    block1 = register_module("block1", std::make_shared<BlockUnit>(Block()));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(4, 10).bias(false)));
  }
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<BlockUnit> block0, block1;
  torch::nn::Linear head{nullptr};
};

std::vector<const ZeroUnitBase*> pointers_to_const(const std::vector<ZeroUnitBase*>& v) {
  return {v.begin(), v.end()};
}
}  // namespace

TEST(UnitGranularity, ThresholdZeroKeepsEveryUnit) {
  Model m;
  FetchUnits f = choose_fetch_units(m, 0);
  EXPECT_EQ(f.units.size(), 6u);  // block0, its a and b, block1, its a and b
  for (const auto& folded : f.folded) EXPECT_TRUE(folded.empty());
  EXPECT_EQ(describe_fetch_units(f, 0), "");
}

TEST(UnitGranularity, AUnitAtTheThresholdTakesInTheUnitsNestedInIt) {
  Model m;
  FetchUnits f = choose_fetch_units(m, 12);  // the blocks' granularity: inclusive, as DeepSpeed's
  ASSERT_EQ(f.units.size(), 2u);
  EXPECT_EQ(f.units[0], m.block0.get());
  EXPECT_EQ(f.units[1], m.block1.get());
  auto& b0 = m.block0->inner();
  auto& b1 = m.block1->inner();
  EXPECT_EQ(pointers_to_const(f.folded[0]),
            (std::vector<const ZeroUnitBase*>{b0->a.get(), b0->b.get()}));
  EXPECT_EQ(pointers_to_const(f.folded[1]),
            (std::vector<const ZeroUnitBase*>{b1->a.get(), b1->b.get()}));
  EXPECT_EQ(f.leaves, (std::vector<std::string>{"block0", "block1"}));
  EXPECT_EQ(f.smallest_granularity, 12);
  EXPECT_EQ(describe_fetch_units(f, 12),
            "[deepspeed] stage3_module_granularity_threshold 12: 2 leaf modules ('block0', "
            "'block1'); 4 ZeroUnits folded into the unit around them, 2 gathered on their own\n");
}

TEST(UnitGranularity, BelowEveryGranularityNothingIsFoldedAndTheWarningSaysWhatWould) {
  Model m;
  FetchUnits f = choose_fetch_units(m, 11);
  EXPECT_EQ(f.units.size(), 6u);
  EXPECT_TRUE(f.leaves.empty());
  const std::string said = describe_fetch_units(f, 11);
  EXPECT_CONTAINS(said, "warning: stage3_module_granularity_threshold 11 is below the smallest");
  EXPECT_CONTAINS(said, "12 ('block0')");
  EXPECT_CONTAINS(said, "Set it to at least 12");
}

TEST(UnitGranularity, AModelThatIsALeafKeepsItsOutermostUnits) {
  // The model (16) is the leaf: its units have no unit around them (folding them would put them
  // into the always-gathered root), so they stay, and the units in them are folded.
  Model m;
  FetchUnits f = choose_fetch_units(m, 16);
  EXPECT_EQ(f.leaves, (std::vector<std::string>{""}));
  ASSERT_EQ(f.units.size(), 2u);
  EXPECT_EQ(f.folded[0].size(), 2u);
  EXPECT_CONTAINS(describe_fetch_units(f, 16), "1 leaf module (the model); 4 ZeroUnits folded");
}

namespace {
// A plain module holding two small units (2 + 1 layers, 40 parameters: 13) beside a large Linear
// inside one unit (272 + 40 over 5 layers: 62).
struct PairImpl : torch::nn::Module {
  PairImpl() {
    a = register_module("a", small());
    b = register_module("b", small());
  }
  std::shared_ptr<Small> a, b;
};
TORCH_MODULE(Pair);

struct WrapperImpl : torch::nn::Module {
  WrapperImpl() {
    big = register_module("big", torch::nn::Linear(16, 16));
    pair = register_module("pair", Pair());
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::nn::Linear big{nullptr};
  Pair pair{nullptr};
};
TORCH_MODULE(Wrapper);

struct WrappedModel : torch::nn::Module {
  WrappedModel() {
    outer = register_module("outer", std::make_shared<ZeroUnit<Wrapper>>(Wrapper()));
  }
  std::shared_ptr<ZeroUnit<Wrapper>> outer;
};
}  // namespace

TEST(UnitGranularity, UnitsUnderAPlainLeafModuleJoinTheUnitAroundIt) {
  WrappedModel m;
  FetchUnits f = choose_fetch_units(m, 13);
  EXPECT_EQ(f.leaves, (std::vector<std::string>{"outer.pair"}));
  ASSERT_EQ(f.units.size(), 1u);
  EXPECT_EQ(f.units[0], m.outer.get());
  auto& pair = m.outer->inner()->pair;
  EXPECT_EQ(pointers_to_const(f.folded[0]),
            (std::vector<const ZeroUnitBase*>{pair->a.get(), pair->b.get()}));
  EXPECT_EQ(choose_fetch_units(m, 12).units.size(), 3u);  // below 13: nothing is a leaf
}

namespace {
// A large parameter of its own and the blocks in a container: (1000 + 96) / 9 = 121. Were the
// LayerList not a container (8 layers + 1, 96 parameters: 10) it would be a leaf at 11.
struct ListModel : torch::nn::Module {
  ListModel() {
    big = register_parameter("big", torch::zeros({1000}));
    layers = register_module("layers", deepspeed::LayerList());
    layers->push_back(Block());
    layers->push_back(Block());
  }
  torch::Tensor big;
  deepspeed::LayerList layers{nullptr};
};
}  // namespace

TEST(UnitGranularity, ContainersAreNeverLeaves) {
  ListModel m;
  FetchUnits f = choose_fetch_units(m, 11);
  EXPECT_TRUE(f.leaves.empty());
  EXPECT_EQ(f.units.size(), 6u);
  EXPECT_EQ(f.smallest_granularity, 12);  // the blocks, not the list
  f = choose_fetch_units(m, 12);
  EXPECT_EQ(f.leaves, (std::vector<std::string>{"layers.0", "layers.1"}));
  EXPECT_EQ(f.units.size(), 2u);
}

namespace {
deepspeed::zero::LeafRules named(std::vector<std::string> classes, std::vector<std::string> names,
                                 std::vector<std::string> suffixes) {
  deepspeed::zero::LeafRules rules;
  rules.modules.classes = std::move(classes);
  rules.modules.names = std::move(names);
  rules.modules.name_suffixes = std::move(suffixes);
  return rules;
}
}  // namespace

TEST(UnitGranularity, LeafModulesNamedByTypeFoldTheUnitsInThem) {
  // A ZeroUnit matches by the module it wraps: with and without namespace and "Impl".
  for (const std::string type :
       {"unit_granularity_test::(anonymous namespace)::BlockImpl", "BlockImpl", "Block"}) {
    Model m;
    FetchUnits f = choose_fetch_units(m, named({type}, {}, {}));
    EXPECT_EQ(f.leaves, (std::vector<std::string>{"block0", "block1"})) << type;
    EXPECT_EQ(f.units.size(), 2u) << type;
    EXPECT_TRUE(f.unmatched.empty()) << type;
  }
}

TEST(UnitGranularity, LeafModulesNamedByNameOrSuffix) {
  Model m;
  FetchUnits f = choose_fetch_units(m, named({}, {"block1"}, {}));
  EXPECT_EQ(f.leaves, (std::vector<std::string>{"block1"}));
  EXPECT_EQ(f.units.size(), 4u);  // block0 and its two, block1 with its two folded
  f = choose_fetch_units(m, named({}, {}, {"0"}));  // "block0"
  EXPECT_EQ(f.leaves, (std::vector<std::string>{"block0"}));
  EXPECT_EQ(describe_fetch_units(f, named({}, {}, {"0"})),
            "[deepspeed] leaf_module: 1 leaf module ('block0'); 2 ZeroUnits folded into the unit "
            "around them, 4 gathered on their own\n");
}

TEST(UnitGranularity, ALeafModuleEntryThatMatchesNothingIsWarnedAbout) {
  Model m;
  const auto rules = named({"Mixtral"}, {"block9"}, {"block1"});
  FetchUnits f = choose_fetch_units(m, rules);
  EXPECT_EQ(f.unmatched, (std::vector<std::string>{"classes 'Mixtral'", "names 'block9'"}));
  const std::string said = describe_fetch_units(f, rules);
  EXPECT_CONTAINS(said,
                  "warning: zero_optimization.leaf_module classes 'Mixtral' matches no module");
  EXPECT_CONTAINS(said, "warning: zero_optimization.leaf_module names 'block9' matches no module");
  EXPECT_CONTAINS(said, "1 leaf module ('block1')");
}

}  // namespace unit_granularity_test
