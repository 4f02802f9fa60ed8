// The one-rank communicator of a group that holds only this process (a split, or a topology
// axis of size 1) inside a larger job: it keeps the job's local rank, which chooses the rank's
// GPU (cuda:<local_rank>), so an engine built over such a group trains on its own device, not
// on cuda:0. (deepspeed/comm.h's make_single_process_communicator() is the one of a
// single-process job: local rank 0.)
#pragma once
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

CommunicatorPtr make_single_process_communicator(int local_rank);

// A group of one taken from `parent` without a collective (a topology axis of size 1): the
// single-process communicator with parent's local rank, adopted into parent's stats family as
// split() adopts its groups, so that it keeps latencies when its world does and the
// comms_logger counts its calls.
CommunicatorPtr make_group_of_one(const Communicator& parent);

}  // namespace comm
}  // namespace deepspeed
