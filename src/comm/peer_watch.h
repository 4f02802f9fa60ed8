// Who is still there, for the message of a failed collective. Gloo's own error on a timeout names
// neither the peer nor its host, and with a link cut every rank just waits. So each process of a
// multi-rank job (init_distributed) runs one background thread that, every second, bumps its own
// counter key in the rendezvous store and reads the others'. When a collective fails, the message
// gains what that thread last saw: the ranks (and hosts) whose counters stopped moving, or that
// this rank itself could not reach the store (its own link, or rank 0's host, is gone).
//
// Store keys: "ds_peer/host/<r>" (set once: "<hostname> <address>"), "ds_peer/beat/<r>" (the
// counter). One extra store connection per rank; no cost to collectives.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

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
// "; " to append to an error: "; not heard from for 6.0 s: rank 2 (host h1, 10.0.0.2), rank 3
// (...)" or "; this rank has not reached the rendezvous store for 6.0 s (its link is down, or
// rank 0's host is)".
std::string peer_watch_report();

}  // namespace comm
}  // namespace deepspeed
