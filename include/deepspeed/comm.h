// Process groups and collectives.
//
// init_distributed() finds this process's place in the job from the environment (dsrun/torchrun:
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; OpenMPI: OMPI_COMM_WORLD_*; Slurm:
// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), rendezvous through a c10d TCPStore and builds a Gloo
// process group. With none of those variables it is a single process (world size 1).
//
// Every collective is COLLECTIVE: all ranks of the communicator must call it in the same order with
// matching shapes. Each returns a Work handle; wait() rethrows a failure as CommError naming the op,
// the element count, the rank and how long it waited. Blocking variants wait before returning.
//
// Thread-safety: a Communicator may be called from several threads (e.g. a communication thread
// that reduces gradient buckets while backward runs) and stats() may be read at any time, but the
// order in which collectives are issued must be the same on every rank.
//
// Zero-element collectives return at once on every rank (they carry nothing). bf16, int16 and
// bool tensors work although Gloo lacks them: reductions run in fp32/int32/uint8, everything else
// moves the same bits as a same-size dtype, so gathers and broadcasts are bit-exact.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "deepspeed/errors.h"

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

enum class ReduceOp { Sum, Max, Min, Avg };

// Bytes and calls per collective kind, counted on this rank (payload bytes this rank contributes,
// in the caller's dtype: all_reduce/broadcast/send/recv count the tensor, all_gather the input,
// reduce_scatter the whole input; barrier counts calls only).
// Completed collectives of one message size (comms_logger): how many, and their summed latency
// from launch to the end of the first wait() (for an overlapped collective that includes the
// compute it overlapped with).
struct SizeStats {
  int64_t calls = 0;
  double total_ms = 0.0;
  double max_ms = 0.0;
  // Each call's latency (ms) in the order the calls completed, once Communicator::keep_latencies()
  // has been called (before: empty, and `calls` counts calls it does not hold). DeepSpeed's
  // comms logger keeps the same list, to print the trimmed mean of the latencies and of each
  // call's bandwidth: one double per collective call.
  std::vector<double> latencies_ms;
};
struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  // By message size in bytes (the tensor `bytes` counts for one call), completed calls only.
  std::map<int64_t, SizeStats> by_size;
};
using CommStats = std::map<std::string, OpStats>;  // "all_reduce", "all_gather", ...

// An in-flight collective. wait() blocks until done (throws CommError on failure/timeout) and
// finishes any post-processing (e.g. copying a converted result back into the caller's tensor).
// REQUIRES: call wait() before reading the result; a dropped handle may leave a converted result
// (bf16 sum, non-contiguous tensor) uncopied.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator;
using CommunicatorPtr = std::shared_ptr<Communicator>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;

  // In place. bf16/int16 tensors are supported (Gloo lacks them: summed in fp32 / moved as Half bits).
  virtual WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr broadcast(at::Tensor& tensor, int root) = 0;
  // output: a contiguous tensor of world_size * input.numel() elements; rank r's input lands in
  // slice r.
  virtual WorkPtr all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  // All-gather into one tensor per rank: rank r's input lands in outputs[r] (world_size tensors
  // of input.numel() elements and input's dtype, any views: ZeRO's chunk of every rank's
  // partition in one flat buffer). input may be outputs[rank] itself. The default gathers into
  // a flat temporary and copies it out on wait(); Gloo receives straight into the views (its
  // all_gather is one broadcast per rank anyway). Counted and checked as an all_gather.
  virtual WorkPtr all_gather_into(const std::vector<at::Tensor>& outputs,
                                  const at::Tensor& input);
  // input: world_size * output.numel() elements; output = op over ranks of slice `rank` of input.
  virtual WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                 ReduceOp op = ReduceOp::Sum) = 0;
  // Uneven reduce-scatter: input is cut into world_size consecutive segments of input_splits[r]
  // elements; rank r receives op over ranks of segment r. output: input_splits[rank] elements.
  // (ZeRO stage 2: a gradient bucket straddles partitions unevenly.) The default implementation
  // all-reduces a copy and keeps the segment; backends may override it with an all-to-all.
  virtual WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                   const std::vector<int64_t>& input_splits,
                                   ReduceOp op = ReduceOp::Sum);
  // All-to-all of equal chunks: input and output hold world_size * chunk elements (same dtype,
  // uint8 included); chunk j of this rank's input lands in chunk `rank` of rank j's output.
  // (1-bit Adam's compressed all-reduce sends each "server" rank its chunk of packed signs.) The
  // default implementation all-gathers every rank's whole input and keeps its chunks (world_size
  // times the bytes); Gloo overrides it with c10d's alltoall_base.
  virtual WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input);
  // Point to point (not collective: only the two ranks take part).
  virtual WorkPtr send(at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int src, int tag = 0) = 0;
  virtual void barrier() = 0;

  // Sub-groups, as MPI_Comm_split: the ranks that pass the same `color` form one
  // sub-communicator, numbered 0.. in order of (key, rank in this communicator); a negative
  // color joins no group and gets nullptr. The sub-communicator offers every collective above
  // with its own ranks and world size; its traffic is independent of this communicator's (Gloo:
  // its own process group, rendezvous under a prefix of this group's store). COLLECTIVE: every
  // rank of this communicator calls split, in the same order relative to its other collectives.
  virtual CommunicatorPtr split(int color, int key) = 0;

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
  // How many times reset_stats() has run: a reader that keeps an earlier stats() to subtract
  // (the comms_logger table's baseline) knows whether it still applies.
  virtual int64_t stats_resets() const { return 0; }
  // From now on (for the communicator's life) stats() also holds each completed call's latency
  // (SizeStats::latencies_ms): the comms_logger table asks for it, so that a run without the
  // table does not grow by a double per collective. The communicators split from this one (and
  // from those), whether before or after this call, keep theirs from now on too; a split's own
  // call does not reach its parent. Default: keeps none.
  virtual void keep_latencies() {}
  // The summed latency (ms) of the completed calls of every op whose name starts with
  // `op_prefix` ("all_gather" counts all_gather and all_gather_base). A per-step reader (the
  // wall-clock breakdown) asks this instead of stats(), whose copy grows with the kept latencies.
  virtual double total_ms(const std::string& op_prefix) const {
    double ms = 0.0;
    for (const auto& [op, st] : stats())
      if (op.rfind(op_prefix, 0) == 0)
        for (const auto& [bytes, sz] : st.by_size) ms += sz.total_ms;
    return ms;
  }
  // "gloo", "nccl", "single" (world size 1, no transport) or, for test doubles, "fake".
  virtual std::string backend() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

// The sub-group of the listed ranks of `comm` (torch.distributed.new_group): every rank of `comm`
// calls it with the same list; members get a communicator whose rank i is the i-th smallest
// listed rank (torch sorts the list too: {2, 0} makes rank 0 group rank 0), the others nullptr. COLLECTIVE over `comm` (one split). Throws CommError for a repeated or out-of-range
// rank.
CommunicatorPtr new_group(Communicator& comm, const std::vector<int>& ranks);

// Where this process sits in the job, as read from the environment.
struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single-process";  // "env", "openmpi", "slurm", "single-process"
};
// Pure function of the environment; throws ConfigError on inconsistent values (e.g. RANK >= WORLD_SIZE).
ProcessInfo detect_process_info();

struct InitOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // collectives and rendezvous
  // Optional ds_config.json: its "comm_timeout_seconds" sets the timeout. Precedence: an explicit
  // `timeout` above, then the config key, then env DEEPSPEED_TIMEOUT (minutes), then 30 minutes.
  std::string config_path;
  // "auto": nccl when this libtorch has CUDA and every rank of this node gets a GPU of its own
  // (LOCAL_WORLD_SIZE, else WORLD_SIZE, at most the visible GPUs) and DS_DEVICE is not "cpu";
  // otherwise gloo (which also reduces CUDA tensors, e.g. two ranks sharing one GPU). "gloo" or
  // "nccl" force one. The environment variable DS_COMM_BACKEND overrides "auto".
  std::string backend = "auto";
};

// Creates the world communicator once (later calls return it). COLLECTIVE across the job.
CommunicatorPtr init_distributed(const InitOptions& options = {});
// The communicator from init_distributed(), or nullptr before it.
CommunicatorPtr world();
bool is_initialized();

// Builds the communicator for an explicit ProcessInfo (what init_distributed does after
// detect_process_info, without touching the global): world size 1 gives the single-process
// communicator; otherwise rank 0 hosts a c10d TCPStore at master_addr:master_port and every rank
// joins a Gloo group over it. COLLECTIVE across the job. Throws CommError naming addr:port when the
// port is taken or the rendezvous times out.
CommunicatorPtr init_from_process_info(const ProcessInfo& info, const InitOptions& options = {});

// Builds a Gloo communicator over an existing store (tests run ranks as threads over one store).
// The Gloo transport binds to 127.0.0.1. `timeout` bounds every collective and the rendezvous.
// c10d stores are intrusively counted: prefer this overload (c10::make_intrusive<c10d::HashStore>()).
CommunicatorPtr make_gloo_communicator(c10::intrusive_ptr<c10d::Store> store, int rank,
                                       int world_size, std::chrono::milliseconds timeout,
                                       int local_rank = 0);
// Same, for a store owned by a std::shared_ptr (wrapped in a forwarding store).
CommunicatorPtr make_gloo_communicator(std::shared_ptr<c10d::Store> store, int rank, int world_size,
                                       std::chrono::milliseconds timeout, int local_rank = 0);

// A world-size-1 communicator whose collectives are local no-ops (copies where needed).
CommunicatorPtr make_single_process_communicator();

// The desync checker (a debug switch: config "comms_check": true or DS_COMMS_CHECK=1). Before
// each collective every rank publishes the call's kind, sequence number on this communicator,
// dtype and element count through the group's store and compares them with every other rank's;
// a difference throws CommError on every rank, naming the diverging rank and both calls
// ("rank 1 issued all_reduce #7 (float, 1024 elements, sum) but rank 0 issued all_gather #7
// (float, 2048 elements)"), and a rank that does not reach the call within the timeout is named
// as missing, with its last call. So a skipped or reordered collective is an error instead of
// a hang or a silent mix of tensors. Point-to-point send/recv pass through unchecked. Costs a
// few store round trips and a synchronisation of all ranks per collective.
// COLLECTIVE: every rank of `comm` wraps it, in the same order as its other checkers over `comm`
// (each checker's store keys are numbered by that order).
// Returns `comm` itself when it is already checked or has world size 1; the communicator must
// be a Gloo one (it has a store) otherwise CommError. Sub-groups split from a checked
// communicator are checked too.
CommunicatorPtr with_comms_check(CommunicatorPtr comm);
// True when the environment variable DS_COMMS_CHECK is "1" or "true"; throws ConfigError on
// any other non-empty value.
bool comms_check_from_env();

}  // namespace comm

// DeepSpeed-style alias: deepspeed::init_distributed().
inline comm::CommunicatorPtr init_distributed(const comm::InitOptions& options = {}) {
  return comm::init_distributed(options);
}

}  // namespace deepspeed
