#include "comm/failure_board.h"

#include <fmt/format.h>

#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/peer_watch.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {
namespace {

const std::string kCountKey = "ds_fail/n";
const std::string kPostKey = "ds_fail/";
constexpr std::chrono::milliseconds kRefreshEvery{200};

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// "w" -> "the world group", "w/split0/1" -> "sub-group w/split0/1", "w:0>1" -> "rank 0's
// messages to rank 1 (w)".
std::string channel_words(const std::string& name) {
  const auto colon = name.find(':');
  if (colon != std::string::npos) {
    const std::string pair = name.substr(colon + 1);
    const auto arrow = pair.find('>');
    return fmt::format("rank {}'s messages to rank {} ({})", pair.substr(0, arrow),
                       pair.substr(arrow + 1), name.substr(0, colon));
  }
  return name == "w" ? "the world group" : "sub-group " + name;
}

}  // namespace

FailureBoard::FailureBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      rounds_(world_size, 0) {}

int FailureBoard::channel(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_of_.find(name);
  if (it != index_of_.end()) return it->second;
  const int index = static_cast<int>(names_.size());
  names_.push_back(name);
  counts_.push_back(0);
  index_of_.emplace(name, index);
  return index;
}

uint64_t FailureBoard::issue(int channel) {
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  return counts_.at(channel)++;
}

uint64_t FailureBoard::issued_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

int FailureBoard::own_posts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return own_posts_;
}

bool FailureBoard::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::string FailureBoard::fingerprint_locked() const {
  std::string line;
  for (size_t c = 0; c < names_.size(); ++c)
    line += fmt::format("{}{}={}", line.empty() ? "" : " ", names_[c], counts_[c]);
  return line;
}

void FailureBoard::post(const std::string& call, const std::string& message) noexcept {
  try {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(mu_);
      text = fmt::format("{} {}\n{}\n{}", rank_, call, fingerprint_locked(), message);
      ++own_posts_;
    }
    // The number first, then the post: a reader that finds the number ahead of its post reads
    // it at its next refresh.
    const int64_t i = store_->add(kCountKey, 1);
    store_->set(kPostKey + std::to_string(i), bytes(text));
  } catch (...) {
    // The store is gone (rank 0's host): the peers' waits fail on their own.
  }
}

struct WatchedWait {
  c10::intrusive_ptr<c10d::Work> work;
  int channel = -1;
  uint64_t index = 0;
  std::chrono::steady_clock::time_point since;
  std::string reason;  // set when the watcher aborted it
};

std::shared_ptr<WatchedWait> FailureBoard::watch(c10::intrusive_ptr<c10d::Work> work,
                                                 const OpPosition& pos) {
  auto wait = std::make_shared<WatchedWait>();
  wait->work = std::move(work);
  wait->channel = pos.channel;
  wait->index = pos.index;
  wait->since = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  watched_.push_back(wait);
  if (!watcher_running_) {
    watcher_running_ = true;
    std::thread(watch_loop, std::weak_ptr<FailureBoard>(shared_from_this())).detach();
  }
  return wait;
}

std::string FailureBoard::unwatch(const std::shared_ptr<WatchedWait>& wait) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = watched_.begin(); it != watched_.end(); ++it) {
    if (*it != wait) continue;
    watched_.erase(it);
    break;
  }
  return wait->reason;
}

void FailureBoard::watch_loop(std::weak_ptr<FailureBoard> weak) {
  for (;;) {
    std::this_thread::sleep_for(kFailureCheckSlice / 2);
    auto board = weak.lock();
    if (!board) return;
    std::vector<std::shared_ptr<WatchedWait>> due;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(board->mu_);
      for (auto& w : board->watched_)
        if (w->reason.empty() && now - w->since >= kFailureCheckSlice) due.push_back(w);
    }
    for (auto& w : due) {
      std::string why = board->why_stuck(w->channel, w->index);
      if (why.empty()) continue;
      {
        std::lock_guard<std::mutex> lock(board->mu_);
        w->reason = std::move(why);
      }
      try {
        w->work->abort();  // the blocked wait returns false
      } catch (...) {
      }
    }
  }
}

bool FailureBoard::parse(const std::string& text, Post& out) {
  std::istringstream in(text);
  std::string head, counts;
  if (!std::getline(in, head) || !std::getline(in, counts)) return false;
  std::istringstream h(head);
  if (!(h >> out.rank >> out.call)) return false;
  std::istringstream c(counts);
  for (std::string item; c >> item;) {
    const auto eq = item.rfind('=');
    if (eq == std::string::npos) return false;
    out.counts[item.substr(0, eq)] = std::stoull(item.substr(eq + 1));
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  out.message = rest.str();
  return true;
}

void FailureBoard::refresh(bool force) {
  std::lock_guard<std::mutex> one_reader(refresh_mu_);
  size_t read = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_refresh_ < kRefreshEvery) return;
    last_refresh_ = now;
    read = posts_.size();
  }
  std::vector<Post> fresh;
  try {
    const int64_t n = store_->add(kCountKey, 0);
    for (int64_t i = static_cast<int64_t>(read) + 1; i <= n; ++i) {
      const std::string key = kPostKey + std::to_string(i);
      if (!store_->check({key})) break;  // numbered but not written yet
      const auto value = store_->get(key);
      Post p;
      if (!parse(std::string(value.begin(), value.end()), p) || p.rank < 0 ||
          p.rank >= world_size_)
        p = Post{};  // unreadable: kept in its place, counted for nobody
      fresh.push_back(std::move(p));
    }
  } catch (...) {
    // The store cannot be reached: what was read stays, and the wait goes on.
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : fresh) {
    if (p.rank >= 0) ++rounds_[p.rank];
    posts_.push_back(std::move(p));
  }
}

std::vector<const FailureBoard::Post*> FailureBoard::unsettled_locked() const {
  std::vector<const Post*> latest(world_size_, nullptr);
  std::vector<int> seen(world_size_, 0);
  for (const Post& p : posts_) {
    if (p.rank < 0) continue;
    if (++seen[p.rank] > settled_rounds_) latest[p.rank] = &p;
  }
  std::vector<const Post*> out;
  for (const Post* p : latest)
    if (p) out.push_back(p);
  return out;
}

std::string FailureBoard::describe_locked(const Post& p) const {
  std::string message = p.message;
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return fmt::format("rank {}'s {} failed ({})", p.rank, p.call, message);
}

std::string FailureBoard::why_stuck(int channel, uint64_t index) {
  refresh(false);
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return broken_reason_;
  const std::string& name = names_.at(channel);
  for (const Post* p : unsettled_locked()) {
    if (p->rank == rank_) continue;
    auto it = p->counts.find(name);
    if (it == p->counts.end() || it->second > index) continue;  // not a member, or it issued it
    broken_ = true;
    broken_reason_ = fmt::format(
        "{} after it had issued {} operations on {}, and this one is number {} there, so it "
        "will never join it; the job cannot continue (restart it, from the last checkpoint)",
        describe_locked(*p), it->second, channel_words(name), index + 1);
    return broken_reason_;
  }
  return "";
}

std::string FailureBoard::disagreement_locked() const {
  const auto posts = unsettled_locked();
  std::map<std::string, std::vector<std::pair<int, uint64_t>>> by_channel;
  for (const Post* p : posts)
    for (const auto& kv : p->counts) by_channel[kv.first].emplace_back(p->rank, kv.second);
  for (const auto& kv : by_channel) {
    const auto& counts = kv.second;
    for (const auto& rc : counts) {
      if (rc.second == counts.front().second) continue;
      return fmt::format("on {}, rank {} had issued {} operations and rank {} {}",
                         channel_words(kv.first), counts.front().first, counts.front().second,
                         rc.first, rc.second);
    }
  }
  return "";
}

void FailureBoard::settle(const std::string& call) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  int target = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_)
      throw CommError(fmt::format("{} on rank {} of {}: {}", call, rank_, world_size_,
                                  broken_reason_));
    if (own_posts_ <= settled_rounds_) return;
    target = own_posts_;
  }
  for (bool first = true;; first = false) {
    if (!first) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    refresh(/*force=*/true);
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r)
      if (rounds_[r] < target) missing.push_back(r);
    if (missing.empty()) {
      const std::string parted = disagreement_locked();
      if (parted.empty()) {
        settled_rounds_ = target;  // every rank failed at the same operation: nothing pending
        return;
      }
      const auto posts = unsettled_locked();
      broken_ = true;
      broken_reason_ = fmt::format(
          "the job cannot continue after {}: the ranks stopped at different collectives ({}), "
          "so their next ones would not match; restart it (from the last checkpoint)",
          describe_locked(*posts.front()), parted);
    } else {
      const std::string silent = peer_watch_report();
      if (std::chrono::steady_clock::now() < deadline && silent.empty()) continue;
      std::string names;
      for (int r : missing) names += fmt::format("{}{}", names.empty() ? "" : ", ", r);
      broken_ = true;
      broken_reason_ = fmt::format(
          "the job cannot continue after this rank's failure: rank(s) {} did not report where "
          "they stopped within {:g} s{}; restart it (from the last checkpoint)",
          names, timeout_.count() / 1000.0, silent);
    }
    throw CommError(fmt::format("{} on rank {} of {}: {}", call, rank_, world_size_,
                                broken_reason_));
  }
}

}  // namespace comm
}  // namespace deepspeed
