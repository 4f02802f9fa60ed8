// Multi-rank tests without processes: each rank is a thread with its own Gloo communicator over
// one shared in-process store (the c10d test style). A rank that throws ends the run: its
// communicator closes, the others' collectives fail (peer gone) or time out after `timeout`, and
// the first exception is rethrown in the caller, so gtest sees it.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "deepspeed/comm.h"

namespace dstest {

// Runs body(comm) on world_size threads, rank r's comm having rank r. world_size 1 uses the
// single-process communicator. `timeout` bounds every collective and the group setup. Each thread
// runs with at::set_num_threads(1).
void run_ranks(int world_size, const std::function<void(deepspeed::comm::CommunicatorPtr)>& body,
               std::chrono::milliseconds timeout = std::chrono::seconds(20));
// The same, rank r counting as on host host_of_rank[r] (any identity string): the paths of a
// group that spans hosts (gloo_group_plan.h) on one machine. World size = host_of_rank.size().
void run_ranks_on_hosts(const std::vector<std::string>& host_of_rank,
                        const std::function<void(deepspeed::comm::CommunicatorPtr)>& body,
                        std::chrono::milliseconds timeout = std::chrono::seconds(20));

// Runs body(i) for i in [0, n) on n threads, joins them all, rethrows the first exception.
void run_threads(int n, const std::function<void(int)>& body);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, closed).
int free_tcp_port();

}  // namespace dstest

using dstest::free_tcp_port;
using dstest::run_ranks;
using dstest::run_threads;
