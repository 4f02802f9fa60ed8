#include "deepspeed/args.h"

#include <string>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

bool take_value(const std::string& arg, const std::string& name, int argc, char** argv, int& i,
                std::string& out) {
  if (arg == name) {
    if (i + 1 >= argc) throw ConfigError("command line: " + name + " needs a value");
    out = argv[++i];
    return true;
  }
  if (arg.rfind(name + "=", 0) == 0) {
    out = arg.substr(name.size() + 1);
    return true;
  }
  return false;
}

}  // namespace

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc > 0) a.rest.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (take_value(arg, "--deepspeed_config", argc, argv, i, value) ||
        take_value(arg, "--deepscale_config", argc, argv, i, value)) {
      a.config_path = value;
    } else if (take_value(arg, "--local_rank", argc, argv, i, value)) {
      try {
        a.local_rank = std::stoi(value);
      } catch (const std::exception&) {
        throw ConfigError("command line: --local_rank expects an integer, got '" + value + "'");
      }
    } else {
      a.rest.push_back(arg);
    }
  }
  return a;
}

}  // namespace deepspeed
