#include "gpt/text_dataset.h"

#include <fstream>
#include <iterator>

#include <torch/torch.h>

#include "deepspeed/errors.h"

namespace gpt {
namespace {
std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw deepspeed::IOError("cannot read training text '" + path + "'");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TextDataset::TextDataset(const std::string& path, int64_t block_size, int64_t stride)
    : TextDataset(read_all(path), block_size, stride, "training text '" + path + "'") {}

TextDataset::TextDataset(std::vector<uint8_t> bytes, int64_t block_size, int64_t stride)
    : TextDataset(std::move(bytes), block_size, stride, "text") {}

TextDataset::TextDataset(std::vector<uint8_t> bytes, int64_t block_size, int64_t stride,
                         const std::string& source)
    : bytes_(std::move(bytes)), block_size_(block_size), stride_(stride) {
  if (block_size <= 0 || stride <= 0)
    throw deepspeed::ConfigError("TextDataset: block_size and stride must be > 0");
  // A window is block_size bytes of input and the same shifted by one as target.
  if (static_cast<int64_t>(bytes_.size()) < block_size + 1)
    throw deepspeed::ConfigError(
        "TextDataset: " + source + " has " + std::to_string(bytes_.size()) +
        " bytes, fewer than one window of block_size + 1 = " + std::to_string(block_size + 1) +
        " (--block_size " + std::to_string(block_size) + "): give a longer text or a smaller "
        "--block_size");
}

int64_t TextDataset::size() const {
  return (static_cast<int64_t>(bytes_.size()) - block_size_ - 1) / stride_ + 1;
}

deepspeed::Sample TextDataset::get(int64_t index) const {
  auto window = torch::from_blob(const_cast<uint8_t*>(bytes_.data()) + index * stride_,
                                 {block_size_ + 1}, torch::kUInt8)
                    .to(torch::kLong);
  return {window.slice(0, 0, block_size_), window.slice(0, 1, block_size_ + 1)};
}

}  // namespace gpt
