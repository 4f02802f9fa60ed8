#include "support/ranks.h"

#include <ATen/Parallel.h>
#include <c10/core/AutogradState.h>
#include <torch/version.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "comm/gloo_communicator.h"

namespace dstest {

namespace {

// Keeps the first exception of several threads, and what every other thread threw: when ranks
// fail together, the first recorded is not always the cause (a rank whose group setup fails
// closes its connections while unwinding, before its catch runs, so its peer's "connection
// closed" can be recorded first). The others go to stderr, beside the test's failure.
class FirstError {
 public:
  void record(int who, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_) {
      first_ = e;
      first_who_ = who;
    } else {
      later_.emplace_back(who, e);
    }
  }
  void rethrow(const char* what_threw) const {
    if (!first_) return;
    for (const auto& [who, e] : later_) {
      std::cerr << "[run_ranks] " << what_threw << " " << who << " also failed (after "
                << what_threw << " " << first_who_ << "): " << message_of(e) << "\n";
    }
    std::rethrow_exception(first_);
  }

 private:
  static std::string message_of(std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "a non-std exception";
    }
  }
  std::mutex mu_;
  std::exception_ptr first_;
  int first_who_ = -1;
  std::vector<std::pair<int, std::exception_ptr>> later_;
};

void join_all(std::vector<std::thread>& threads) {
  for (auto& t : threads) t.join();
}

}  // namespace

void run_threads(int n, const std::function<void(int)>& body) {
  FirstError error;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        body(i);
      } catch (...) {
        error.record(i, std::current_exception());
      }
    });
  }
  join_all(threads);
  error.rethrow("thread");
}

namespace {

// run_ranks and run_ranks_on_hosts (`hosts` empty: this machine's identity for every rank).
void run_ranks_as(int world_size, const std::vector<std::string>& hosts,
                  const std::function<void(deepspeed::comm::CommunicatorPtr)>& body,
                  std::chrono::milliseconds timeout) {
  namespace comm = deepspeed::comm;
  static std::atomic<int> calls{0};
  const std::string prefix = "run_ranks/" + std::to_string(calls++);
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);  // a rank that never joins fails the setup instead of hanging it
  FirstError error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      at::set_num_threads(1);
#if TORCH_VERSION_MAJOR >= 2
      // Ranks that share a process share libtorch's autograd thread for a GPU: one rank's
      // gradient hook waiting in a collective there would keep the other rank's backward (and so
      // its side of that collective) from running. Each rank runs its backward on its own thread.
      c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
#endif
      // Outlives the catch: a failing rank records its exception before its group closes and
      // the other ranks' (consequent) errors follow.
      comm::CommunicatorPtr c;
      try {
        if (world_size == 1) {
          c = comm::make_single_process_communicator();
        } else {
          c10::intrusive_ptr<c10d::Store> scoped =
              c10::make_intrusive<c10d::PrefixStore>(prefix, store);
          c = hosts.empty()
                  ? comm::make_gloo_communicator(scoped, rank, world_size, timeout, rank)
                  : comm::make_gloo_communicator_on(scoped, rank, world_size, rank, timeout,
                                                    comm::gloo_device_for("127.0.0.1"),
                                                    hosts[rank]);
        }
        body(c);
      } catch (...) {
        error.record(rank, std::current_exception());
      }
    });
  }
  join_all(threads);
  error.rethrow("rank");
}

}  // namespace

void run_ranks(int world_size, const std::function<void(deepspeed::comm::CommunicatorPtr)>& body,
               std::chrono::milliseconds timeout) {
  run_ranks_as(world_size, {}, body, timeout);
}

void run_ranks_on_hosts(const std::vector<std::string>& host_of_rank,
                        const std::function<void(deepspeed::comm::CommunicatorPtr)>& body,
                        std::chrono::milliseconds timeout) {
  run_ranks_as(static_cast<int>(host_of_rank.size()), host_of_rank, body, timeout);
}

int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_tcp_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_tcp_port: bind/getsockname on 127.0.0.1 failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dstest
