// What every test program sets before its first test, linked into each one directly (an object
// of the static support library would be left out unless a test referenced it).
#include <cstdlib>

namespace process_setup {
namespace {

// The tests run ranks as threads of one process (tests/support/ranks.h), each with its own
// process groups. libtorch 2.x keeps a process-wide flight recorder of collectives, on by
// default (TORCH_FR_BUFFER_SIZE 2000), whose record call adds a new group's status to a std::map
// before taking its lock: two ranks starting their first collective on new groups at once
// corrupt the map, and a later collective crashes inside ProcessGroupGloo::enqueue (seen on the
// GPU machine with the torch 2.11 wheel: 30 dist test files died with SIGSEGV, backtrace in
// FlightRecorder::recordWithResetEnabled). One rank per process, as gpt_train and users run,
// never records from two threads at once. Off here unless the environment sets it; libtorch
// 1.13 has no flight recorder and ignores the variable.
const bool flight_recorder_off = [] {
  ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  return true;
}();

}  // namespace
}  // namespace process_setup
