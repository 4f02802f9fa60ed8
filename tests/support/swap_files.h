// The NVMe swap files a test's engine or store holds open. They are unlinked as soon as they are
// created (offload::create_swap_file), so the folder is empty: a test that corrupts, truncates or
// restores one reaches it through /proc/self/fd.
#pragma once
#include <string>
#include <vector>

namespace dstest {

// "/proc/self/fd/<n>" for each file this process holds open that was created directly in `dir`
// and has since been unlinked, in descriptor order. truncate(2), open(2) and the
// std::filesystem calls on such a path act on the open file itself.
std::vector<std::string> unlinked_files_in(const std::string& dir);

}  // namespace dstest
