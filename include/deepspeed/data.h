// Datasets, the distributed sampler and the data loader that initialize() returns.
//
// A Dataset yields single samples; the DataLoader stacks train_micro_batch_size_per_gpu of them into
// a micro-batch. The DistributedSampler gives each data-parallel rank disjoint samples: the epoch's
// permutation (a pure function of seed and epoch) is padded to a multiple of the world size and rank
// r takes positions r, r+W, r+2W, ... (PyTorch's DistributedSampler layout). So the W micro-batches
// of one step, taken together, are exactly the W*micro samples a single process would take.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

namespace deepspeed {

struct Sample {
  at::Tensor data;
  at::Tensor target;
};
using Batch = Sample;  // a micro-batch: data and target stacked along a new first dimension

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;
};

class DistributedSampler {
 public:
  // REQUIRES: dataset_size > 0, 0 <= rank < world_size.
  DistributedSampler(int64_t dataset_size, int rank, int world_size, uint64_t seed,
                     bool shuffle = true, bool drop_last = false);
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // This rank's sample indices for the current epoch, in order.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const;  // per rank per epoch

 private:
  int64_t dataset_size_;
  int rank_, world_size_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  int64_t epoch_ = 0;
};

// Position of a DataLoader, enough to resume the same sequence of batches.
struct LoaderState {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
};

class DataLoader {
 public:
  // drop_last defaults to false like DeepSpeed's dataloader_drop_last: the last micro-batch of an
  // epoch may be partial (within this rank; the sampler pads every rank's shard to equal length).
  DataLoader(std::shared_ptr<Dataset> dataset, int64_t micro_batch_size, int rank, int world_size,
             uint64_t seed, bool shuffle = true, bool drop_last = false);

  // Next micro-batch of this rank; rolls over to the next epoch at the end of one (like
  // DeepSpeed's RepeatingLoader). The samples of an epoch are visited in sampler order.
  Batch next();
  int64_t batches_per_epoch() const;
  LoaderState state() const { return {epoch_, batch_in_epoch_}; }
  void load_state(const LoaderState& s);

  // One epoch as a range: `for (auto& batch : *loader)` (starts at the current position).
  class Iterator;
  Iterator begin();
  Iterator end();

 private:
  void start_epoch(int64_t epoch);
  std::shared_ptr<Dataset> dataset_;
  int64_t micro_batch_size_;
  DistributedSampler sampler_;
  bool drop_last_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t batch_in_epoch_ = 0;
};

class DataLoader::Iterator {
 public:
  Iterator(DataLoader* loader, int64_t remaining) : loader_(loader), remaining_(remaining) {
    if (remaining_ > 0) current_ = loader_->next();
  }
  Batch& operator*() { return current_; }
  Iterator& operator++() {
    if (--remaining_ > 0) current_ = loader_->next();
    return *this;
  }
  bool operator!=(const Iterator& other) const { return remaining_ != other.remaining_; }

 private:
  DataLoader* loader_;
  int64_t remaining_;
  Batch current_;
};

}  // namespace deepspeed
