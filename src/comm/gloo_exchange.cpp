#include "comm/gloo_exchange.h"

namespace deepspeed {
namespace comm {

void post_exchange(int rank, const std::vector<at::Tensor>& sends,
                   const std::vector<at::Tensor>& recvs, const PostMessage& post_recv,
                   const PostMessage& post_send) {
  const int world = static_cast<int>(recvs.size());
  // Every receive before any send (the point of this file). Receives from rank-1, rank-2, ...,
  // sends to rank+1, rank+2, ...: a rank's i-th send is its peer's i-th receive, and no two
  // ranks start by sending to the same peer.
  for (int i = 1; i < world; ++i) {
    const int src = (rank - i + world) % world;
    if (recvs[src].numel() > 0) post_recv(recvs[src], src);
  }
  for (int i = 1; i < world; ++i) {
    const int dst = (rank + i) % world;
    if (sends[dst].numel() > 0) post_send(sends[dst], dst);
  }
}

}  // namespace comm
}  // namespace deepspeed
