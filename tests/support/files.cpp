#include "support/files.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace dstest {

std::string source_dir() {
  const char* src = std::getenv("DS_SOURCE_DIR");
  return src && *src ? src : DS_TEST_SOURCE_DIR;
}

std::string bin_dir() {
  const char* d = std::getenv("DS_BIN_DIR");
  return d ? d : "build/bin";
}

namespace {
std::string temp_base(TempDir::Base base) {
  if (base == TempDir::Base::kDisk) return std::filesystem::temp_directory_path().string();
  const char* env = std::getenv("TMPDIR");
  if (env && *env) return env;
  if (access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
  return "/tmp";
}
}  // namespace

TempDir::TempDir(const std::string& prefix, Base base) {
  std::string pattern = temp_base(base) + "/" + prefix + ".XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace dstest
