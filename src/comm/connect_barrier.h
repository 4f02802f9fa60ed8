// The barrier that ends a Gloo group's setup. Gloo's connectFullMesh can return on one rank while
// a peer is still finishing its handshake; a rank that then closed the fresh group at once (it had
// nothing to do on it) failed that peer with "Connection closed by peer". Every rank marks itself
// in the group's store and waits until all have: one key for the last to open, so the store work
// is O(world size). At the timeout the error names the ranks that never marked themselves.
#pragma once
#include <chrono>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed::comm {

// Throws CommError("rank(s) 2, 3 did not finish connecting the group (...)") at the timeout.
void wait_for_every_rank_connected(c10d::Store& store, int rank, int world_size,
                                   std::chrono::milliseconds timeout);

}  // namespace deepspeed::comm
