#include "comm/exit_order.h"
#include "comm/store_bytes.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {
namespace {

using Clock = std::chrono::steady_clock;
const char* const kPortKey = "ds_exit/port";

// Rank 0's side, kept until the process ends (never destroyed: it is read by the atexit handler).
struct RankZeroSide {
  c10::intrusive_ptr<c10d::Store> store;  // held so that the store server outlives every client
  std::vector<int> fds;                   // one connection per rank > 0
  std::vector<int> ranks;                 // the rank on each connection
  std::chrono::milliseconds timeout{0};
  std::function<void()> before_wait;
};
RankZeroSide* g_rank_zero = nullptr;

int milliseconds_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// A listening socket on every address of this host (IPv6 with IPv4 mapped when the kernel has
// IPv6, IPv4 otherwise) and an ephemeral port; returns {fd, port}.
std::pair<int, int> listen_anywhere(int backlog) {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw CommError(fmt::format("rank 0 cannot open the exit-order socket: {}",
                                  std::strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw CommError("rank 0 cannot listen on the exit-order socket: " + why);
  }
  const int port = bound.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return {fd, port};
}

// Reads exactly n bytes before the deadline; false on end of stream, error or time-out.
bool read_exactly(int fd, void* out, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, milliseconds_left(deadline)) <= 0) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

void rank_zero_accepts(RankZeroSide& side, int listener, int world, Clock::time_point deadline) {
  std::vector<bool> seen(static_cast<size_t>(world), false);
  while (static_cast<int>(side.fds.size()) < world - 1) {
    pollfd pfd{listener, POLLIN, 0};
    if (::poll(&pfd, 1, milliseconds_left(deadline)) <= 0) break;
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int32_t rank = -1;
    if (!read_exactly(fd, &rank, sizeof rank, deadline) || rank <= 0 || rank >= world ||
        seen[static_cast<size_t>(rank)]) {
      ::close(fd);  // not one of ours (a port scan, a stray process): keep waiting for the ranks
      continue;
    }
    seen[static_cast<size_t>(rank)] = true;
    side.fds.push_back(fd);
    side.ranks.push_back(rank);
  }
  if (static_cast<int>(side.fds.size()) == world - 1) return;
  std::string missing;
  for (int r = 1; r < world; ++r)
    if (!seen[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  throw CommError(fmt::format("rank 0: rank(s) {} did not connect to its exit-order socket within "
                              "the timeout of {:g} s",
                              missing, side.timeout.count() / 1000.0));
}

// The exit handler (on_exit: it sees the status). A failed rank 0 leaves at once: dsrun stops the
// others, and a peer stuck in an NCCL collective would not notice rank 0 dropping its group. A
// successful one drops what keeps the others in collectives, then waits for them to be gone.
void rank_zero_waits_at_exit(int status, void*) {
  if (status != 0) return;
  RankZeroSide& side = *g_rank_zero;
  try {
    if (side.before_wait) side.before_wait();
  } catch (...) {
  }
  const auto start = Clock::now();
  const auto deadline = start + side.timeout;
  std::vector<pollfd> open;
  for (int fd : side.fds) open.push_back(pollfd{fd, POLLIN, 0});
  while (!open.empty()) {
    const int n = ::poll(open.data(), open.size(), milliseconds_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (size_t i = open.size(); i-- > 0;) {
      if (open[i].revents == 0) continue;
      char scrap[64];
      const ssize_t got = ::recv(open[i].fd, scrap, sizeof scrap, MSG_DONTWAIT);
      if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) continue;
      ::close(open[i].fd);  // end of stream or reset: that rank's process is gone
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (open.empty()) return;
  std::string alive;
  for (const auto& p : open)
    for (size_t i = 0; i < side.fds.size(); ++i)
      if (side.fds[i] == p.fd) alive += (alive.empty() ? "" : ", ") + std::to_string(side.ranks[i]);
  std::fprintf(stderr,
               "deepspeed: rank 0 exits although rank(s) %s are still running after %.0f s (the "
               "collectives' timeout); they lose the rendezvous store now\n",
               alive.c_str(), side.timeout.count() / 1000.0);
}

void connect_to_rank_zero(const ProcessInfo& info, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string where = fmt::format("{}:{}", info.master_addr, port);
  const int rc = ::getaddrinfo(info.master_addr.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0)
    throw CommError(fmt::format("rank {}: the exit-order address {} cannot be resolved: {}",
                                info.rank, where, ::gai_strerror(rc)));
  std::string why = "no address";
  int fd = -1;
  // Retried until the deadline: a loaded host can refuse a connection while rank 0's backlog fills.
  while (fd < 0 && Clock::now() < deadline) {
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        why = std::strerror(errno);
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) ::usleep(50 * 1000);
  }
  ::freeaddrinfo(found);
  if (fd < 0)
    throw CommError(fmt::format("rank {} cannot connect to rank 0's exit-order socket at {}: {}",
                                info.rank, where, why));
  const int32_t rank = info.rank;
  if (::send(fd, &rank, sizeof rank, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof rank)) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    throw CommError(fmt::format("rank {}: writing to rank 0's exit-order socket at {} failed: {}",
                                info.rank, where, err));
  }
  // Never closed: the kernel closes it when this process is gone, which is what rank 0 waits for.
}

}  // namespace

void arrange_exit_order(const c10::intrusive_ptr<c10d::Store>& store, const ProcessInfo& info,
                        std::chrono::milliseconds timeout, std::function<void()> before_wait) {
  if (info.world_size < 2) return;
  const auto deadline = Clock::now() + timeout;
  if (info.rank != 0) {
    const auto value = store->get(kPortKey);
    connect_to_rank_zero(info, std::atoi(store_string(value).c_str()), deadline);
    return;
  }
  if (g_rank_zero != nullptr)
    throw CommError("arrange_exit_order: called twice in one process (once per job)");
  auto side = std::make_unique<RankZeroSide>();
  side->store = store;
  side->timeout = timeout;
  side->before_wait = std::move(before_wait);
  const auto [listener, port] = listen_anywhere(info.world_size);
  const std::string port_text = std::to_string(port);
  store->set(kPortKey, std::vector<uint8_t>(port_text.begin(), port_text.end()));
  try {
    rank_zero_accepts(*side, listener, info.world_size, deadline);
  } catch (...) {
    ::close(listener);
    for (int fd : side->fds) ::close(fd);
    throw;
  }
  ::close(listener);
  g_rank_zero = side.release();
  ::on_exit(rank_zero_waits_at_exit, nullptr);  // glibc: unlike atexit, it is told the status
}

}  // namespace comm
}  // namespace deepspeed
