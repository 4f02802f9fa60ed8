// The 1F1B and inference schedules as data, one list of instructions per clock tick. The
// stepping follows DeepSpeed's TrainSchedule (PipeDream-Flush): even and odd stages alternate
// forward and backward ticks, so neighbours are always in opposite phases and each send meets
// the matching receive in the same tick (blocking point-to-point cannot deadlock).
#include <sstream>

#include "deepspeed/pipe.h"

namespace deepspeed {
namespace pipe {
namespace {

bool even(int x) { return x % 2 == 0; }

// Which micro-batch stage `stage` works on at tick `step`, and whether it is a forward.
// Out of range ids are idle ticks (warm-up and cool-down).
std::pair<int, bool> micro_batch_at(int step, int stages, int stage) {
  if (even(step) && even(stage)) return {step / 2 - stage / 2, true};
  if (!even(step) && !even(stage)) return {(step - 1) / 2 - stage / 2, true};
  if (even(step) && !even(stage)) return {step / 2 - stages + (stage + 1) / 2, false};
  return {(step - 1) / 2 - stages + 1 + stage / 2, false};
}

}  // namespace

std::string to_string(const Instruction& in) {
  static const char* names[] = {"LoadMicroBatch", "ForwardPass",     "BackwardPass",
                                "SendActivation", "RecvActivation",  "SendGrad",
                                "RecvGrad",       "ReduceTiedGrads", "ReduceGrads",
                                "OptimizerStep"};
  std::string s = names[static_cast<int>(in.op)];
  if (in.buffer >= 0)
    s += "(buffer=" + std::to_string(in.buffer) + ", mb=" + std::to_string(in.micro_batch) + ")";
  return s;
}

std::string Schedule::str() const {
  std::ostringstream out;
  for (size_t i = 0; i < steps.size(); ++i) {
    out << "step " << i << ":";
    for (auto& in : steps[i]) out << " " << to_string(in);
    out << "\n";
  }
  return out.str();
}

Schedule train_schedule(int micro_batches, int stages, int stage) {
  Schedule s;
  s.num_buffers = std::max(2, std::min(stages - stage, micro_batches));
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  const bool has_prev = stage > 0, has_next = stage < stages - 1;
  const int total = 2 * (micro_batches + stages - 1);
  int prev_mb = -1;
  for (int step = 0; step < total; ++step) {
    auto [mb, forward] = micro_batch_at(step, stages, stage);
    const int buf = valid(mb) ? mb % s.num_buffers : -1;
    const int prev_buf = valid(prev_mb) ? prev_mb % s.num_buffers : -1;
    std::vector<Instruction> cmds;
    if (forward) {
      if (valid(prev_mb) && has_prev) cmds.push_back({Op::SendGrad, prev_buf, prev_mb});
      if (valid(mb) && has_prev) cmds.push_back({Op::RecvActivation, buf, mb});
    } else {
      if (valid(mb) && has_next) cmds.push_back({Op::RecvGrad, buf, mb});
      if (valid(prev_mb) && has_next) cmds.push_back({Op::SendActivation, prev_buf, prev_mb});
    }
    if ((!has_prev || !has_next) && forward && valid(mb))
      cmds.push_back({Op::LoadMicroBatch, buf, mb});
    if (valid(mb)) cmds.push_back({forward ? Op::ForwardPass : Op::BackwardPass, buf, mb});
    if (step == total - 1) {
      cmds.push_back({Op::ReduceTiedGrads});
      cmds.push_back({Op::ReduceGrads});
      cmds.push_back({Op::OptimizerStep});
    }
    prev_mb = mb;
    s.steps.push_back(std::move(cmds));
  }
  return s;
}

Schedule inference_schedule(int micro_batches, int stages, int stage) {
  Schedule s;
  s.num_buffers = 2;
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  const bool has_prev = stage > 0, has_next = stage < stages - 1;
  for (int step = 0; step < micro_batches + stages - 1; ++step) {
    const int mb = step - stage;
    // Even stages receive into buffer step % 2 and send the other; odd stages the reverse, so
    // a neighbour's send and receive name the same micro-batch.
    const int recv_buf = even(stage) ? step % 2 : (step + 1) % 2;
    const int send_buf = even(stage) ? (step + 1) % 2 : step % 2;
    std::vector<Instruction> cmds;
    if ((!has_prev || !has_next) && valid(mb)) cmds.push_back({Op::LoadMicroBatch, recv_buf, mb});
    auto send = [&] {
      if (has_next && valid(mb - 1)) cmds.push_back({Op::SendActivation, send_buf, mb - 1});
    };
    auto recv = [&] {
      if (has_prev && valid(mb)) cmds.push_back({Op::RecvActivation, recv_buf, mb});
    };
    if (even(stage)) {
      send();
      recv();
    } else {
      recv();
      send();
    }
    if (valid(mb)) cmds.push_back({Op::ForwardPass, recv_buf, mb});
    s.steps.push_back(std::move(cmds));
  }
  return s;
}

}  // namespace pipe
}  // namespace deepspeed
