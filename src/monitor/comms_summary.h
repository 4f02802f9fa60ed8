// comms_logger: DeepSpeed's deepspeed.comm.log_summary() table and verbose lines, from the
// per-op, per-message-size statistics (comm::CommStats) of every communicator of the process's
// world (the monitor passes one GroupStats per group: world, data, tensor, pipeline, tied ...).
//
// Message size is DeepSpeed's: the bytes of the tensor deepspeed.comm takes its size from, which
// is what our stats record — the tensor of all_reduce/broadcast/send/recv, the input of
// all_gather, all_to_all and reduce_scatter(_v) (for a reduce-scatter that is the whole input,
// n times the output). Bandwidths follow DeepSpeed's calc_bw_log, in Gbps, from each call's
// latency t:
//   all_reduce:        algbw = 2·size/t      busbw = size/t · 2(n−1)/n
//   all_to_all:        algbw = size/t        busbw = size/t · (n−1)/n
//   all_gather, reduce_scatter(_v): algbw = n·size/t   busbw = algbw · (n−1)/n
//   broadcast, send, recv: algbw = busbw = size/t
// For a reduce-scatter DeepSpeed's n·size counts the whole input n times over: its algbw and
// busbw (and so ours, kept equal to them so that the two tables compare) are n times
// nccl-tests' figures for the same operation (input/t and input/t · (n−1)/n).
// n is the size of the group the call ran on (DeepSpeed's calc_bw_log takes the global world
// size for every call; docs/monitoring.md). A row (op, message size) can mix groups of different
// sizes (a 4-byte all_reduce on the tensor group and on the data-parallel group): its count and
// total are summed, and its bandwidths are averaged over the calls, each computed with its own n.
// Latency is from launch to the end of the first wait() (DeepSpeed times each op
// synchronously; an op overlapped with compute reads longer here). The averages are DeepSpeed's
// trimmed means (10% of the calls dropped at each end) of the latencies and of each call's
// bandwidths, each list trimmed on its own as DeepSpeed's log_all does (with mixed n the calls a
// bandwidth's trim drops need not be the latency's), from SizeStats::latencies_ms; count and total
// latency are over every call.
// comms_logger.debug's caller names are the engine phases (training_monitor.cpp).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace monitor {

// "0B", "512 B"... DeepSpeed's convert_size: 1024-based, value rounded to 2 decimals as Python
// prints it ("1.0 KB", "3.75 MB").
std::string convert_size(int64_t bytes);

// One group's statistics and its size, the n of its calls' bandwidths.
struct GroupStats {
  comm::CommStats stats;
  int world_size = 1;
};

// The table: a header row, then per op (by name) its name and one row per message size
// (ascending): size, count, total latency (ms), average latency (ms), algbw (Gbps), busbw (Gbps),
// over the calls of every group in `groups` (each call is in one group's stats only). The three
// averages are over the size's latencies_ms (none kept: 0).
// `prof_ops` non-empty: only those ops (comms_logger.prof_all false; our names, see
// comm_op_names.h).
std::string comms_summary_table(const std::vector<GroupStats>& groups,
                                const std::set<std::string>& prof_ops = {});
// The same for one group.
std::string comms_summary_table(const comm::CommStats& stats, int world_size,
                                const std::set<std::string>& prof_ops = {});

// comms_logger.verbose: DeepSpeed's line for one completed collective on a group of
// `world_size` (`bytes` as our stats record it, DeepSpeed's message size), e.g. "comm op: all_reduce | time (ms): 0.12 | msg size: 4.0 KB | algbw (Gbps): 0.53 |
// busbw (Gbps): 0.27".
std::string verbose_line(const std::string& op, int64_t bytes, double ms, int world_size);

// (algbw, busbw) in Gbps of one op of `size` bytes (DeepSpeed's message size) taking `ms`
// milliseconds.
std::pair<double, double> bandwidth_gbps(const std::string& op, double size, double ms,
                                         int world_size);

}  // namespace monitor
}  // namespace deepspeed
