// Config files in hjson, as DeepSpeed reads them: each accepted form loads to the same values as
// its strict-JSON twin; each form hjson rejects is an error with its line and column; a quoteless
// value of the wrong type fails the key's type check, naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/hjson_reader.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace deepspeed {
namespace config_hjson_test {

using nlohmann::json;

json hjson(const std::string& text) { return config::parse_hjson(text, "test.json"); }

std::string hjson_error(const std::string& text) {
  try {
    hjson(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << text;
  return "";
}

class HjsonFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("ds_hjson_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Config load(const std::string& name, const std::string& text) {
    auto path = dir_ / name;
    std::ofstream(path) << text;
    std::vector<std::string> warnings;
    return load_config(path.string(), 1, {}, &warnings);
  }
  std::string load_error(const std::string& text) {
    try {
      load("bad.json", text);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a ConfigError for:\n" << text;
    return "";
  }
  // The hjson file and its strict-JSON twin give the same document and the same Config.
  void expect_same_as_json(const std::string& hjson_text, const std::string& json_text) {
    json strict = json::parse(json_text);
    EXPECT_EQ(hjson(hjson_text), strict) << hjson(hjson_text).dump();
    Config a = load("form.hjson", hjson_text);
    Config b = load("twin.json", json_text);
    EXPECT_EQ(a.raw, b.raw);
    EXPECT_EQ(a.zero_optimization.stage, b.zero_optimization.stage);
    EXPECT_EQ(a.train_batch_size, b.train_batch_size);
  }
  std::filesystem::path dir_;
};

// ---- accepted forms -----------------------------------------------------------------------------

const char* kTwin = R"({"train_batch_size": 8,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "betas": [0.9, 0.95]}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";

TEST_F(HjsonFileTest, TrailingCommasBeforeClosers) {
  expect_same_as_json(R"({"train_batch_size": 8,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "betas": [0.9, 0.95,],},},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",},},
})",
                      kTwin);
}

TEST_F(HjsonFileTest, LineBreakInsteadOfComma) {
  expect_same_as_json(R"({
  "train_batch_size": 8
  "optimizer": {
    "type": "AdamW"
    "params": {"lr": 0.0001, "betas": [
      0.9
      0.95
    ]}
  }
  "zero_optimization": {"stage": 2
                        "offload_optimizer": {"device": "cpu"}}
})",
                      kTwin);
}

TEST_F(HjsonFileTest, HashAndBlockComments) {
  expect_same_as_json(R"(# ds_config for the run
{
  "train_batch_size": 8, # global batch
  /* the optimizer,
     over two lines */
  "optimizer": {"type": /* inline */ "AdamW", "params": {"lr": 0.0001, "betas": [0.9, 0.95]}},
  "zero_optimization": {"stage": 2, // slash comment too
                        "offload_optimizer": {"device": "cpu"}}
}
)",
                      kTwin);
}

TEST_F(HjsonFileTest, QuotelessKeysAndStrings) {
  // A quoteless value runs to the end of the line, so each sits alone on its line here.
  expect_same_as_json(R"({
  train_batch_size: 8
  optimizer: {
    type: AdamW
    params: {lr: 0.0001, betas: [0.9, 0.95]}
  }
  zero_optimization: {
    stage: 2
    offload_optimizer: {
      device: cpu
    }
  }
})",
                      kTwin);
}

TEST_F(HjsonFileTest, RootWithoutBraces) {
  expect_same_as_json(R"(train_batch_size: 8
optimizer: {"type": "AdamW", "params": {"lr": 0.0001, "betas": [0.9, 0.95]}}
zero_optimization: {"stage": 2, "offload_optimizer": {"device": "cpu"}}
)",
                      kTwin);
}

TEST_F(HjsonFileTest, SingleQuotedAndMultilineStrings) {
  EXPECT_EQ(hjson("{a: 'it\"s', b: \"it's\", c: 'x\\'y'}"),
            json({{"a", "it\"s"}, {"b", "it's"}, {"c", "x'y"}}));
  EXPECT_EQ(hjson("{\n  s:\n    '''\n    line one\n      two\n    '''\n}"),
            json({{"s", "line one\n  two"}}));
}

TEST_F(HjsonFileTest, NumbersAndKeywordsEndAtStopCharacters) {
  // true/false/null and numbers end at , } ] # // /*; hjson makes an integral 5e8 or 1.0 an
  // integer (below 1e10), so the strict twin is written with integers.
  EXPECT_EQ(hjson("{a: 5e8, b: 1.0 # c\n c: -2e-3, d: true} "),
            json::parse(R"({"a": 500000000, "b": 1, "c": -0.002, "d": true})"));
  EXPECT_EQ(hjson("{a: 1e10\n b: null // none\n c: [false,true]}"),
            json::parse(R"({"a": 1e10, "b": null, "c": [false, true]})"));
  EXPECT_TRUE(hjson("{a: 1e10}")["a"].is_number_float());
  EXPECT_TRUE(hjson("{a: 8}")["a"].is_number_unsigned());  // as nlohmann's parser
  EXPECT_EQ(hjson("{a: 007\n b: +1\n c: .5\n}"), json({{"a", "007"}, {"b", "+1"}, {"c", ".5"}}));
}

TEST_F(HjsonFileTest, EmptyAndCommentOnlyFilesAreEmptyObjects) {
  EXPECT_EQ(hjson(""), json::object());
  EXPECT_EQ(hjson("// nothing\n# here\n"), json::object());
  EXPECT_EQ(hjson("{\"a\": \"\\u00e9\\ud83d\\ude00\"}")["a"], "\u00e9\U0001F600");
}

// ---- quoteless values meet the type checks ------------------------------------------------------

TEST_F(HjsonFileTest, QuotelessWordFailsTypeCheckNamingItsKey) {
  std::string msg = load_error(
      "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\"stage\": two\n  }\n}\n");
  EXPECT_CONTAINS(msg, "config key 'zero_optimization.stage' has value \"two\"");
  EXPECT_CONTAINS(msg, "expected an integer");
}

TEST_F(HjsonFileTest, QuotelessWordKeepsTheCommaThatFollowsIt) {
  // hjson: a quoteless string runs to the end of the line, commas included.
  EXPECT_EQ(hjson("{\"stage\": two,\n\"x\": 1}"), json({{"stage", "two,"}, {"x", 1}}));
  std::string msg = load_error(
      "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\"stage\": two,\n  }\n}\n");
  EXPECT_CONTAINS(msg, "config key 'zero_optimization.stage' has value \"two,\"");
}

TEST_F(HjsonFileTest, QuotelessWordsAreValuesWhereStringsBelong) {
  Config c = load("q.json",
                  "{train_batch_size: 8\n zero_optimization: {stage: 3\n"
                  " offload_param: {device: cpu\n}\n offload_optimizer: {device: nvme\n"
                  " nvme_path: /local_nvme\n}}}");
  EXPECT_EQ(c.zero_optimization.offload_param.device, "cpu");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "nvme");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
}

// ---- duplicate keys -----------------------------------------------------------------------------

TEST_F(HjsonFileTest, DuplicateKeysStayAnError) {
  EXPECT_CONTAINS(hjson_error("{zero_optimization: {stage: 1\n stage: 2\n}}"),
                  "gives key 'zero_optimization.stage' twice (again at line 2, column 2");
  // Also at a brace-less root, where hjson's fallback to a single value must not hide it.
  EXPECT_CONTAINS(hjson_error("a: 1\na: 2\n"), "gives key 'a' twice");
  EXPECT_CONTAINS(hjson_error("{\"l\": [{\"k\": 1, \"k\": 2}]}"), "gives key 'l[0].k' twice");
}

// ---- rejected forms: one per hjson error, each with its position --------------------------------

struct Rejected {
  const char* name;
  const char* text;
  const char* position;
  const char* reason;
};

TEST_F(HjsonFileTest, EachRejectedFormNamesLineAndColumn) {
  const Rejected cases[] = {
      {"object never closed", "{\n  \"a\": 1,\n", "line 3, column 1", "a '}' is missing"},
      {"list never closed", "{\"a\": [1,\n 2", "line 2, column 3", "a ']' is missing"},
      {"string never closed", "{\"a\": \"x", "line 1, column 7", "never closed with \""},
      {"line break in a string", "{\n  \"a\": \"x\n\"}", "line 2, column 10", "control character"},
      {"comment never closed", "{\"a\": 1 /* note\n}", "line 1, column 9",
       "/* comment that is never closed"},
      {"''' string never closed", "{\n  a: '''\n  x\n}", "line 2, column 6",
       "''' string that is never closed"},
      {"punctuator for a value", "{\n  \"stage\": ,\n}", "line 2, column 12",
       "found ',' where a value was expected"},
      {"value missing at the end", "{\"a\":", "line 1, column 6",
       "the file ends where a value was expected"},
      {"punctuator for a key", "{\"a\": 1,, \"b\": 2}", "line 1, column 9",
       "found ',' where a key name was expected"},
      {"quoteless value swallows the brace", "{\"fp16\": {\"enabled\": yes}}", "line 1, column 27",
       "a '}' is missing"},
      {"space inside a quoteless key", "{\n  stage three: 3\n}", "line 2, column 8",
       "whitespace inside the key name \"stage three\""},
      {"colon without key", "{\n  : 3\n}", "line 2, column 3", "found ':' with no key name"},
      {"colon missing", "{\"a\" 1}", "line 1, column 6", "expected ':' after the key \"a\""},
      {"control character in a string", "{\"a\": \"x\ty\"}", "line 1, column 9",
       "control character"},
      {"unknown escape", "{\"a\": \"\\q\"}", "line 1, column 8", "invalid escape \\q"},
      {"bad \\u escape", "{\"a\": \"\\u12g4\"}", "line 1, column 8", "invalid \\u escape"},
      {"text after the document", "{\"a\": 1}\n}", "line 2, column 1",
       "text after the end of the document"},
  };
  for (const Rejected& r : cases) {
    std::string msg = hjson_error(r.text);
    EXPECT_CONTAINS(msg, "'test.json' is not valid JSON or hjson at") << r.name;
    EXPECT_CONTAINS(msg, r.position) << r.name;
    EXPECT_CONTAINS(msg, r.reason) << r.name;
  }
}

TEST_F(HjsonFileTest, LoadConfigErrorNamesTheFile) {
  std::string msg = load_error("{\n  \"train_batch_size\": 8,,\n}\n");
  EXPECT_CONTAINS(msg, (dir_ / "bad.json").string());
  EXPECT_CONTAINS(msg, "line 2, column 25");
}

// DeepSpeed opens the file as UTF-8 text (Python raises UnicodeDecodeError on a stray byte). A
// byte that is not UTF-8 used to load here and make every save_checkpoint throw later (nlohmann
// type_error 316 when the config is written into the metadata).
TEST_F(HjsonFileTest, BytesThatAreNotUtf8NameLineAndColumn) {
  const Rejected cases[] = {
      {"Latin-1 in a string", "{\"a\": \"caf\xE9\"}", "line 1, column 11", "byte 0xE9"},
      {"Latin-1 in a quoteless value", "{\n  a: caf\xE9\n}", "line 2, column 9", "byte 0xE9"},
      {"Latin-1 in a quoteless key", "{\n  k\xE9y: 1\n}", "line 2, column 4", "byte 0xE9"},
      {"Latin-1 in a comment", "{\"a\": 1 # caf\xE9\n}", "line 1, column 14", "byte 0xE9"},
      {"overlong '/'", "{\"a\": \"\xC0\xAF\"}", "line 1, column 8", "byte 0xC0"},
      {"UTF-8-encoded surrogate", "{\"a\": \"\xED\xA0\x80\"}", "line 1, column 8", "byte 0xED"},
      {"cut-off sequence", "{\"a\": \"\xE2\x82\"}", "line 1, column 8", "byte 0xE2"},
  };
  for (const Rejected& r : cases) {
    std::string msg = hjson_error(r.text);
    EXPECT_CONTAINS(msg, "'test.json' is not valid JSON or hjson at") << r.name;
    EXPECT_CONTAINS(msg, r.position) << r.name;
    EXPECT_CONTAINS(msg, r.reason) << r.name;
    EXPECT_CONTAINS(msg, "not valid UTF-8") << r.name;
  }
  // Through load_config, with the file named; real UTF-8 (and a byte order mark) still loads.
  EXPECT_CONTAINS(load_error("{\n  \"train_batch_size\": 8,\n  \"tensorboard\": "
                             "{\"job_name\": \"caf\xE9\"}\n}\n"),
                  "line 3, column 35");
  Config c = load("utf8.json", "\xEF\xBB\xBF{\"train_batch_size\": 8, \"tensorboard\": "
                               "{\"job_name\": \"caf\xC3\xA9 \xF0\x9F\x98\x80\"}}");
  EXPECT_EQ(c.raw["tensorboard"]["job_name"], "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_NO_THROW(c.raw.dump());
}

// hjson-py keeps a lone surrogate escape in its str; UTF-8 cannot hold one, so it is refused at
// the escape. A full pair is one character.
TEST_F(HjsonFileTest, LoneSurrogateEscapesAreRefused) {
  const Rejected cases[] = {
      {"lone high", "{\"a\": \"\\ud800\"}", "line 1, column 8", "\\ud800 is half of a UTF-16"},
      {"lone low", "{\n  a: 'x\\uDC00y'\n}", "line 2, column 8", "\\uDC00 is half of a UTF-16"},
      {"high then not low", "{\"a\": \"\\ud83d\\u0041\"}", "line 1, column 8", "\\ud83d is half"},
      {"reversed pair", "{\"a\": \"\\ude00\\ud83d\"}", "line 1, column 8", "\\ude00 is half"},
  };
  for (const Rejected& r : cases) {
    std::string msg = hjson_error(r.text);
    EXPECT_CONTAINS(msg, r.position) << r.name;
    EXPECT_CONTAINS(msg, r.reason) << r.name;
  }
  EXPECT_EQ(hjson("{\"a\": \"\\ud83d\\ude00\"}"), json({{"a", "\xF0\x9F\x98\x80"}}));
  EXPECT_EQ(hjson("{\"a\": \"caf\\u00e9\"}"), json({{"a", "caf\xC3\xA9"}}));
}

// A config built in code never passes the file reader: parse_config checks it, naming the key,
// where an error message or a checkpoint would otherwise throw nlohmann's type_error.
TEST(ConfigUtf8, ConfigBuiltInCodeNamesTheKey) {
  json doc = {{"train_batch_size", 8}, {"tensorboard", {{"job_name", std::string("caf\xE9")}}}};
  std::string msg = dstest::message_of<ConfigError>([&] { parse_config(doc, 1); });
  EXPECT_CONTAINS(msg, "'tensorboard.job_name'");
  EXPECT_CONTAINS(msg, "caf\\xE9");
  EXPECT_CONTAINS(msg, "not valid UTF-8");
  json bad_key = {{"train_batch_size", 8}, {"tensorboard", {{std::string("k\xE9y"), 1}}}};
  msg = dstest::message_of<ConfigError>([&] { parse_config(bad_key, 1); });
  EXPECT_CONTAINS(msg, "'tensorboard.k\\xE9y'");
  json in_list = {{"train_batch_size", 8},
                  {"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9, "\xFF"}}}}}}};
  msg = dstest::message_of<ConfigError>([&] { parse_config(in_list, 1); });
  EXPECT_CONTAINS(msg, "'optimizer.params.betas[1]'");
}

}  // namespace config_hjson_test
}  // namespace deepspeed
