// Assertion helpers shared by the tests: substring checks that print both strings, the message of
// an expected exception, bit-for-bit tensor list comparison, and counting a substring.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace dstest {

::testing::AssertionResult Contains(const char* text_expr, const char* part_expr,
                                    const std::string& text, const std::string& part);

// The message of the E that f throws; a test failure (and "") when it throws none.
template <class E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// Same sizes and every tensor torch::equal to its partner.
bool bit_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);

// How many times `part` occurs in `text`, overlapping occurrences included.
size_t occurrences(const std::string& text, const std::string& part);

}  // namespace dstest

// EXPECT_CONTAINS(text, part): text contains part; on failure prints both.
#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::dstest::Contains, text, part)
