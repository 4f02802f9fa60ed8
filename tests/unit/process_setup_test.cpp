// tests/process_setup.cpp runs in every test program: the flight recorder of libtorch 2.x is off
// unless the environment chose otherwise (see there for the crash it prevents).
#include <gtest/gtest.h>

#include <cstdlib>

namespace process_setup_test {

TEST(ProcessSetup, TheFlightRecorderIsOffForRanksAsThreads) {
  const char* size = std::getenv("TORCH_FR_BUFFER_SIZE");
  ASSERT_NE(size, nullptr) << "tests/process_setup.cpp is not linked into this test program";
}

}  // namespace process_setup_test
