#include "comm/communicator_base.h"
#include "comm/op_observer.h"

#include <fmt/format.h>

#include "comm/checked_communicator.h"
#include "comm/dtypes.h"

namespace deepspeed {
namespace comm {

void CommunicatorBase::check_split(const char* op, const at::Tensor& big,
                                   const at::Tensor& small) const {
  if (big.numel() != world_size_ * small.numel()) {
    throw CommError(fmt::format(
        "{} on rank {} of {}: the full tensor has {} elements, expected world_size {} x {} = {}",
        op, rank_, world_size_, big.numel(), world_size_, small.numel(),
        world_size_ * small.numel()));
  }
  if (big.scalar_type() != small.scalar_type()) {
    throw CommError(fmt::format("{} on rank {} of {}: dtypes differ ({} vs {})", op, rank_,
                                world_size_, dtype_name(big.scalar_type()),
                                dtype_name(small.scalar_type())));
  }
}

CommunicatorPtr CommunicatorBase::sub_group(CommunicatorPtr sub) const {
  // Every backend's split makes one of these (a group of one: the single-process one).
  if (auto* base = dynamic_cast<CommunicatorBase*>(sub.get()))
    StatsRecorder::adopt(stats_, base->stats_);
  return sub;
}

std::shared_ptr<StatsRecorder> recorder_of(const Communicator& comm) {
  if (auto* base = dynamic_cast<const CommunicatorBase*>(&comm)) return base->recorder();
  if (auto* checked = dynamic_cast<const CheckedCommunicator*>(&comm))
    return recorder_of(checked->inner());
  return nullptr;
}

void CommunicatorBase::check_peer(const char* op, int peer) const {
  if (peer < 0 || peer >= world_size_) {
    throw CommError(fmt::format("{} on rank {} of {}: peer rank {} is out of range [0, {})", op,
                                rank_, world_size_, peer, world_size_));
  }
}

void CommunicatorBase::watch_with(std::shared_ptr<FailureBoard> board, const std::string& name) {
  board_ = std::move(board);
  channel_ = board_->channel(name);
  sends_to_.assign(world_size_, -1);
  receives_from_.assign(world_size_, -1);
  // Made now, not at first use: a member that never sent still reports its count (0), so that
  // settling compares it with what its peer received.
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    sends_to_[peer] = board_->channel(fmt::format("{}:{}>{}", name, rank_, peer));
    receives_from_[peer] = board_->channel(fmt::format("{}:{}>{}", name, peer, rank_));
  }
}

OpPosition CommunicatorBase::next_position() const {
  if (!board_) return {};
  OpPosition pos = board_->peek(channel_);
  pos.board = board_;
  return pos;
}

OpDesc CommunicatorBase::describe_p2p(const char* op, const at::Tensor& t, int peer,
                                      bool sending) const {
  OpDesc d = describe_unnumbered(op, t);
  if (!board_ || peer == rank_) return d;  // to itself: no channel (Gloo refuses it anyway)
  const int channel = sending ? sends_to_[peer] : receives_from_[peer];
  d.position = board_->issue(channel);
  d.position.board = board_;
  d.position.blocking = true;  // see OpPosition
  return d;
}

OpDesc CommunicatorBase::describe(const char* op, const at::Tensor& t) const {
  OpDesc d = describe_unnumbered(op, t);
  if (board_) {
    d.position = board_->issue(channel_);
    d.position.board = board_;
  }
  return d;
}

OpDesc CommunicatorBase::describe_unnumbered(const char* op, const at::Tensor& t) const {
  OpDesc d;
  d.op = op;
  d.has_tensor = t.defined();
  d.numel = t.defined() ? t.numel() : 0;
  d.dtype = t.defined() ? t.scalar_type() : at::kFloat;
  d.rank = rank_;
  d.world_size = world_size_;
  d.timeout = timeout_;
  return d;
}

WorkPtr CommunicatorBase::launch(OpDesc d, const Start& start, std::function<void()> finish) const {
  auto one = [&](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    works.reserve(1);  // so that a work queued is a work counted (push_back cannot throw)
    works.push_back(start());
  };
  return launch_all(std::move(d), one, std::move(finish));
}

WorkPtr CommunicatorBase::launch_all(OpDesc d, const StartAll& start,
                                     std::function<void()> finish) const {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    start(works);
  } catch (...) {
    if (works.empty()) {
      withdraw(d);
    } else if (d.position.board) {
      std::string why = "an operation was queued in part; restart the job";
      try {
        why = fmt::format(
            "its {} (member {} of {} of its group) was queued in part ({} of its works) when the "
            "next one was refused ({}), so its peers' sequence of collectives no longer matches "
            "its own; restart it (from the last checkpoint)",
            d.op, d.rank, d.world_size, works.size(), current_exception_message());
      } catch (...) {  // out of memory for the words: the job ends all the same
      }
      d.position.board->end_job(why);
    }
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - t0;
    throw CommError(failure_message(d, elapsed.count(), current_exception_message()));
  }
  // The latency the comms logger reports: from here to the end of the first wait().
  finish = timed(d, t0, std::move(finish));
  return std::make_shared<GlooWork>(std::move(works), std::move(d), std::move(finish));
}

std::function<void()> CommunicatorBase::timed(const OpDesc& d,
                                              std::chrono::steady_clock::time_point t0,
                                              std::function<void()> finish) const {
  if (!d.has_tensor) return finish;
  const int64_t bytes = d.numel * static_cast<int64_t>(c10::elementSize(d.dtype));
  return [finish = std::move(finish), stats = stats_, op = d.op, bytes, t0, world = d.world_size] {
    if (finish) finish();
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
    stats->add_latency(op, bytes, ms.count());
    notify_op_observer(op, bytes, ms.count(), world);
  };
}

}  // namespace comm
}  // namespace deepspeed
