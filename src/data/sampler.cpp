#include <numeric>
#include <random>
#include <string>

#include "deepspeed/data.h"
#include "deepspeed/errors.h"

namespace deepspeed {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       uint64_t seed, bool shuffle, bool drop_last)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), seed_(seed),
      shuffle_(shuffle), drop_last_(drop_last) {
  if (dataset_size <= 0) throw ConfigError("DistributedSampler: the dataset is empty");
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw ConfigError("DistributedSampler: rank " + std::to_string(rank) +
                      " is outside world size " + std::to_string(world_size));
  if (drop_last && dataset_size < world_size)
    throw ConfigError("DistributedSampler: dataset of " + std::to_string(dataset_size) +
                      " samples is smaller than the world size " + std::to_string(world_size));
}

void DistributedSampler::set_epoch(int64_t epoch) { epoch_ = epoch; }

int64_t DistributedSampler::num_samples() const {
  return drop_last_ ? dataset_size_ / world_size_
                    : (dataset_size_ + world_size_ - 1) / world_size_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(dataset_size_);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    // Own Fisher-Yates over mt19937_64 (both fully specified by the standard), so the order is
    // the same on every platform and standard library: ranks must agree on it.
    std::mt19937_64 gen(seed_ + static_cast<uint64_t>(epoch_));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
      std::swap(all[i], all[j]);
    }
  }
  const int64_t total = num_samples() * world_size_;
  for (int64_t k = dataset_size_; k < total; ++k) all.push_back(all[k - dataset_size_]);  // pad
  all.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(num_samples());
  for (int64_t k = rank_; k < total; k += world_size_) mine.push_back(all[k]);
  return mine;
}

}  // namespace deepspeed
