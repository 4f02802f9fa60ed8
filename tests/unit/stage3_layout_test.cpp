// Which stage-3 unit each parameter belongs to, and the flat-buffer arithmetic (no communication).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "deepspeed/zero_unit.h"
#include "zero/stage3/unit_layout.h"

namespace stage3_layout_test {

namespace {
using deepspeed::ZeroUnit;
using deepspeed::zero::Stage3Layout;

struct LeafImpl : torch::nn::Module {
  LeafImpl(int64_t n, int64_t small) {
    w = register_parameter("w", torch::zeros({n}));
    b = register_parameter("b", torch::zeros({small}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor w, b;
};
TORCH_MODULE(Leaf);

// outer (unit) { own: v; inner (unit) { w, b } }, sibling (unit) shares outer's v, frozen f, top t.
struct OuterImpl : torch::nn::Module {
  OuterImpl() {
    v = register_parameter("v", torch::zeros({300}));
    inner = register_module("inner", std::make_shared<ZeroUnit<Leaf>>(Leaf(500, 7)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor v;
  std::shared_ptr<ZeroUnit<Leaf>> inner;
};
TORCH_MODULE(Outer);

struct SiblingImpl : torch::nn::Module {
  explicit SiblingImpl(torch::Tensor shared) {
    v = register_parameter("v", shared);
    own = register_parameter("own", torch::zeros({40}));
    frozen = register_parameter("frozen", torch::zeros({1000}), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::Tensor v, own, frozen;
};
TORCH_MODULE(Sibling);

struct Model : torch::nn::Module {
  Model() {
    outer = register_module("outer", std::make_shared<ZeroUnit<Outer>>(Outer()));
    sibling = register_module("sibling", std::make_shared<ZeroUnit<Sibling>>(Sibling(outer->inner()->v)));
    top = register_parameter("top", torch::zeros({11}));
  }
  std::shared_ptr<ZeroUnit<Outer>> outer;
  std::shared_ptr<ZeroUnit<Sibling>> sibling;
  torch::Tensor top;
};

std::vector<torch::Tensor> trainable(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) {
    bool seen = false;
    for (auto& q : out) seen = seen || q.is_same(p);
    if (p.requires_grad() && !seen) out.push_back(p);
  }
  return out;
}

bool holds(const deepspeed::zero::UnitSlots& slots, const torch::Tensor& p) {
  for (auto& q : slots.params)
    if (q.is_same(p)) return true;
  return false;
}
}  // namespace

TEST(Stage3Layout, InnermostUnitSharedAndOutsideParametersGoToTheRoot) {
  Model m;
  auto units = deepspeed::zero::find_units(m);
  ASSERT_EQ(units.size(), 3u);  // outer, its inner unit, sibling
  deepspeed::ZeroConfig z;
  z.stage3_param_persistence_threshold = 0;
  Stage3Layout l = deepspeed::zero::make_stage3_layout(units, trainable(m), 3, z);
  ASSERT_EQ(l.units.size(), 4u);
  auto inner = m.outer->inner()->inner->inner();  // the Leaf inside the nested unit
  auto unit_of = [&](const torch::Tensor& p) {
    for (size_t u = 0; u < l.units.size(); ++u)
      if (holds(l.units[u], p)) return static_cast<int>(u);
    return -1;
  };
  EXPECT_EQ(unit_of(inner->w), unit_of(inner->b));
  EXPECT_NE(unit_of(inner->w), 0);
  EXPECT_NE(unit_of(inner->w), unit_of(m.sibling->inner()->own));
  EXPECT_EQ(unit_of(m.outer->inner()->v), 0);  // shared by outer and sibling, neither nests
  EXPECT_EQ(unit_of(m.top), 0);                 // outside every unit
  EXPECT_EQ(unit_of(m.sibling->inner()->frozen), -1);
  // Flat arithmetic: offsets in order, buffers padded to 3 x 16, slices laid end to end.
  int64_t expect_offset = 0;
  for (auto& slots : l.units) {
    EXPECT_EQ(slots.layout.padded_numel % 48, 0);
    EXPECT_EQ(slots.partition_offset, expect_offset);
    expect_offset += slots.layout.partition_numel;
    for (size_t i = 1; i < slots.params.size(); ++i)
      EXPECT_EQ(slots.offsets[i], slots.offsets[i - 1] + slots.params[i - 1].numel());
  }
  EXPECT_EQ(l.partition_numel, expect_offset);
}

// A unit's parameter that a module outside every unit registers too (a head inside a unit tied to
// the root's embedding) joins the root: the root reads it outside the unit's forward, where a
// released unit parameter would be empty. One that a plain module inside unit `outer` registers
// besides the unit nested in it is `outer`'s, for the same reason one level down. Without the
// model (the units alone) both would stay in the nested unit.
TEST(Stage3Layout, AParameterGoesToTheUnitAroundEveryModuleRegisteringIt) {
  deepspeed::ZeroConfig z;
  z.stage3_param_persistence_threshold = 0;
  auto unit_holding = [](const Stage3Layout& l, const torch::Tensor& p) {
    int found = -1, holders = 0;
    for (size_t u = 0; u < l.units.size(); ++u)
      if (holds(l.units[u], p)) found = static_cast<int>(u), ++holders;
    EXPECT_EQ(holders, 1) << "one unit holds it";
    return found;
  };
  {
    Model m;
    auto inner = m.outer->inner()->inner->inner();
    m.register_parameter("tied_w", inner->w);  // the root registers the nested unit's w
    auto units = deepspeed::zero::find_units(m);
    const auto outside = deepspeed::zero::parameters_outside_units(m);
    EXPECT_EQ(outside.size(), 2u) << "top and tied_w: what the units register is not outside";
    EXPECT_TRUE(outside.count(inner->w.unsafeGetTensorImpl()));
    EXPECT_TRUE(outside.count(m.top.unsafeGetTensorImpl()));
    const auto owners = deepspeed::zero::parameter_units(m, units);
    auto l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z, &owners);
    EXPECT_EQ(unit_holding(l, inner->w), 0);
    EXPECT_EQ(unit_holding(l, inner->b), 2) << "the nested unit keeps its other parameter";
    EXPECT_EQ(unit_holding(l, m.outer->inner()->v), 0) << "shared by two sibling units";
    EXPECT_EQ(unit_holding(l, m.sibling->inner()->own), 3);
    EXPECT_EQ(unit_holding(l, m.top), 0);
    auto units_alone = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
    EXPECT_EQ(unit_holding(units_alone, inner->w), 2);
  }
  {
    Model m;
    auto inner = m.outer->inner()->inner->inner();
    // outer's own module registers it too (a ZeroUnit takes its module's parameters and children
    // as its own when built, so a later registration goes on the unit itself)
    m.outer->register_parameter("w_again", inner->w);
    auto units = deepspeed::zero::find_units(m);
    ASSERT_EQ(units.size(), 3u);
    ASSERT_EQ(units[0], m.outer.get());
    const auto owners = deepspeed::zero::parameter_units(m, units);
    auto l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z, &owners);
    EXPECT_EQ(unit_holding(l, inner->w), 1) << "outer, around both modules registering it";
    EXPECT_EQ(unit_holding(l, inner->b), 2);
    EXPECT_EQ(unit_holding(l, m.outer->inner()->v), 0);
  }
}

TEST(Stage3Layout, SmallParametersPersistWithinTheModelCap) {
  Model m;
  auto units = deepspeed::zero::find_units(m);
  deepspeed::ZeroConfig z;
  z.stage3_param_persistence_threshold = 50;  // inner.b (7) and sibling.own (40) qualify
  z.stage3_model_persistence_threshold = 45;  // ... but only 45 elements may persist in all
  auto l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_TRUE(holds(l.units[0], m.outer->inner()->inner->inner()->b));
  EXPECT_FALSE(holds(l.units[0], m.sibling->inner()->own));
  EXPECT_FALSE(holds(l.units[0], m.outer->inner()->inner->inner()->w));
}

// Both limits are inclusive, as in DeepSpeed's mark_persistent_parameters (deepspeed.md:666-667:
// numel <= stage3_param_persistence_threshold, the running total staying <=
// stage3_model_persistence_threshold): a parameter exactly at the threshold persists, and one that
// brings the total exactly to the cap persists too.
TEST(Stage3Layout, PersistenceLimitsAreInclusive) {
  Model m;
  auto units = deepspeed::zero::find_units(m);
  auto b = m.outer->inner()->inner->inner()->b;  // 7 elements
  auto own = m.sibling->inner()->own;            // 40 elements, after b in parameter order
  deepspeed::ZeroConfig z;
  z.stage3_param_persistence_threshold = 7;  // exactly b's size (a '<' would partition it)
  auto l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_TRUE(holds(l.units[0], b));
  EXPECT_FALSE(holds(l.units[0], own));
  z.stage3_param_persistence_threshold = 6;  // one below: b goes back to its unit
  l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_FALSE(holds(l.units[0], b));

  z.stage3_param_persistence_threshold = 50;
  z.stage3_model_persistence_threshold = 47;  // 7 + 40: the cap exactly reached
  l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_TRUE(holds(l.units[0], b));
  EXPECT_TRUE(holds(l.units[0], own));
  z.stage3_model_persistence_threshold = 46;  // one short: own stays partitioned
  l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_TRUE(holds(l.units[0], b));
  EXPECT_FALSE(holds(l.units[0], own));
  z.stage3_model_persistence_threshold = 7;  // b alone exactly fills the cap
  l = deepspeed::zero::make_stage3_layout(units, trainable(m), 2, z);
  EXPECT_TRUE(holds(l.units[0], b));
  EXPECT_FALSE(holds(l.units[0], own));
}

}  // namespace stage3_layout_test
