// DeepSpeed's command-line habits: --deepspeed_config FILE (alias --deepspeed_config=FILE,
// --deepscale_config) and the --local_rank=K that dsrun appends. Everything else is kept for the
// program in `rest` (argv[0] first), so it can run its own parser over it.
#pragma once
#include <string>
#include <vector>

namespace deepspeed {

struct Args {
  std::string config_path;  // empty if not given
  int local_rank = -1;      // -1 if not given
  std::vector<std::string> rest;
};

Args parse_args(int argc, char** argv);

}  // namespace deepspeed
