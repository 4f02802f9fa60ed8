// qgZ: the uneven reduce-scatter of a stage-3 gradient bucket (Communicator::reduce_scatter_v's
// contract, op sum) as one all-to-all of quantized chunks.
//
// Each rank cuts its input into the world_size segments of `splits`, pads each to the largest
// split, quantizes each (int8 blocks, comm/quantize.h) and sends segment r to rank r; the
// receiver dequantizes what every other rank sent and sums it in fp32 with its own segment, which
// it never quantizes (it does not cross the wire). Bytes per rank: world_size * (max split + 4 per
// 8000) instead of 4 * input numel for fp32. A stage-3 bucket that holds a whole unit (the default
// reduce_bucket_size) splits evenly; a bucket inside one rank's slice still sends a full chunk to
// every rank (all_to_all needs equal chunks).
//
// Two hops, as DeepSpeed's all_to_all_quant_reduce, when the ranks span several nodes of L ranks
// (QgzHops): W = N·L ranks, rank r = n·L + l on node n with local index l.
//   hop 1, inside the node, int4: to local peer p goes, for every node n', segment n'·L + p
//       (N segments, padded to the largest split, quantized as one run of blocks); the receiver
//       adds the L - 1 dequantized payloads to its own (exact) ones: partial[n'] = the node's sum
//       of segment n'·L + l.
//   hop 2, across nodes, int8: partial[n'] goes to rank n'·L + l (same local index on node n');
//       the receiver adds the N - 1 dequantized partials to its own: the sum over all W ranks of
//       its segment.
// Bytes per rank: hop 1 L · N·chunk/2, hop 2 N · chunk (+ 4 per 8000 each), against W · chunk
// for the single hop: the slow inter-node link carries only N of the W chunks. Each value is
// quantized twice (int4 then int8) where the single hop quantizes it once at int8: the sum of a
// segment carries N·(L-1) int4 errors (<= max|x|/14 each) and N-1 int8 ones.
// Node = L consecutive ranks of `comm` (launchers place ranks node by node). Any grouping gives
// the same sums; only which link carries which hop depends on it.
#pragma once
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace zero {

// Starts the reduction; wait() writes the sum of segment `rank` into `output` (splits[rank]
// elements, the input's dtype). COLLECTIVE over `comm`; the tensors must stay alive until wait().
comm::WorkPtr quantized_reduce_scatter_v(comm::Communicator& comm, at::Tensor& output,
                                         const at::Tensor& input,
                                         const std::vector<int64_t>& splits, int bits = 8);

// The sub-groups of the two hops: `intra` the L ranks of this rank's node (its rank there: l),
// `inter` the N ranks with this local index (its rank there: n). Both null: one hop.
struct QgzHops {
  comm::CommunicatorPtr intra, inter;
  bool two_hops() const { return intra && inter; }
};
// COLLECTIVE over `comm` (two splits) when 1 < local_size < world size and local_size divides
// it; otherwise no collective and both null.
QgzHops make_qgz_hops(comm::Communicator& comm, int local_size);

// The two-hop reduction (int4 inside the node, int8 across), same contract as above.
// REQUIRES: hops.two_hops(), made from `comm`. wait() runs hop 2 (a collective over
// hops.inter): every rank waits its works in the same order.
comm::WorkPtr quantized_reduce_scatter_v(comm::Communicator& comm, const QgzHops& hops,
                                         at::Tensor& output, const at::Tensor& input,
                                         const std::vector<int64_t>& splits);

}  // namespace zero
}  // namespace deepspeed
