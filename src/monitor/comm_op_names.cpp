#include "monitor/comm_op_names.h"

#include <map>

namespace deepspeed {
namespace monitor {
namespace {

// Every accepted name and what it selects (ours first, then DeepSpeed's aliases).
const std::map<std::string, std::set<std::string>>& names() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"all_reduce", {"all_reduce"}},
      {"broadcast", {"broadcast"}},
      {"all_gather", {"all_gather"}},
      {"reduce_scatter", {"reduce_scatter", "reduce_scatter_v"}},
      {"reduce_scatter_v", {"reduce_scatter_v"}},
      {"all_to_all", {"all_to_all"}},
      {"send", {"send"}},
      {"recv", {"recv"}},
      {"all_gather_into_tensor", {"all_gather"}},
      {"reduce_scatter_tensor", {"reduce_scatter", "reduce_scatter_v"}},
      {"all_to_all_single", {"all_to_all"}},
      {"isend", {"send"}},
      {"irecv", {"recv"}},
  };
  return table;
}

}  // namespace

std::set<std::string> recorded_ops_named(const std::string& name) {
  const auto it = names().find(name);
  return it == names().end() ? std::set<std::string>{} : it->second;
}

std::string prof_op_selects_nothing(const std::string& path, const std::string& name) {
  std::string valid;
  for (const auto& [accepted, ops] : names()) valid += (valid.empty() ? "" : ", ") + accepted;
  return "config key '" + path + "' is \"" + name +
         "\": no collective deepspeed.cpp records has that name, so it selects nothing in the "
         "comms_logger table; the names are " + valid;
}

}  // namespace monitor
}  // namespace deepspeed
