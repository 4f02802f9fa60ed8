#include <torch/torch.h>

#include "deepspeed/data.h"
#include "deepspeed/errors.h"

namespace deepspeed {

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, int64_t micro_batch_size, int rank,
                       int world_size, uint64_t seed, bool shuffle, bool drop_last)
    : dataset_(std::move(dataset)), micro_batch_size_(micro_batch_size),
      sampler_(dataset_->size(), rank, world_size, seed, shuffle, /*drop_last=*/false),
      drop_last_(drop_last) {
  if (micro_batch_size <= 0)
    throw ConfigError("DataLoader: micro batch size must be > 0, got " +
                      std::to_string(micro_batch_size));
  // Only with drop_last: otherwise a rank's shard (at least one sample) makes a partial batch.
  if (batches_per_epoch() == 0)
    throw ConfigError("DataLoader: dataset of " + std::to_string(dataset_->size()) + " samples, " +
                      std::to_string(sampler_.num_samples()) + " samples per rank at world size " +
                      std::to_string(world_size) + ", gives no full micro-batch of micro_batch_size " +
                      std::to_string(micro_batch_size) +
                      " and drop_last drops the partial one: an epoch of no micro-batch; use a "
                      "micro_batch_size of at most " + std::to_string(sampler_.num_samples()) +
                      " or drop_last false");
  start_epoch(0);
}

int64_t DataLoader::batches_per_epoch() const {
  int64_t n = sampler_.num_samples();
  return drop_last_ ? n / micro_batch_size_ : (n + micro_batch_size_ - 1) / micro_batch_size_;
}

void DataLoader::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  batch_in_epoch_ = 0;
  sampler_.set_epoch(epoch);
  order_ = sampler_.indices();
}

Batch DataLoader::next() {
  if (batch_in_epoch_ >= batches_per_epoch()) start_epoch(epoch_ + 1);
  const int64_t first = batch_in_epoch_ * micro_batch_size_;
  const int64_t last = std::min<int64_t>(first + micro_batch_size_, order_.size());
  std::vector<at::Tensor> data, target;
  for (int64_t k = first; k < last; ++k) {
    Sample s = dataset_->get(order_[k]);
    data.push_back(s.data);
    target.push_back(s.target);
  }
  ++batch_in_epoch_;
  return {torch::stack(data), torch::stack(target)};
}

void DataLoader::load_state(const LoaderState& s) {
  start_epoch(s.epoch);
  batch_in_epoch_ = s.batch_in_epoch;
}

DataLoader::Iterator DataLoader::begin() {
  if (batch_in_epoch_ >= batches_per_epoch()) start_epoch(epoch_ + 1);
  return Iterator(this, batches_per_epoch() - batch_in_epoch_);
}
DataLoader::Iterator DataLoader::end() { return Iterator(this, 0); }

}  // namespace deepspeed
