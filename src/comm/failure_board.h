// What a rank whose engine call failed tells the others, so that a failure on one rank ends the
// job at once instead of leaving its peers waiting until the communication timeout.
//
// The problem: when only rank 1's backward throws (an out-of-memory, a user's hook), rank 0 waits
// in bucket collectives that rank 1 will not join. If rank 1 then retries, its new collectives
// meet rank 0's old ones out of order. Gloo pairs them by sequence number, so they either wait
// for ever or, worse, add tensors that do not belong together.
//
// What the board does:
// - Every collective of a Gloo communicator (and each direction of its point-to-point traffic)
//   is numbered on a **channel**: one per communicator, named alike on every member ("w" for the
//   world, "w/split0/1" for a sub-group, "w:0>1" for rank 0's sends to rank 1).
// - A rank whose engine call failed after it had issued collectives **posts** to the job's
//   rendezvous store: the call, its error and how many operations it had issued on each channel
//   (its fingerprint).
// - A wait that has not completed after a slice (0.5 s) reads the posts. A peer that posted and
//   had not issued this operation never will, so the wait throws CommError naming that peer's
//   error. This rank's call then fails and posts too.
// - Before the failed rank issues anything again (its next engine call), it **settles**: it
//   waits until every rank has posted as often as it has. If every channel's members stopped at
//   the same operation, every rank failed at the same point (every rank ran out of memory in the
//   same layer, say), nothing is pending, and training goes on. Otherwise the job cannot continue:
//   every rank's next call throws, naming the first failure and where the ranks parted.
//
// Store keys, under the root communicator's store: "ds_fail/<rank>/<k>" (that rank's k-th post:
// "<rank> <call>\n<channel>=<count> ...\n<message>"), "ds_fail/<rank>/end" (why that rank found
// that the job cannot continue) and "ds_fail/n" (bumped after every post: a reader scans the
// ranks' keys only when it moved). The store is read only by a wait that has outlasted its slice
// or by a settling rank, at most once per 0.2 s: nothing on the path of a collective that
// completes.
//
// Thread-safety: every method may be called from any thread (the communicator's callers and its
// waits); one mutex guards the state, and store calls are made outside it.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Store;
class Work;
}

namespace deepspeed {
namespace comm {

class FailureBoard;

// Where one operation stands: its channel and its 0-based number there.
struct OpPosition {
  std::shared_ptr<FailureBoard> board;  // null: no board (world size 1, NCCL, test doubles)
  int channel = -1;
  uint64_t index = 0;
  int epoch = 0;  // this rank's posts when it issued the operation
  // Point-to-point: Gloo's send and receive works end for good (and signal every pair of the
  // group) when a timed wait runs out, so they are waited on whole while the board's watcher
  // thread asks why_stuck for them and aborts the ones that never will complete.
  bool blocking = false;
};

// One blocking wait under the watcher's eye (FailureBoard::watch).
struct WatchedWait;

// How long a wait runs before it first reads the board, and between reads.
constexpr std::chrono::milliseconds kFailureCheckSlice{500};

class FailureBoard : public std::enable_shared_from_this<FailureBoard> {
 public:
  // `store`: the job's rendezvous store (the root communicator's). `rank`, `world_size`: in that
  // root communicator. `timeout`: how long settle() waits for the others' posts.
  FailureBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
               std::chrono::milliseconds timeout);

  // A channel, made on first use; its count starts at 0. Every member names it alike.
  int channel(const std::string& name);
  // Numbers the next operation of `channel` (counts it as issued): its position.
  OpPosition issue(int channel);
  // The operation at `pos` was numbered but never queued (its start threw: Gloo's pair already
  // closed, an allocation): its number is taken back, so a peer waiting in it learns from this
  // rank's post that it never issued it, and settling does not take this rank for one that did.
  // Only the channel's last number can be taken back; after another thread numbered the next
  // one, it stays counted (and the peers wait for it until the timeout).
  void withdraw(const OpPosition& pos);
  // The position the next operation of `channel` will have (nothing counted).
  OpPosition peek(int channel) const;
  // Operations numbered on every channel together, withdrawn ones included: a call that did not
  // change it neither issued nor tried to issue anything (so it has nothing to post).
  uint64_t numbered_total() const;

  // Called by a wait for `pos` that has not completed after a slice: why it never will, or ""
  // (keep waiting). It never will when a peer posted a failure beyond the ones this rank had
  // when it issued the operation (the peer's post number pos.epoch + 1) and had not issued it
  // then, or when a rank found that the job cannot continue. Non-empty marks the job broken.
  // May read the store (rate-limited).
  std::string why_stuck(const OpPosition& pos);

  // A blocking wait on `work` (at `pos`) begins: the watcher thread (started on first use, ended
  // after 2 s with nothing to watch) asks
  // why_stuck for it every slice and, when it never will complete, records why and aborts it.
  // unwatch() when the wait returns; then `reason` of the result says why it was aborted ("" if
  // it was not).
  std::shared_ptr<WatchedWait> watch(c10::intrusive_ptr<c10d::Work> work, const OpPosition& pos);
  std::string unwatch(const std::shared_ptr<WatchedWait>& wait);

  // This rank's `call` failed with `message` after issuing collectives: posts it with this
  // rank's fingerprint. Never throws (a store that cannot be reached is reported by the waits).
  void post(const std::string& call, const std::string& message) noexcept;
  // Posts made by this rank (a caller compares before and after a call).
  int own_posts() const;

  // Before this rank issues collectives again. Returns at once when it has nothing unsettled;
  // else waits (up to the timeout) until every rank posted as often, then returns if they all
  // stopped at the same operation on every channel, and throws CommError otherwise (and from
  // then on at every call). `call`: what is about to run, for the message.
  void settle(const std::string& call);

  // True once this rank learned that the job cannot go on (a wait found its operation
  // abandoned, or settle found the ranks parted). Its communicators then skip the orderly
  // shutdown of their Gloo groups, which would wait for operations that can never finish.
  bool broken() const;
  // This rank knows that the job cannot continue (an operation queued in part: its ranks' Gloo
  // sequences no longer match): marks it broken and tells the others, whose waits then fail at
  // once and whose next settle throws. Never throws.
  void end_job(const std::string& reason) noexcept;
  // Whether the watcher thread runs (it ends after 2 s with nothing to watch).
  bool watcher_running() const;

 private:
  struct Post {
    int rank = -1;
    std::string call;
    std::map<std::string, uint64_t> counts;  // the fingerprint
    std::string message;
  };

  // Reads posts not seen yet; at most every 0.2 s unless `force`. Never under mu_.
  void refresh(bool force);
  std::string fingerprint_locked() const;
  static bool parse(const std::string& text, Post& out);
  // Where the ranks' posts number `round` disagree ("" when they agree). Under mu_.
  std::string disagreement_locked(int round) const;
  // The failure to name for round `round`: one that is not a consequence of another's.
  const Post& cause_locked(int round) const;
  // Marks the job broken for `reason` and tells the others (the rank's ending key). Under mu_;
  // the store call is made after it is released, by the caller, through the returned text.
  std::string break_locked(std::string reason);
  void post_ending(const std::string& reason) noexcept;
  std::string describe_locked(const Post& p) const;

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, world_size_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mu_;
  std::vector<std::string> names_;          // channel index -> name
  std::map<std::string, int> index_of_;     // name -> channel index
  std::vector<uint64_t> counts_;            // channel index -> operations issued
  uint64_t numbered_ = 0;  // never decreases (withdraw() leaves it)
  std::vector<std::vector<Post>> posts_;   // per rank: its posts read, in order (rounds)
  std::vector<std::string> endings_;        // per rank: why it found the job cannot continue
  uint64_t seen_ = 0;                       // the post counter at the last scan
  int settled_rounds_ = 0;                  // rounds every rank agreed on
  int own_posts_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  std::chrono::steady_clock::time_point last_refresh_{};
  std::vector<std::shared_ptr<WatchedWait>> watched_;  // blocking waits now running
  bool watcher_running_ = false;
  std::chrono::steady_clock::time_point last_watch_{};  // the latest watch()
  // The watcher thread's loop: holds the board only weakly, and ends with it.
  static void watch_loop(std::weak_ptr<FailureBoard> weak);
  std::mutex refresh_mu_;                   // one reader of the store at a time
};

}  // namespace comm
}  // namespace deepspeed
