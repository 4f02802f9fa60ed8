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
// DeepSpeed's qgZ is two hops (int4 all-to-all inside the node, then int8 across nodes, each hop
// dequantizing and reducing); this is the single hop at int8 (the kernels do int4 too: `bits`).
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

}  // namespace zero
}  // namespace deepspeed
