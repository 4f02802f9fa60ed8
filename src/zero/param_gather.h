// Stages 1 and 2: the owner's updated partition all-gathered back into every rank's flat buffer,
// in chunks: chunk c is elements [c, c + n) of every partition, at most allgather_bucket_size
// elements over all ranks (n = allgather_bucket_size / N). One chunk spanning the partitions is
// one all_gather in place; a smaller one an all_gather_into the N views of the buffer, received
// in place over Gloo, through the backend's temporary elsewhere (NCCL: deepspeed/comm.h).
//
//   gather()  waits for each chunk before launching the next, smallest offset first: what the
//             step does by default (DeepSpeed's stage 1/2 all-gather after the step).
//   launch()  zero_optimization.overlap_param_gather (deepspeed.cpp's key, after Megatron-LM's
//             --overlap-param-gather): every chunk is launched at once, and nothing is waited
//             for. The chunks go in the order the next forward first reads them
//             (set_forward_order: a chunk reads as soon as its soonest element in any partition;
//             ties and, without an order, every chunk: largest offset first, as FlatParams lays
//             the parameters out in reverse and the end of a partition holds its first layers).
//             settle(begin, end) finishes, in launch order, the chunks up to the last one holding
//             any of buffer elements [begin, end) (zero/forward_waits.h calls it per ZeroUnit);
//             complete_step() all of them. Waiting never launches: every rank launches the same
//             collectives at the same point of its program (the step), whichever of them waits
//             sooner. Where the backend stages a chunk (not Gloo), the temporaries of all
//             chunks exist together until each is finished: up to one more copy of the
//             parameters between step() and the forward that settles them.
// On a GPU a chunk's wait() makes the compute stream wait for the collective (c10d's work), and
// its copy out follows on that stream: the host does not block.
#pragma once
#include <cstdint>
#include <vector>

#include "zero/flat_params.h"
#include "zero/pending_update.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

class ParamGather final : public PendingUpdate {
 public:
  // `chunk_numel`: elements of each partition per all-gather (>= 1).
  ParamGather(const StageContext& context, FlatParams& flat, int owner, int64_t chunk_numel);
  ~ParamGather() override;  // waits for chunks still in flight, quietly (an error was thrown)
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  // `first_read(begin, end)`: when the next forward first reads buffer elements [begin, end).
  void set_forward_order(const ReadOrder& first_read);
  // Every rank's buffer holds every partition. COLLECTIVE.
  void gather();
  // Every chunk launched, none waited for; a launch still in flight is finished first. COLLECTIVE.
  void launch();
  void settle(int64_t begin, int64_t end) override;
  void complete_step() override;
  bool in_flight() const { return finished_ < chunks_.size(); }
  // Chunks a launch() made, and how many are finished (tests, logs).
  size_t launched_chunks() const { return chunks_.size(); }
  size_t finished_chunks() const { return finished_; }

 private:
  struct Chunk {
    int64_t offset = 0, numel = 0;  // in each partition
    comm::WorkPtr work;
  };
  Chunk start(int64_t offset);
  void finish(Chunk& chunk);
  int64_t chunk_index(int64_t offset_in_partition) const { return offset_in_partition / chunk_; }
  void order_chunks(const ReadOrder& first_read);

  StageContext ctx_;
  FlatParams& flat_;
  int owner_;
  int64_t chunk_;
  std::vector<int64_t> launch_order_;  // chunk indices (offset / chunk_), as launched
  std::vector<int64_t> position_;      // chunk index -> its place in launch_order_
  std::vector<Chunk> chunks_;  // launch order; [0, finished_) are finished
  size_t finished_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
