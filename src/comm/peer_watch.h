// Who is still there, for the message of a failed collective. Gloo's own error on a timeout names
// neither the peer nor its host, and with a link cut every rank just waits. So each process of a
// multi-rank job (init_distributed) runs one background thread that, every second, bumps its own
// counter key in the rendezvous store. Rank 0's thread reads every counter and publishes the ranks
// whose counters stopped moving; the others read that summary. When a collective fails, the
// message gains what this rank last saw: the silent ranks (and hosts), or that this rank itself
// could not reach the store (its own link, or rank 0's host, is gone).
//
// Store keys: "ds_peer/host/<r>" (set once: "<hostname> <address>"), "ds_peer/beat/<r>" (the
// counter), "ds_peer/silent" (rank 0's summary). One extra store connection per rank and two
// store requests per rank per beat: O(world) at the store, which lives in rank 0's process, where
// every rank reading every counter would be O(world²). No cost to collectives.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

// Starts the watch of this process (at most one; a second call replaces the first). `store`: a
// connection of its own to the job's store. `address`: how the others reach this rank (shown in
// their messages). `beat`: the heartbeat period; a peer is reported after 3 silent periods.
void start_peer_watch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                      const std::string& address,
                      std::chrono::milliseconds beat = std::chrono::seconds(1));
void stop_peer_watch();

// "" when no watch runs or everyone was heard from recently; else a sentence starting with
// "; " to append to an error: "; not heard from for up to 6.0 s: rank 2 (host h1 10.0.0.2),
// rank 3 (...)" or "; this rank has not reached the rendezvous store for 6.0 s (its link is down,
// or rank 0's host is)".
std::string peer_watch_report();

// One rank's watch (the functions above hold the process's one; tests run several side by side).
// Its thread is detached, never joined: a store call on a dead link can block far longer than an
// exiting process should wait, so the thread shares ownership of the state.
class PeerWatch : public std::enable_shared_from_this<PeerWatch> {
 public:
  PeerWatch(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, std::string address,
            std::chrono::milliseconds beat);
  void start();
  void stop();
  // What peer_watch_report() returns for this rank.
  std::string report();

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    std::string last;  // its counter as last read
    std::string host;  // "<hostname> <address>"
    Clock::time_point changed;
  };

  void run();
  // One beat's store traffic; false when the store could not be reached.
  bool exchange(int64_t count, std::vector<std::string>& beats, std::vector<std::string>& hosts,
                std::string& summary);
  // Rank 0's view of the silent ranks, one "<rank> <seconds quiet> <host...>" line each: what it
  // reports itself and what it publishes for the others. Called under mu_.
  std::string silent_lines(Clock::time_point now) const;

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, world_size_;
  const std::string address_;
  const std::chrono::milliseconds beat_;
  bool announced_ = false;           // the thread's own
  std::vector<bool> host_known_;     // the thread's own (rank 0)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Peer> peers_;          // rank 0
  std::string published_;            // the other ranks: rank 0's silent_lines as last read
  Clock::time_point store_reached_;
};

}  // namespace comm
}  // namespace deepspeed
