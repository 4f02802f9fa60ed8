// Where this process sits in the job, read from the variables each launcher sets. Sources are
// tried in a fixed order (dsrun/torchrun, OpenMPI, Slurm) and the first one present wins, so a
// dsrun job started inside a Slurm allocation still uses dsrun's numbering.
#include "comm/process_info.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/blocks.h"
#include "config/hjson_reader.h"

namespace deepspeed {
namespace comm {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A whole decimal number, or ConfigError naming the variable and what it held.
long parse_int(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < INT32_MIN ||
      v > INT32_MAX) {
    throw ConfigError(fmt::format("environment variable {}='{}' is not an integer", name, text));
  }
  return v;
}

int int_var(const char* name, int fallback) {
  auto v = env(name);
  return v ? static_cast<int>(parse_int(name, *v)) : fallback;
}

struct VarNames {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;
};

constexpr VarNames kTorchrun{"env", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr VarNames kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK"};
constexpr VarNames kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};

// Rank and world size come as a pair: one without the other is a broken launch, not a
// single-process run.
bool present(const VarNames& n) {
  bool has_rank = env(n.rank).has_value();
  bool has_world = env(n.world).has_value();
  if (has_rank != has_world) {
    throw ConfigError(fmt::format("environment variable {} is set but {} is not",
                                  has_rank ? n.rank : n.world, has_rank ? n.world : n.rank));
  }
  return has_rank;
}

void validate(const ProcessInfo& p, const VarNames& n) {
  if (p.world_size < 1) {
    throw ConfigError(
        fmt::format("environment variable {}={} must be at least 1", n.world, p.world_size));
  }
  if (p.rank < 0 || p.rank >= p.world_size) {
    throw ConfigError(fmt::format("environment variable {}={} must be in [0, {}={})", n.rank,
                                  p.rank, n.world, p.world_size));
  }
  if (p.local_rank < 0 || p.local_rank >= p.world_size) {
    throw ConfigError(fmt::format("environment variable {}={} must be in [0, {}={})", n.local_rank,
                                  p.local_rank, n.world, p.world_size));
  }
  if (p.master_port < 1 || p.master_port > 65535) {
    throw ConfigError(
        fmt::format("environment variable MASTER_PORT={} must be in [1, 65535]", p.master_port));
  }
  if (p.master_addr.empty()) throw ConfigError("environment variable MASTER_ADDR is empty");
}

ProcessInfo read(const VarNames& n, const std::string& default_addr) {
  ProcessInfo p;
  p.source = n.source;
  p.rank = int_var(n.rank, 0);
  p.world_size = int_var(n.world, 1);
  p.local_rank = int_var(n.local_rank, 0);
  p.master_addr = env("MASTER_ADDR").value_or(default_addr);
  p.master_port = int_var("MASTER_PORT", 29500);
  validate(p, n);
  return p;
}

}  // namespace

ProcessInfo detect_process_info() {
  if (present(kTorchrun)) return read(kTorchrun, "127.0.0.1");
  if (present(kOpenMpi)) return read(kOpenMpi, "127.0.0.1");
  if (present(kSlurm)) {
    return read(kSlurm, env("SLURM_LAUNCH_NODE_IPADDR").value_or("127.0.0.1"));
  }
  return ProcessInfo{};
}

int local_world_size(int fallback) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                           "SLURM_NTASKS_PER_NODE"}) {
    if (auto v = env(name)) return static_cast<int>(parse_int(name, *v));
  }
  return fallback;
}

std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // The port is irrelevant: connect() on a UDP socket only picks the route and source address.
  int rc = ::getaddrinfo(master_addr.c_str(), "9", &hints, &found);
  if (rc != 0) {
    throw CommError(fmt::format("MASTER_ADDR {} cannot be resolved: {}", master_addr,
                                ::gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
              ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    if (!ok) why = std::strerror(errno);
    ::close(fd);
    if (!ok) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* bytes = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    ::inet_ntop(local.ss_family, bytes, text, sizeof text);
    ::freeaddrinfo(found);
    return text;
  }
  ::freeaddrinfo(found);
  throw CommError(fmt::format("no network route from this host to MASTER_ADDR {}: {} (set "
                              "GLOO_SOCKET_IFNAME to the interface to use)", master_addr, why));
}

namespace {
// "comm_timeout_seconds" of a ds_config.json, if the key is there. The file is read as
// load_config reads it (hjson: comments, trailing commas, quoteless values) and the key by
// parse_config's own rule (config::read_comm_timeout_seconds), so a value is taken here exactly
// when initialize() takes it. Only this key is read: the rest of the config is validated by
// initialize(), once the world size is known.
std::optional<std::chrono::milliseconds> config_timeout(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read config file '{}'", path));
  std::ostringstream text;
  text << in.rdbuf();
  // A syntax error throws here, naming the file and the position.
  const nlohmann::json doc = config::parse_hjson(text.str(), path);
  if (!doc.is_object()) return std::nullopt;  // initialize() says what the root must be
  std::vector<std::string> unused;  // no warnings: only one key is read
  config::Warnings warnings(&unused);
  config::ObjectReader top(doc, "", warnings);
  std::optional<int64_t> seconds;
  try {
    seconds = config::read_comm_timeout_seconds(top);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (in " + path + ")");
  }
  if (!seconds) return std::nullopt;
  return std::chrono::seconds(*seconds);
}
}  // namespace

std::chrono::milliseconds resolve_timeout(const InitOptions& options) {
  if (options.timeout != InitOptions{}.timeout) return options.timeout;
  if (!options.config_path.empty())
    if (auto t = config_timeout(options.config_path)) return *t;
  auto minutes = env("DEEPSPEED_TIMEOUT");
  if (!minutes) return options.timeout;
  long m = parse_int("DEEPSPEED_TIMEOUT", *minutes);
  if (m <= 0) {
    throw ConfigError(fmt::format(
        "environment variable DEEPSPEED_TIMEOUT='{}' must be a positive number of minutes",
        *minutes));
  }
  return std::chrono::minutes(m);
}

}  // namespace comm
}  // namespace deepspeed
