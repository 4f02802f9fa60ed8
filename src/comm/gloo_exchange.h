// The data movement of Gloo's reduce-scatter, all-gather and all-to-all as point-to-point
// messages with every receive posted before any send.
//
// Why: 1.13's Gloo alltoall (and so our reduce_scatter), and the broadcasts our all_gather is
// made of, post a send before the matching receive; between two hosts each direction then ran
// at half the link's rate (1 Gbit/s link, 2 ranks, 6.6 MB each way: 98-110 ms, where the same
// messages with the receive posted first took 55-58 ms, and one-way 55 ms; measured with
// torch.distributed over the benchmark's network namespaces, docs/benchmarks.md). Within one
// host both orders take the same time. Gloo's point-to-point takes host tensors only: CUDA
// tensors keep the collective path.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace deepspeed {
namespace comm {

// The tags this exchange uses, apart from those of the program's own send/recv (pipeline
// stages use small ones): kExchangeTagBase + (sequence number of the exchange mod 2^20).
constexpr uint32_t kExchangeTagBase = 1u << 30;
constexpr uint32_t kExchangeTagSpan = 1u << 20;

// Posts a receive or a send of `tensor` from/to `peer` (GlooCommunicator: c10d's recv/send with
// the exchange's tag, the work kept for launch_all).
using PostMessage = std::function<void(const at::Tensor& tensor, int peer)>;

// Posts, for every peer r != rank, a receive into recvs[r] and then, once all receives are
// posted, a send of sends[r]. Entries at `rank` are ignored; each other must be a contiguous
// host tensor (may be empty: then nothing is posted for that peer, and the peer must agree).
// Every rank of the group calls it with the same tag, in the same order relative to its other
// exchanges.
void post_exchange(int rank, const std::vector<at::Tensor>& sends,
                   const std::vector<at::Tensor>& recvs, const PostMessage& post_recv,
                   const PostMessage& post_send);

// Whether tensors of this device can travel by post_exchange (host tensors) rather than by
// Gloo's collectives (CUDA tensors).
inline bool exchanges_on(const at::Tensor& t) { return t.device().is_cpu(); }

}  // namespace comm
}  // namespace deepspeed
