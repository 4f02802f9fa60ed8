#include "world.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "spawn.h"  // LaunchError

namespace deepspeed {
namespace launcher {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// A whole non-negative decimal number, or -1.
long whole_number(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::strtol(s.c_str(), nullptr, 10);
}

// Host names end up in world info and in shell commands: keep them to what DNS and ssh allow.
bool valid_host_name(const std::string& h) {
  if (h.empty() || h[0] == '-') return false;
  return h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") ==
         std::string::npos;
}

const HostSlots* find_host(const Resources& pool, const std::string& host) {
  for (const auto& h : pool)
    if (h.host == host) return &h;
  return nullptr;
}

std::string known_hosts(const Resources& pool) {
  std::string out;
  for (const auto& h : pool) out += (out.empty() ? "" : ", ") + h.host;
  return out;
}

// A parsed NODE_SPEC: host, and slots (empty = all of them).
struct NodeSpec {
  std::string host;
  std::vector<int> slots;
};

std::vector<NodeSpec> parse_spec(const std::string& spec, const std::string& flag) {
  if (trim(spec).empty()) throw LaunchError(flag + " is empty");
  std::vector<NodeSpec> out;
  std::set<std::string> seen;
  for (const std::string& part : split(spec, '@')) {
    NodeSpec n;
    size_t colon = part.find(':');
    n.host = part.substr(0, colon);
    if (!valid_host_name(n.host))
      throw LaunchError(flag + " '" + spec + "': '" + part + "' does not start with a host name");
    if (!seen.insert(n.host).second)
      throw LaunchError(flag + " '" + spec + "': host " + n.host + " is named twice");
    if (colon != std::string::npos) {
      for (const std::string& s : split(part.substr(colon + 1), ',')) {
        long v = whole_number(s);
        if (v < 0)
          throw LaunchError(flag + " '" + spec + "': slot '" + s + "' of host " + n.host +
                            " is not a slot number");
        n.slots.push_back(static_cast<int>(v));
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

void check_slots_exist(const HostSlots& have, const NodeSpec& want, const std::string& flag,
                       const std::string& spec) {
  for (int s : want.slots)
    if (std::find(have.slots.begin(), have.slots.end(), s) == have.slots.end())
      throw LaunchError(flag + " '" + spec + "': host " + want.host + " has no slot " +
                        std::to_string(s) + " (its slots: " + std::to_string(have.slots.size()) +
                        ")");
}

const NodeSpec* find_spec(const std::vector<NodeSpec>& specs, const std::string& host) {
  for (const auto& s : specs)
    if (s.host == host) return &s;
  return nullptr;
}

void check_hosts_exist(const Resources& pool, const std::vector<NodeSpec>& specs,
                       const std::string& flag, const std::string& spec,
                       const std::string& pool_name) {
  for (const auto& s : specs) {
    const HostSlots* h = find_host(pool, s.host);
    if (h == nullptr)
      throw LaunchError(flag + " '" + spec + "': host " + s.host + " is not in " + pool_name +
                        " (" + known_hosts(pool) + ")");
    check_slots_exist(*h, s, flag, spec);
  }
}

}  // namespace

Resources parse_hostfile(const std::string& text, const std::string& path) {
  Resources pool;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return LaunchError("hostfile " + path + " line " + std::to_string(line_no) + " '" +
                         trim(raw) + "': " + why);
    };
    // Words after slots=N (OpenMPI's max_slots=N, ...) are ignored, as DeepSpeed's
    // re.search(r'^(\S+)\s+slots=(\d+)', line) does: one hostfile can serve both.
    std::istringstream words(line);
    std::string host, slots_word;
    words >> host >> slots_word;
    if (slots_word.empty()) throw bad("expected 'HOST slots=N'");
    // DeepSpeed's regex takes 'user@host' too; here '@' separates hosts in --include/--exclude,
    // so a user name would make those ambiguous: it belongs in ~/.ssh/config.
    if (host.find('@') != std::string::npos)
      throw bad("'" + host + "': user@host is not accepted (an '@' separates hosts in " +
                "--include/--exclude); set the user in ~/.ssh/config (Host " +
                host.substr(host.find('@') + 1) + " / User " + host.substr(0, host.find('@')) + ")");
    if (!valid_host_name(host)) throw bad("'" + host + "' is not a host name");
    if (slots_word.rfind("slots=", 0) != 0) throw bad("expected slots=N after the host name");
    long n = whole_number(slots_word.substr(6));
    if (n < 1) throw bad("slots must be a whole number >= 1");
    if (find_host(pool, host)) throw bad("host " + host + " is listed twice");
    HostSlots h{host, {}};
    for (int i = 0; i < n; ++i) h.slots.push_back(i);
    pool.push_back(std::move(h));
  }
  return pool;
}

Resources read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw LaunchError("cannot read hostfile " + path);
  std::stringstream text;
  text << in.rdbuf();
  Resources pool = parse_hostfile(text.str(), path);
  if (pool.empty()) throw LaunchError("hostfile " + path + " lists no hosts");
  return pool;
}

Resources local_pool(int slots) {
  HostSlots h{"localhost", {}};
  for (int i = 0; i < slots; ++i) h.slots.push_back(i);
  return {h};
}

Resources include_only(const Resources& pool, const std::string& spec, const std::string& flag,
                       const std::string& pool_name) {
  std::vector<NodeSpec> specs = parse_spec(spec, flag);
  check_hosts_exist(pool, specs, flag, spec, pool_name);
  Resources out;
  for (const auto& h : pool) {
    const NodeSpec* s = find_spec(specs, h.host);
    if (s == nullptr) continue;
    HostSlots kept{h.host, {}};
    for (int slot : h.slots)
      if (s->slots.empty() || std::count(s->slots.begin(), s->slots.end(), slot))
        kept.slots.push_back(slot);
    out.push_back(std::move(kept));
  }
  return out;
}

Resources exclude(const Resources& pool, const std::string& spec, const std::string& flag,
                  const std::string& pool_name) {
  std::vector<NodeSpec> specs = parse_spec(spec, flag);
  check_hosts_exist(pool, specs, flag, spec, pool_name);
  Resources out;
  for (const auto& h : pool) {
    const NodeSpec* s = find_spec(specs, h.host);
    if (s != nullptr && s->slots.empty()) continue;
    HostSlots kept{h.host, {}};
    for (int slot : h.slots)
      if (s == nullptr || !std::count(s->slots.begin(), s->slots.end(), slot))
        kept.slots.push_back(slot);
    if (!kept.slots.empty()) out.push_back(std::move(kept));
  }
  return out;
}

Resources select_resources(const Resources& pool, const std::string& include,
                           const std::string& exclude_spec, int num_nodes, int num_procs,
                           const std::string& pool_name) {
  if (!include.empty() && !exclude_spec.empty())
    throw LaunchError("--include and --exclude cannot be used together");
  Resources world = pool;
  if (!include.empty()) world = include_only(world, include, "--include", pool_name);
  if (!exclude_spec.empty()) world = exclude(world, exclude_spec, "--exclude", pool_name);
  if (world.empty()) throw LaunchError("no hosts are left after --exclude " + exclude_spec);
  if (num_nodes > 0) {
    if (num_nodes > static_cast<int>(world.size()))
      throw LaunchError("--num_nodes " + std::to_string(num_nodes) + " asks for more hosts than the " +
                        std::to_string(world.size()) + " available (" + known_hosts(world) + ")");
    world.resize(num_nodes);
  }
  if (num_procs > 0) {
    for (auto& h : world) {
      if (num_procs > static_cast<int>(h.slots.size()))
        throw LaunchError("--num_procs/--num_gpus " + std::to_string(num_procs) + ": host " + h.host +
                          " has only " + std::to_string(h.slots.size()) + " slots");
      h.slots.resize(num_procs);
    }
  }
  return world;
}

std::string encode_world(const Resources& world) {
  std::string out;
  for (const auto& h : world) {
    if (!out.empty()) out += "@";
    out += h.host;
    for (size_t i = 0; i < h.slots.size(); ++i) out += (i ? "," : ":") + std::to_string(h.slots[i]);
  }
  return out;
}

Resources decode_world(const std::string& text) {
  Resources world;
  for (const NodeSpec& s : parse_spec(text, "--world_info")) {
    if (s.slots.empty()) throw LaunchError("--world_info '" + text + "': host " + s.host + " has no slots");
    world.push_back({s.host, s.slots});
  }
  return world;
}

int world_size(const Resources& world) {
  int n = 0;
  for (const auto& h : world) n += static_cast<int>(h.slots.size());
  return n;
}

NodePlacement place_node(const Resources& world, int node_rank) {
  if (node_rank < 0 || node_rank >= static_cast<int>(world.size()))
    throw LaunchError("--node_rank " + std::to_string(node_rank) + " is not a node of the world (" +
                      std::to_string(world.size()) + " nodes: " + known_hosts(world) + ")");
  NodePlacement p;
  p.node_rank = node_rank;
  p.num_nodes = static_cast<int>(world.size());
  p.world_size = world_size(world);
  for (int i = 0; i < node_rank; ++i) p.first_rank += static_cast<int>(world[i].slots.size());
  p.host = world[node_rank].host;
  p.slots = world[node_rank].slots;
  p.local_size = static_cast<int>(p.slots.size());
  return p;
}

}  // namespace launcher
}  // namespace deepspeed
