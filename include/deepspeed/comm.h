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
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/errors.h"

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

enum class ReduceOp { Sum, Max, Min, Avg };

// Bytes and calls per collective kind, counted on this rank (payload bytes this rank contributes).
struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;
};
using CommStats = std::map<std::string, OpStats>;  // "all_reduce", "all_gather", ...

// An in-flight collective. wait() blocks until done (throws CommError on failure/timeout) and
// finishes any post-processing (e.g. copying a converted result back into the caller's tensor).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

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
  // input: world_size * output.numel() elements; output = op over ranks of slice `rank` of input.
  virtual WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                 ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr send(at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int src, int tag = 0) = 0;
  virtual void barrier() = 0;

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

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
};

// Creates the world communicator once (later calls return it). COLLECTIVE across the job.
CommunicatorPtr init_distributed(const InitOptions& options = {});
// The communicator from init_distributed(), or nullptr before it.
CommunicatorPtr world();
bool is_initialized();

// Builds a Gloo communicator over an existing store (tests run ranks as threads over one store).
CommunicatorPtr make_gloo_communicator(std::shared_ptr<c10d::Store> store, int rank, int world_size,
                                       std::chrono::milliseconds timeout, int local_rank = 0);

// A world-size-1 communicator whose collectives are local no-ops (copies where needed).
CommunicatorPtr make_single_process_communicator();

}  // namespace comm

// DeepSpeed-style alias: deepspeed::init_distributed().
inline comm::CommunicatorPtr init_distributed(const comm::InitOptions& options = {}) {
  return comm::init_distributed(options);
}

}  // namespace deepspeed
