#include "comm/peer_watch.h"
#include "comm/store_bytes.h"

#include <fmt/format.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed {
namespace comm {
namespace {

const std::string kBeatKey = "ds_peer/beat/";
const std::string kHostKey = "ds_peer/host/";
const std::string kSilentKey = "ds_peer/silent";


}  // namespace

PeerWatch::PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                     std::string address, std::chrono::milliseconds beat)
    : store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      address_(std::move(address)),
      beat_(beat),
      host_known_(world_size, false),
      peers_(world_size) {
  const auto now = Clock::now();
  for (auto& p : peers_) p.changed = now;
  store_reached_ = now;
}

void PeerWatch::start() {
  std::thread([self = shared_from_this()] { self->run(); }).detach();
}

void PeerWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

std::string PeerWatch::report() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  const std::chrono::duration<double> unreached = now - store_reached_;
  if (now - store_reached_ > 3 * beat_)
    return fmt::format("; this rank has not reached the rendezvous store for {:.1f} s (its link "
                       "is down, or rank 0's host is)", unreached.count());
  std::istringstream lines(rank_ == 0 ? silent_lines(now) : published_);
  std::string names;
  double longest = 0.0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int r = -1;
    double quiet = 0.0;
    std::string host;
    fields >> r >> quiet;
    std::getline(fields >> std::ws, host);
    if (r < 0 || r == rank_) continue;
    longest = std::max(longest, quiet);
    names += fmt::format("{}rank {}{}", names.empty() ? "" : ", ", r,
                         host.empty() ? "" : " (host " + host + ")");
  }
  if (names.empty()) return "";
  return fmt::format("; not heard from for up to {:.1f} s: {}", longest, names);
}

bool PeerWatch::exchange(int64_t count, std::vector<std::string>& beats,
                         std::vector<std::string>& hosts, std::string& summary) {
  try {
    if (!announced_) {
      char name[256] = {0};
      ::gethostname(name, sizeof name - 1);
      store_->set(kHostKey + std::to_string(rank_), store_bytes(std::string(name) + " " + address_));
      announced_ = true;
    }
    store_->set(kBeatKey + std::to_string(rank_), store_bytes(std::to_string(count)));
    if (rank_ != 0) {
      if (store_->check({kSilentKey})) summary = store_string(store_->get(kSilentKey));
      return true;
    }
    // Key by key (check() before get(), which would wait): a rank that never posted leaves the
    // others' news intact.
    for (int r = 0; r < world_size_; ++r) {
      const std::string beat = kBeatKey + std::to_string(r);
      if (store_->check({beat})) beats[r] = store_string(store_->get(beat));
      const std::string host = kHostKey + std::to_string(r);
      if (!host_known_[r] && store_->check({host})) {
        hosts[r] = store_string(store_->get(host));
        host_known_[r] = true;
      }
    }
    return true;
  } catch (...) {
    return false;  // the store (rank 0's host) or this rank's link is gone
  }
}

void PeerWatch::run() {
  int64_t count = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Store calls block up to the store's timeout when the link is down: never under mu_.
    lock.unlock();
    std::vector<std::string> beats(world_size_), hosts(world_size_);
    std::string summary;
    const bool reached = exchange(++count, beats, hosts, summary);
    lock.lock();
    const auto now = Clock::now();
    if (reached) store_reached_ = now;
    if (reached && rank_ == 0) {
      for (int r = 0; r < world_size_; ++r) {
        if (!hosts[r].empty()) peers_[r].host = hosts[r];
        if (!beats[r].empty() && beats[r] != peers_[r].last) {
          peers_[r].last = beats[r];
          peers_[r].changed = now;
        }
      }
      summary = silent_lines(now);
      lock.unlock();
      try {
        store_->set(kSilentKey, store_bytes(summary));
      } catch (...) {
        // rank 0 holds the store: only a store being torn down fails here
      }
      lock.lock();
    } else if (reached) {
      published_ = summary;
    }
    cv_.wait_for(lock, beat_, [this] { return stop_; });
  }
}

std::string PeerWatch::silent_lines(Clock::time_point now) const {
  std::string lines;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || now - peers_[r].changed <= 3 * beat_) continue;
    const std::chrono::duration<double> quiet = now - peers_[r].changed;
    lines += fmt::format("{} {:.1f} {}\n", r, quiet.count(), peers_[r].host);
  }
  return lines;
}

namespace {
std::mutex g_mu;
// Never destroyed (a static destructor at exit would race the detached thread): stop() ends it.
std::shared_ptr<PeerWatch>* g_watch = new std::shared_ptr<PeerWatch>();
}  // namespace

void start_peer_watch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                      const std::string& address, std::chrono::milliseconds beat) {
  auto watch = std::make_shared<PeerWatch>(std::move(store), rank, world_size, address, beat);
  watch->start();
  std::lock_guard<std::mutex> lock(g_mu);
  if (*g_watch) (*g_watch)->stop();
  *g_watch = std::move(watch);
}

void stop_peer_watch() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (*g_watch) (*g_watch)->stop();
  g_watch->reset();
}

std::string peer_watch_report() {
  std::lock_guard<std::mutex> lock(g_mu);
  return *g_watch ? (*g_watch)->report() : std::string();
}

}  // namespace comm
}  // namespace deepspeed
