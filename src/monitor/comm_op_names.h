// comms_logger.prof_ops: which recorded collectives a name selects. Our communicators record
// all_reduce, broadcast, all_gather, reduce_scatter, reduce_scatter_v, all_to_all, send and recv;
// a DeepSpeed config names the same operations after deepspeed.comm's functions
// (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, isend, irecv), so those are
// accepted as aliases: the same prof_ops list selects the same collectives in both.
#pragma once
#include <set>
#include <string>

namespace deepspeed {
namespace monitor {

// The recorded operations prof_ops entry `name` selects: itself for one of ours, ours for one of
// DeepSpeed's aliases; reduce_scatter and reduce_scatter_tensor select both reduce-scatters (our
// ZeRO stages reduce gradients with the uneven reduce_scatter_v where DeepSpeed's use the even
// one). Empty when it selects none (DeepSpeed's reduce, gather, scatter, barrier, a misspelling).
std::set<std::string> recorded_ops_named(const std::string& name);

// The warning for prof_ops entry `name` (at config key `path`) that selects nothing: it names
// the entry and lists the names that select something.
std::string prof_op_selects_nothing(const std::string& path, const std::string& name);

}  // namespace monitor
}  // namespace deepspeed
