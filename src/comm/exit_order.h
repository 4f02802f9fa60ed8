// Rank 0 leaves last.
//
// Rank 0's process hosts the rendezvous store (a c10d TCPStore). In libtorch 1.13 every TCPStore
// client also runs a callback thread that throws std::system_error ("Connection reset by peer")
// out of its thread function, so std::terminate and SIGABRT, as soon as the server's socket
// closes. Every rank keeps a store client until its process ends (the peer watch's is never
// destroyed). So whenever rank 0 exited first, a rank still in its own exit (libtorch's static
// destructors take tens of milliseconds) died with SIGABRT and a finished job failed. This was seen
// as gpt_generate --tensor_parallel 4 exiting 134 in about 1 run in 5.
//
// What this file adds: at init, each rank > 0 opens one TCP connection to rank 0 and never closes
// it, so the kernel closes it when the process is gone. When rank 0 exits with status 0 (an exit
// handler), it first runs `before_wait`: init_distributed drops the world communicator there, so
// that a rank still waiting in a collective with rank 0 fails now instead of hanging. Then rank 0
// waits until every connection has closed, for at most `timeout` (the collectives' timeout). That
// wait does not delay the job: dsrun waits for the last rank anyway. A rank 0 exiting with another
// status leaves at once, so that dsrun stops the job as before. Rank 0 also keeps the store alive
// until its own process ends, so that its own peer watch's client never sees the server close.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>

#include "deepspeed/comm.h"

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

// Collective over `store`: every rank of `info` calls it once per process, after the world
// communicator exists. Throws CommError naming the address, the port or the missing ranks when
// the connections cannot be made within `timeout`.
void arrange_exit_order(const c10::intrusive_ptr<c10d::Store>& store, const ProcessInfo& info,
                        std::chrono::milliseconds timeout, std::function<void()> before_wait);

}  // namespace comm
}  // namespace deepspeed
