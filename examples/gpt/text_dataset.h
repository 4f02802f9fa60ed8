// Byte-level language-modelling samples from a text file: sample i is the window of block_size
// bytes starting at i*stride (data) and the same window shifted by one byte (target).
#pragma once
#include <string>
#include <vector>

#include "deepspeed/data.h"

namespace gpt {

class TextDataset : public deepspeed::Dataset {
 public:
  // Throws deepspeed::IOError naming the path if it cannot be read, ConfigError naming the path
  // and block_size (as gpt_train's --block_size) if it is shorter than one window.
  TextDataset(const std::string& path, int64_t block_size, int64_t stride);
  TextDataset(std::vector<uint8_t> bytes, int64_t block_size, int64_t stride);
  int64_t size() const override;
  deepspeed::Sample get(int64_t index) const override;
  int64_t num_bytes() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  // `source` names the bytes in errors ("'<path>'", or "text").
  TextDataset(std::vector<uint8_t> bytes, int64_t block_size, int64_t stride,
              const std::string& source);
  std::vector<uint8_t> bytes_;
  int64_t block_size_, stride_;
};

}  // namespace gpt
