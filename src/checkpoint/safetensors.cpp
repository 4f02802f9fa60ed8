#include "checkpoint/safetensors.h"

#include <algorithm>
#include <array>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "deepspeed/errors.h"

// safetensors stores little-endian bytes; tensors are written and read as their raw memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace deepspeed {
namespace checkpoint {
namespace {

struct DtypeInfo {
  at::ScalarType type;
  const char* name;
};
constexpr std::array<DtypeInfo, 10> kDtypes = {{{at::kFloat, "F32"},
                                                {at::kBFloat16, "BF16"},
                                                {at::kHalf, "F16"},
                                                {at::kDouble, "F64"},
                                                {at::kLong, "I64"},
                                                {at::kInt, "I32"},
                                                {at::kShort, "I16"},
                                                {at::kChar, "I8"},
                                                {at::kByte, "U8"},
                                                {at::kBool, "BOOL"}}};

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

constexpr const char* kHeaderMetadataKey = "__metadata__";

using Entry = SafetensorsEntry;

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw CheckpointError("safetensors file '" + path + "': " + what);
}

uint64_t byte_size(const at::Tensor& t) { return uint64_t(t.numel()) * t.element_size(); }

std::string quoted(const std::string& name) { return "tensor \"" + name + "\": "; }

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::ordered_json& j) {
  const std::string where = quoted(name);
  if (!j.is_object()) bad_file(path, where + "header entry must be an object, got " + j.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) bad_file(path, where + "header entry lacks \"" + key + "\"");
  }
  Entry e;
  e.name = name;
  const auto& dtype = j.at("dtype");
  const auto found = std::find_if(kDtypes.begin(), kDtypes.end(), [&](const DtypeInfo& d) {
    return dtype.is_string() && dtype.get<std::string>() == d.name;
  });
  if (found == kDtypes.end()) bad_file(path, where + "unsupported dtype " + dtype.dump());
  e.dtype = found->type;

  const auto& shape = j.at("shape");
  if (!shape.is_array()) bad_file(path, where + "\"shape\" must be an array, got " + shape.dump());
  uint64_t bytes = c10::elementSize(e.dtype);
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX)) {
      bad_file(path, where + "bad dimension " + d.dump() + " in shape " + shape.dump());
    }
    if (__builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes)) {
      bad_file(path, where + "shape " + shape.dump() + " is too large");
    }
    e.shape.push_back(d.get<int64_t>());
  }

  const auto& offsets = j.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>()) {
    bad_file(path, where + "\"data_offsets\" must be [begin, end] with 0 <= begin <= end, got " + offsets.dump());
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.end - e.begin != bytes) {
    bad_file(path, where + "data_offsets " + offsets.dump() + " span " + std::to_string(e.end - e.begin) +
                       " bytes, but dtype " + dtype.get<std::string>() + " and shape " + shape.dump() +
                       " need " + std::to_string(bytes));
  }
  return e;
}

// Offsets must tile the data buffer exactly: no gaps, no overlaps, nothing past the end.
void check_layout(const std::string& path, std::vector<Entry> entries, uint64_t data_bytes) {
  std::stable_sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.end > data_bytes) {
      bad_file(path, quoted(e.name) + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         "] run past the end of the data (" + std::to_string(data_bytes) +
                         " bytes): the file is truncated");
    }
    if (e.begin != expected) {
      bad_file(path, quoted(e.name) + "data starts at " + std::to_string(e.begin) + ", expected " +
                         std::to_string(expected) + " (tensors must be stored back to back)");
    }
    expected = e.end;
  }
  if (expected != data_bytes) {
    bad_file(path, "the data section has " + std::to_string(data_bytes) + " bytes but the tensors cover " +
                       std::to_string(expected));
  }
}

SafetensorsMetadata parse_metadata(const std::string& path, const nlohmann::ordered_json& j) {
  if (!j.is_object()) bad_file(path, "\"__metadata__\" must be an object of strings, got " + j.dump());
  SafetensorsMetadata m;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) bad_file(path, "\"__metadata__\" value of \"" + k + "\" must be a string, got " + v.dump());
    m[k] = v.get<std::string>();
  }
  return m;
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.type == dtype) return d.name;
  }
  throw CheckpointError(std::string("dtype ") + c10::toString(dtype) + " cannot be stored in safetensors");
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsIndex::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h[kHeaderMetadataKey] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    if (e.name == kHeaderMetadataKey || !seen.insert(e.name).second) {
      throw CheckpointError("safetensors: tensor name \"" + e.name + "\" is " +
                            (e.name == kHeaderMetadataKey ? "reserved" : "used twice"));
    }
    std::string dtype;
    try {
      dtype = safetensors_dtype_name(e.dtype);
    } catch (const CheckpointError& err) {  // name the tensor at fault, not only its dtype
      throw CheckpointError("safetensors: tensor \"" + e.name + "\": " + err.what());
    }
    const uint64_t bytes = uint64_t(e.numel()) * c10::elementSize(e.dtype);
    h[e.name] = {{"dtype", dtype},
                 {"shape", e.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((uint64_t(json.size()) >> (8 * i)) & 0xFF);
  return out + json;
}

std::string safetensors_header(const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  return safetensors_header(entries, metadata);
}

SafetensorsWriter::SafetensorsWriter(WritableFile& file, std::string path,
                                     std::vector<SafetensorsEntry> entries)
    : file_(file), path_(std::move(path)), entries_(std::move(entries)) {
  uint64_t offset = 0;
  for (auto& e : entries_) {
    e.begin = offset;
    e.end = offset += uint64_t(e.numel()) * c10::elementSize(e.dtype);
  }
}

void SafetensorsWriter::advance(at::ScalarType dtype, uint64_t bytes, const void* data) {
  while (current_ < entries_.size() &&
         written_ == entries_[current_].end - entries_[current_].begin) {
    ++current_;
    written_ = 0;
  }
  if (bytes == 0) return;
  if (current_ == entries_.size())
    throw CheckpointError("safetensors '" + path_ + "': " + std::to_string(bytes) +
                          " bytes written past the last tensor");
  const Entry& e = entries_[current_];
  if (dtype != e.dtype)
    throw CheckpointError("safetensors '" + path_ + "': " + quoted(e.name) + "a piece of dtype " +
                          c10::toString(dtype) + " for a tensor of " + c10::toString(e.dtype));
  if (written_ + bytes > e.end - e.begin)
    throw CheckpointError("safetensors '" + path_ + "': " + quoted(e.name) + "pieces of " +
                          std::to_string(written_ + bytes) + " bytes for a tensor of " +
                          std::to_string(e.end - e.begin));
  file_.append(data, bytes);
  written_ += bytes;
}

void SafetensorsWriter::append(const at::Tensor& device_piece) {
  // State on a GPU is written through a host copy of the piece (one piece at a time, so a
  // checkpoint never holds more than a window of it in host memory).
  const at::Tensor piece = device_piece.is_cpu() ? device_piece : device_piece.cpu().contiguous();
  TORCH_CHECK(piece.is_contiguous(), "SafetensorsWriter::append: pieces must be contiguous");
  advance(piece.scalar_type(), byte_size(piece), piece.numel() > 0 ? piece.data_ptr() : nullptr);
}

void SafetensorsWriter::append_zeros(at::ScalarType dtype, int64_t numel) {
  static const std::vector<char> zeros(size_t(1) << 20, 0);
  uint64_t left = uint64_t(numel) * c10::elementSize(dtype);
  while (left > 0) {
    const uint64_t n = std::min<uint64_t>(left, zeros.size());
    advance(dtype, n, zeros.data());
    left -= n;
  }
}

void SafetensorsWriter::finish() const {
  for (size_t i = current_; i < entries_.size(); ++i) {
    const uint64_t have = i == current_ ? written_ : 0, want = entries_[i].end - entries_[i].begin;
    if (have != want)
      throw CheckpointError("safetensors '" + path_ + "': " + quoted(entries_[i].name) + "got " +
                            std::to_string(have) + " of its " + std::to_string(want) + " bytes");
  }
}

void write_safetensors_streamed(FileSystem& fs, const std::string& path,
                                const std::vector<SafetensorsEntry>& entries,
                                const SafetensorsMetadata& metadata,
                                const std::function<void(SafetensorsWriter&)>& fill) {
  std::string header;
  try {
    header = safetensors_header(entries, metadata);
  } catch (const CheckpointError& e) {  // the file it was for, not only the tensor at fault
    std::string what = e.what();
    const std::string generic = "safetensors: ";
    if (what.rfind(generic, 0) == 0) what.erase(0, generic.size());
    throw CheckpointError("safetensors '" + path + "': " + what);
  }
  // The readers' limit (ours and the reference's): a file past it could be written but never read.
  if (header.size() - 8 > kMaxHeaderBytes)
    throw CheckpointError("safetensors '" + path + "': its header would be " +
                          std::to_string(header.size() - 8) + " bytes, over the " +
                          std::to_string(kMaxHeaderBytes) +
                          "-byte (100 MiB) limit of safetensors readers; its metadata is too "
                          "large (a checkpoint's model-states file holds the client_state there)");
  fs.write_file_atomic(path, [&](WritableFile& f) {
    f.append(header.data(), header.size());
    SafetensorsWriter writer(f, path, entries);
    fill(writer);
    writer.finish();
  });
}

void write_safetensors(FileSystem& fs, const std::string& path, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata) {
  NamedTensors cpu;
  cpu.reserve(tensors.size());
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw CheckpointError("safetensors '" + path + "': tensor \"" + name + "\" is undefined");
    cpu.emplace_back(name, t.detach().to(at::kCPU).contiguous());
    entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  write_safetensors_streamed(fs, path, entries, metadata, [&](SafetensorsWriter& w) {
    for (const auto& [name, t] : cpu) w.append(t);
  });
}

void write_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  write_safetensors(posix_file_system(), path, tensors, metadata);
}

SafetensorsIndex read_safetensors_index(ReadableFile& file_ref, const std::string& path) {
  ReadableFile* file = &file_ref;
  const uint64_t size = file->size();
  if (size < 8) bad_file(path, "has " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  unsigned char len_bytes[8];
  file->read_at(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes) bad_file(path, "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > size - 8) {
    bad_file(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(size) + " bytes): the file is truncated");
  }
  std::string text(n, '\0');
  if (n > 0) file->read_at(8, &text[0], n);
  // Parsed in file order, so tensors sharing an offset (zero-sized ones) keep their order.
  nlohmann::ordered_json h;
  try {
    h = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    bad_file(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) bad_file(path, "header must be a JSON object");

  SafetensorsIndex out;
  for (const auto& [key, value] : h.items()) {
    if (key == kHeaderMetadataKey) {
      out.metadata = parse_metadata(path, value);
    } else {
      out.entries.push_back(parse_entry(path, key, value));
    }
  }
  out.data_start = 8 + n;
  check_layout(path, out.entries, size - out.data_start);
  return out;
}

void read_safetensors_range(ReadableFile& file, const std::string& path,
                            const SafetensorsIndex& index, const SafetensorsEntry& e,
                            int64_t offset, at::Tensor dst) {
  const int64_t numel = dst.numel();
  if (dst.scalar_type() != e.dtype)
    bad_file(path, quoted(e.name) + "read into a " + c10::toString(dst.scalar_type()) +
                       " tensor, the file holds " + c10::toString(e.dtype));
  if (offset < 0 || offset + numel > e.numel())
    bad_file(path, quoted(e.name) + "elements [" + std::to_string(offset) + ", " +
                       std::to_string(offset + numel) + ") are outside its " +
                       std::to_string(e.numel()));
  if (numel == 0) return;
  // Read straight into dst when it is contiguous host memory; else (strided, or on a GPU)
  // through a host buffer.
  at::Tensor into = dst.is_contiguous() && dst.is_cpu()
                        ? dst
                        : at::empty({numel}, dst.options().device(at::kCPU));
  const uint64_t element = c10::elementSize(e.dtype);
  try {
    file.read_at(index.data_start + e.begin + uint64_t(offset) * element, into.data_ptr(),
                 uint64_t(numel) * element);
  } catch (const IOError& err) {
    bad_file(path, quoted(e.name) + err.what());
  }
  if (!into.is_same(dst)) dst.copy_(into.view(dst.sizes()));
}

SafetensorsFile read_safetensors(FileSystem& fs, const std::string& path) {
  if (!fs.exists(path)) bad_file(path, "does not exist");
  auto file = fs.open_file(path);
  const SafetensorsIndex index = read_safetensors_index(*file, path);
  SafetensorsFile out;
  out.metadata = index.metadata;
  // In data order (the header's may differ in files written elsewhere).
  std::vector<SafetensorsEntry> entries = index.entries;
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  for (const auto& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) read_safetensors_range(*file, path, index, e, 0, t.view({-1}));
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile read_safetensors(const std::string& path) { return read_safetensors(posix_file_system(), path); }

}  // namespace checkpoint
}  // namespace deepspeed
