#include "comm/failure_board.h"
#include "comm/store_bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <system_error>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/peer_watch.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {
namespace {

const std::string kCountKey = "ds_fail/n";
std::string post_key(int rank, size_t k) { return fmt::format("ds_fail/{}/{}", rank, k); }
std::string ending_key(int rank) { return fmt::format("ds_fail/{}/end", rank); }
constexpr std::chrono::milliseconds kRefreshEvery{200};

// "w" -> "the world group", "w/split0/1" -> "sub-group w/split0/1", "w:0>1" -> "rank 0's
// messages to rank 1", "w/split0/1:0>1" -> "member 0's messages to member 1 of sub-group ...".
std::string channel_words(const std::string& name) {
  const auto colon = name.find(':');
  if (colon != std::string::npos) {
    const std::string group = name.substr(0, colon), pair = name.substr(colon + 1);
    const auto arrow = pair.find('>');
    if (group == "w")
      return fmt::format("rank {}'s messages to rank {}", pair.substr(0, arrow),
                         pair.substr(arrow + 1));
    return fmt::format("member {}'s messages to member {} of sub-group {}", pair.substr(0, arrow),
                       pair.substr(arrow + 1), group);
  }
  return name == "w" ? "the world group" : "sub-group " + name;
}

std::string operations(uint64_t n) { return fmt::format("{} operation{}", n, n == 1 ? "" : "s"); }

}  // namespace

FailureBoard::FailureBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                           std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      posts_(world_size),
      endings_(world_size) {}

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

OpPosition FailureBoard::issue(int channel) {
  std::lock_guard<std::mutex> lock(mu_);
  ++numbered_;
  OpPosition pos;
  pos.channel = channel;
  pos.index = counts_.at(channel)++;
  pos.epoch = own_posts_;
  return pos;
}

void FailureBoard::withdraw(const OpPosition& pos) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pos.channel < 0 || counts_.at(pos.channel) != pos.index + 1) return;
  --counts_[pos.channel];
}

OpPosition FailureBoard::peek(int channel) const {
  std::lock_guard<std::mutex> lock(mu_);
  OpPosition pos;
  pos.channel = channel;
  pos.index = counts_.at(channel);
  pos.epoch = own_posts_;
  return pos;
}

uint64_t FailureBoard::numbered_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return numbered_;
}

int FailureBoard::own_posts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return own_posts_;
}

bool FailureBoard::watcher_running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watcher_running_;
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
    int k = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      text = fmt::format("{} {}\n{}\n{}", rank_, call, fingerprint_locked(), message);
      k = own_posts_ + 1;
    }
    // The post first, then the counter that tells the readers to look. Counted as this rank's
    // only once written: a missing key k would hide every later one.
    store_->set(post_key(rank_, k), store_bytes(text));
    {
      std::lock_guard<std::mutex> lock(mu_);
      own_posts_ = k;
    }
    store_->add(kCountKey, 1);
  } catch (...) {
    // The store is gone (rank 0's host): the peers' waits fail on their own.
  }
}

void FailureBoard::end_job(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return;
    break_locked(fmt::format("rank {} found that the job cannot continue: {}", rank_, reason));
  } catch (...) {
    return;
  }
  post_ending(reason);  // the readers say whose it is
}

void FailureBoard::post_ending(const std::string& reason) noexcept {
  try {
    store_->set(ending_key(rank_), store_bytes(reason));
    store_->add(kCountKey, 1);
  } catch (...) {
  }
}

struct WatchedWait {
  c10::intrusive_ptr<c10d::Work> work;
  OpPosition pos;  // without its board (the watcher holds the board weakly)
  std::chrono::steady_clock::time_point since;
  std::string reason;  // set when the watcher aborted it
};

std::shared_ptr<WatchedWait> FailureBoard::watch(c10::intrusive_ptr<c10d::Work> work,
                                                 const OpPosition& pos) {
  auto wait = std::make_shared<WatchedWait>();
  wait->work = std::move(work);
  wait->pos = pos;
  wait->pos.board = nullptr;
  wait->since = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!watcher_running_) {
    // Started before anything is recorded: a thread that cannot start leaves the wait to the
    // timeout, as without a board (the next wait tries again).
    try {
      std::thread(watch_loop, weak_from_this()).detach();
      watcher_running_ = true;
    } catch (const std::system_error&) {
    }
  }
  last_watch_ = wait->since;
  watched_.push_back(wait);
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
  // A thread that has watched nothing for this long ends; the next blocking wait starts another
  // (a thread costs tens of microseconds to start; a pipeline's stages wait on messages every
  // micro-batch, so it ends only in pauses: evaluation, a checkpoint, the end of training).
  // Busy: a wait running at a poll, or one begun since (most are shorter than a poll).
  constexpr auto kIdleEnd = 4 * kFailureCheckSlice;
  auto busy = std::chrono::steady_clock::now();
  for (;;) {
    std::this_thread::sleep_for(kFailureCheckSlice / 2);
    auto board = weak.lock();
    if (!board) return;
    std::vector<std::shared_ptr<WatchedWait>> due;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(board->mu_);
      if (!board->watched_.empty()) busy = now;
      busy = std::max(busy, board->last_watch_);  // waits shorter than a poll count too
      if (board->watched_.empty() && now - busy >= kIdleEnd) {
        board->watcher_running_ = false;  // watch() starts a new one, under the same lock
        return;
      }
      for (auto& w : board->watched_)
        if (w->reason.empty() && now - w->since >= kFailureCheckSlice) due.push_back(w);
    }
    for (auto& w : due) {
      std::string why = board->why_stuck(w->pos);
      if (why.empty()) continue;
      {
        std::lock_guard<std::mutex> lock(board->mu_);
        bool still_waiting = false;
        for (auto& v : board->watched_) still_waiting = still_waiting || v == w;
        if (!still_waiting) continue;  // it returned meanwhile
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
  if (!(h >> out.rank)) return false;
  std::getline(h >> std::ws, out.call);  // the rest of the line: a call's name may have spaces
  if (out.call.empty()) return false;
  std::istringstream c(counts);
  for (std::string item; c >> item;) {
    const auto eq = item.rfind('=');
    if (eq == std::string::npos) return false;
    try {
      out.counts[item.substr(0, eq)] = std::stoull(item.substr(eq + 1));
    } catch (const std::exception&) {
      return false;
    }
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  out.message = rest.str();
  return true;
}

void FailureBoard::refresh(bool force) {
  // One reader at a time; a wait does not queue behind another thread's read (a store that
  // stopped answering would hold it past its slice): it uses what was read.
  std::unique_lock<std::mutex> one_reader(refresh_mu_, std::defer_lock);
  if (force) {
    one_reader.lock();
  } else if (!one_reader.try_lock()) {
    return;
  }
  std::vector<size_t> have(world_size_);
  std::vector<bool> ended(world_size_);
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_refresh_ < kRefreshEvery) return;
    last_refresh_ = now;
    for (int r = 0; r < world_size_; ++r) {
      have[r] = posts_[r].size();
      ended[r] = !endings_[r].empty();
    }
    seen = seen_;
  }
  std::vector<std::vector<Post>> fresh(world_size_);
  std::vector<std::string> endings(world_size_);
  uint64_t counter = seen;
  try {
    counter = static_cast<uint64_t>(store_->add(kCountKey, 0));
    if (counter != seen) {
      for (int r = 0; r < world_size_; ++r) {
        for (size_t k = have[r] + 1;; ++k) {
          const std::string key = post_key(r, k);
          if (!store_->check({key})) break;
          const auto value = store_->get(key);
          Post p;
          if (!parse(store_string(value), p)) {
            p = Post{};  // unreadable: it still counts as that rank's post
            p.call = "call";
            p.message = "(its post could not be read)";
          }
          p.rank = r;
          fresh[r].push_back(std::move(p));
        }
        if (!ended[r] && store_->check({ending_key(r)})) {
          const auto value = store_->get(ending_key(r));
          endings[r] = store_string(value);
          if (endings[r].empty()) endings[r] = "(no reason given)";
        }
      }
    }
  } catch (...) {
    return;  // the store cannot be reached: what was read stays, and the wait goes on
  }
  std::lock_guard<std::mutex> lock(mu_);
  seen_ = counter;
  for (int r = 0; r < world_size_; ++r) {
    for (auto& p : fresh[r]) posts_[r].push_back(std::move(p));
    if (!endings[r].empty()) endings_[r] = endings[r];
  }
}


std::string FailureBoard::describe_locked(const Post& p) const {
  std::string message = p.message;
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return fmt::format("rank {}'s {} failed ({})", p.rank, p.call, message);
}

std::string FailureBoard::break_locked(std::string reason) {
  broken_ = true;
  broken_reason_ = std::move(reason);
  return broken_reason_;
}

std::string FailureBoard::why_stuck(const OpPosition& pos) {
  refresh(false);
  std::string ending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return broken_reason_;
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_ || endings_[p].empty()) continue;
      ending = break_locked(fmt::format("rank {} found that the job cannot continue: {}", p,
                                        endings_[p]));
      return ending;
    }
    const std::string& name = names_.at(pos.channel);
    for (int p = 0; p < world_size_; ++p) {
      // The peer's failure number epoch + 1: one that this rank had not matched when it issued
      // the operation. Earlier ones are matched by this rank's own, which settling compares.
      if (p == rank_ || static_cast<int>(posts_[p].size()) <= pos.epoch) continue;
      const Post& post = posts_[p][pos.epoch];
      auto it = post.counts.find(name);
      if (it == post.counts.end() || it->second > pos.index) continue;  // not a member, or issued
      ending = break_locked(fmt::format(
          "{} after it had issued {} on {}, and this one is number {} there, so it will never "
          "join it; the job cannot continue (restart it, from the last checkpoint)",
          describe_locked(post), operations(it->second), channel_words(name), pos.index + 1));
      break;
    }
  }
  if (!ending.empty()) post_ending(ending);
  return ending;
}

std::string FailureBoard::disagreement_locked(int round) const {
  std::map<std::string, std::vector<std::pair<int, uint64_t>>> by_channel;
  for (int r = 0; r < world_size_; ++r)
    for (const auto& kv : posts_[r][round - 1].counts) by_channel[kv.first].emplace_back(r, kv.second);
  for (const auto& kv : by_channel) {
    const auto& counts = kv.second;
    for (const auto& rc : counts) {
      if (rc.second == counts.front().second) continue;
      return fmt::format("on {}, rank {} had issued {} and rank {} {}", channel_words(kv.first),
                         counts.front().first, operations(counts.front().second), rc.first,
                         rc.second);
    }
  }
  return "";
}

const FailureBoard::Post& FailureBoard::cause_locked(int round) const {
  // A rank whose wait found its peer gone says so in its message: name the other one.
  for (int r = 0; r < world_size_; ++r) {
    const Post& p = posts_[r][round - 1];
    if (p.message.find("the job cannot continue") == std::string::npos) return p;
  }
  return posts_[0][round - 1];
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
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<int> missing;
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_ && !endings_[r].empty()) {
          reason = fmt::format("rank {} found that the job cannot continue: {}", r, endings_[r]);
          break;
        }
        if (static_cast<int>(posts_[r].size()) < target) missing.push_back(r);
      }
      if (reason.empty() && missing.empty()) {
        const std::string parted = disagreement_locked(target);
        if (parted.empty()) {
          settled_rounds_ = target;  // every rank failed at the same operation: nothing pending
          return;
        }
        reason = fmt::format(
            "the job cannot continue after {}: the ranks stopped at different collectives ({}), "
            "so their next ones would not match; restart it (from the last checkpoint)",
            describe_locked(cause_locked(target)), parted);
      } else if (reason.empty()) {
        const std::string silent = peer_watch_report();
        if (std::chrono::steady_clock::now() < deadline && silent.empty()) continue;
        std::string names;
        for (int r : missing) names += fmt::format("{}{}", names.empty() ? "" : ", ", r);
        reason = fmt::format(
            "the job cannot continue after this rank's failure: rank(s) {} did not report where "
            "they stopped within {:g} s{}; restart it (from the last checkpoint)",
            names, timeout_.count() / 1000.0, silent);
      }
      break_locked(reason);
    }
    post_ending(reason);  // a peer waiting in an operation this rank will not issue learns now
    throw CommError(fmt::format("{} on rank {} of {}: {}", call, rank_, world_size_, reason));
  }
}

}  // namespace comm
}  // namespace deepspeed
