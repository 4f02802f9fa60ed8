#include "zero/fragment_state.h"

#include <algorithm>

#include <torch/torch.h>

namespace deepspeed {
namespace zero {
namespace {

class Windowed : public FragmentState {
 public:
  Windowed(std::vector<StateFragment> fragments, std::unique_ptr<StateWindows> windows)
      : windows_(std::move(windows)) {
    fragments_ = std::move(fragments);
    for (auto& f : fragments_) f.master = f.exp_avg = f.exp_avg_sq = at::Tensor();
  }

  std::vector<std::pair<int64_t, int64_t>> pieces(size_t i) const override {
    const StateFragment& f = fragments_.at(i);
    std::vector<std::pair<int64_t, int64_t>> out;
    if (f.numel == 0) return out;
    const auto& ranges = windows_->ranges();
    for (size_t k = window_of(f.at); k < ranges.size(); ++k) {
      const int64_t lo = std::max(f.at, ranges[k].first);
      const int64_t hi = std::min(f.at + f.numel, ranges[k].first + ranges[k].second);
      if (hi <= lo) break;
      out.emplace_back(lo - f.at, hi - lo);
    }
    return out;
  }

  std::array<at::Tensor, 3> piece(size_t i, int64_t offset, int64_t numel) override {
    const StateFragment& f = fragments_.at(i);
    const int64_t at = f.at + offset;
    const size_t k = window_of(at);
    const auto [begin, size] = windows_->ranges().at(k);
    TORCH_CHECK(
        offset >= 0 && numel >= 0 && offset + numel <= f.numel && at + numel <= begin + size,
        "FragmentState::piece: elements [", offset, ", ", offset + numel, ") of fragment ", i, " (",
        f.numel, " elements) do not lie inside one window");
    if (static_cast<int64_t>(k) != open_) {
      state_ = windows_->open(k);
      open_ = static_cast<int64_t>(k);
    }
    std::array<at::Tensor, 3> out;
    for (int j = 0; j < 3; ++j)
      if (state_[j].defined()) out[j] = state_[j].narrow(0, at - begin, numel);
    return out;
  }

  void finish() override {
    state_ = {};
    open_ = -1;
    windows_->finish();
  }

 private:
  // The window holding partition element `at` (the last one starting at or before it).
  size_t window_of(int64_t at) const {
    const auto& ranges = windows_->ranges();
    auto it = std::upper_bound(
        ranges.begin(), ranges.end(), at,
        [](int64_t a, const std::pair<int64_t, int64_t>& r) { return a < r.first; });
    TORCH_CHECK(it != ranges.begin(), "FragmentState: partition element ", at, " is in no window");
    return static_cast<size_t>(it - ranges.begin() - 1);
  }

  std::unique_ptr<StateWindows> windows_;
  std::array<at::Tensor, 3> state_;
  int64_t open_ = -1;
};

class Views : public FragmentState {
 public:
  explicit Views(std::vector<StateFragment> fragments) : views_(std::move(fragments)) {
    fragments_ = views_;
    for (auto& f : fragments_) f.master = f.exp_avg = f.exp_avg_sq = at::Tensor();
  }
  std::vector<std::pair<int64_t, int64_t>> pieces(size_t i) const override {
    if (views_.at(i).numel == 0) return {};
    return {{0, views_[i].numel}};
  }
  std::array<at::Tensor, 3> piece(size_t i, int64_t offset, int64_t numel) override {
    const StateFragment& f = views_.at(i);
    TORCH_CHECK(offset >= 0 && numel >= 0 && offset + numel <= f.numel, "FragmentState::piece: [",
                offset, ", ", offset + numel, ") outside fragment ", i, " of ", f.numel,
                " elements");
    std::array<at::Tensor, 3> out;
    int j = 0;
    for (const at::Tensor* t : {&f.master, &f.exp_avg, &f.exp_avg_sq}) {
      if (t->defined()) out[j] = t->narrow(0, offset, numel);
      ++j;
    }
    return out;
  }

 private:
  std::vector<StateFragment> views_;
};

}  // namespace

std::unique_ptr<FragmentState> windowed_fragment_state(std::vector<StateFragment> fragments,
                                                       std::unique_ptr<StateWindows> windows) {
  return std::make_unique<Windowed>(std::move(fragments), std::move(windows));
}

std::unique_ptr<FragmentState> view_fragment_state(std::vector<StateFragment> fragments) {
  return std::make_unique<Views>(std::move(fragments));
}

}  // namespace zero
}  // namespace deepspeed
