#include "comm/peer_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed {
namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string store_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// The watch's state, shared with its thread. The thread is detached, never joined: a store call
// on a dead link can block far longer than an exiting process should wait.
class PeerWatch : public std::enable_shared_from_this<PeerWatch> {
 public:
  PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, std::string address,
            std::chrono::milliseconds beat)
      : store_(std::move(store)),
        rank_(rank),
        world_size_(world_size),
        address_(std::move(address)),
        beat_(beat),
        peers_(world_size) {
    const auto now = Clock::now();
    for (auto& p : peers_) p.changed = now;
    store_reached_ = now;
  }
  void start() {
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  std::string report() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    const auto silent = 3 * beat_;
    const std::chrono::duration<double> unreached = now - store_reached_;
    if (now - store_reached_ > silent)
      return fmt::format("; this rank has not reached the rendezvous store for {:.1f} s (its link "
                         "is down, or rank 0's host is)", unreached.count());
    std::string names;
    double longest = 0.0;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_ || now - peers_[r].changed <= silent) continue;
      const std::chrono::duration<double> quiet = now - peers_[r].changed;
      longest = std::max(longest, quiet.count());
      names += fmt::format("{}rank {}{}", names.empty() ? "" : ", ", r,
                           peers_[r].host.empty() ? "" : " (host " + peers_[r].host + ")");
    }
    if (names.empty()) return "";
    return fmt::format("; not heard from for up to {:.1f} s: {}", longest, names);
  }

 private:
  struct Peer {
    std::string last;   // its counter as last read
    std::string host;   // "<hostname> <address>"
    Clock::time_point changed;
  };

  void run() {
    int64_t count = 0;
    bool announced = false;
    std::vector<bool> host_known(world_size_, false);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      // Store calls block up to the store's timeout when the link is down: never under mu_.
      std::vector<std::string> beats(world_size_), hosts(world_size_);
      bool reached = true;
      try {
        if (!announced) {
          char name[256] = {0};
          ::gethostname(name, sizeof name - 1);
          store_->set("ds_peer/host/" + std::to_string(rank_), bytes(std::string(name) + " " + address_));
          announced = true;
        }
        store_->set("ds_peer/beat/" + std::to_string(rank_), bytes(std::to_string(++count)));
        // Key by key (check() before get(), which would wait): a rank that never posted leaves
        // the others' news intact.
        for (int r = 0; r < world_size_; ++r) {
          const std::string beat = "ds_peer/beat/" + std::to_string(r);
          if (store_->check({beat})) beats[r] = store_string(store_->get(beat));
          const std::string host = "ds_peer/host/" + std::to_string(r);
          if (!host_known[r] && store_->check({host})) {
            hosts[r] = store_string(store_->get(host));
            host_known[r] = true;
          }
        }
      } catch (...) {
        reached = false;  // the store (rank 0's host) or this rank's link is gone
      }
      lock.lock();
      const auto now = Clock::now();
      if (reached) {
        store_reached_ = now;
        for (int r = 0; r < world_size_; ++r) {
          if (!hosts[r].empty()) peers_[r].host = hosts[r];
          if (!beats[r].empty() && beats[r] != peers_[r].last) {
            peers_[r].last = beats[r];
            peers_[r].changed = now;
          }
        }
      }
      cv_.wait_for(lock, beat_, [this] { return stop_; });
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, world_size_;
  const std::string address_;
  const std::chrono::milliseconds beat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Peer> peers_;
  Clock::time_point store_reached_;
};

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
