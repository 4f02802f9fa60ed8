#include <fstream>
// detect_process_info() and the DEEPSPEED_TIMEOUT rule, driven by setenv/unsetenv. Each test
// starts from an environment without any launcher variable and restores the original after.
#include "comm/process_info.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace process_info_test {

namespace comm = deepspeed::comm;

namespace {

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_LAUNCH_NODE_IPADDR",
                             "DEEPSPEED_TIMEOUT"};

class ProcessInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_[v] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }

  // The ConfigError message of detect_process_info(), or "" when it did not throw.
  static std::string error_of_detect() {
    try {
      comm::detect_process_info();
    } catch (const deepspeed::ConfigError& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(ProcessInfoTest, NoVariablesMeansSingleProcess) {
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world_size, 1);
  EXPECT_EQ(p.local_rank, 0);
  EXPECT_EQ(p.source, "single-process");
}

TEST_F(ProcessInfoTest, TorchrunVariables) {
  set("RANK", "3");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "1");
  set("MASTER_ADDR", "10.0.0.7");
  set("MASTER_PORT", "31337");
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.master_addr, "10.0.0.7");
  EXPECT_EQ(p.master_port, 31337);
  EXPECT_EQ(p.source, "env");
}

TEST_F(ProcessInfoTest, TorchrunDefaultsAddressAndPort) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  EXPECT_EQ(p.master_port, 29500);
  EXPECT_EQ(p.local_rank, 0);
}

TEST_F(ProcessInfoTest, OpenMpiVariables) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("MASTER_PORT", "29600");
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  EXPECT_EQ(p.master_port, 29600);
  EXPECT_EQ(p.source, "openmpi");
}

TEST_F(ProcessInfoTest, SlurmVariablesUseTheLaunchNode) {
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "3");
  set("SLURM_LOCALID", "0");
  set("SLURM_LAUNCH_NODE_IPADDR", "192.168.1.20");
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 3);
  EXPECT_EQ(p.master_addr, "192.168.1.20");
  EXPECT_EQ(p.source, "slurm");
  set("MASTER_ADDR", "node17");  // an explicit MASTER_ADDR wins over the launch node
  EXPECT_EQ(comm::detect_process_info().master_addr, "node17");
}

TEST_F(ProcessInfoTest, LauncherVariablesWinOverSlurmAndMpi) {
  set("SLURM_PROCID", "1");
  set("SLURM_NTASKS", "2");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("RANK", "0");
  set("WORLD_SIZE", "4");
  comm::ProcessInfo p = comm::detect_process_info();
  EXPECT_EQ(p.source, "env");
  EXPECT_EQ(p.world_size, 4);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(comm::detect_process_info().source, "openmpi");
}

TEST_F(ProcessInfoTest, RankNotANumber) {
  set("RANK", "abc");
  set("WORLD_SIZE", "2");
  std::string msg = error_of_detect();
  EXPECT_NE(msg.find("RANK='abc'"), std::string::npos) << msg;
  set("RANK", "1x");
  EXPECT_NE(error_of_detect().find("RANK='1x'"), std::string::npos);
}

TEST_F(ProcessInfoTest, RankOutOfRange) {
  set("RANK", "4");
  set("WORLD_SIZE", "4");
  std::string msg = error_of_detect();
  EXPECT_NE(msg.find("RANK=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WORLD_SIZE=4"), std::string::npos) << msg;
  set("RANK", "-1");
  EXPECT_NE(error_of_detect().find("RANK=-1"), std::string::npos);
}

TEST_F(ProcessInfoTest, BadWorldSizeLocalRankAndPort) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "0");
  EXPECT_NE(error_of_detect().find("SLURM_NTASKS=0"), std::string::npos);
  set("SLURM_NTASKS", "2");
  set("SLURM_LOCALID", "7");
  EXPECT_NE(error_of_detect().find("SLURM_LOCALID=7"), std::string::npos);
  set("SLURM_LOCALID", "0");
  set("MASTER_PORT", "70000");
  EXPECT_NE(error_of_detect().find("MASTER_PORT=70000"), std::string::npos);
  set("MASTER_PORT", "");
  EXPECT_NE(error_of_detect().find("MASTER_PORT=''"), std::string::npos);
}

TEST_F(ProcessInfoTest, HalfAPairIsAnError) {
  set("WORLD_SIZE", "2");
  std::string msg = error_of_detect();
  EXPECT_NE(msg.find("WORLD_SIZE is set but RANK is not"), std::string::npos) << msg;
  ::unsetenv("WORLD_SIZE");
  set("OMPI_COMM_WORLD_RANK", "0");
  EXPECT_NE(error_of_detect().find("OMPI_COMM_WORLD_SIZE"), std::string::npos);
}

TEST_F(ProcessInfoTest, DeepSpeedTimeoutReplacesTheDefault) {
  comm::InitOptions defaults;
  EXPECT_EQ(comm::resolve_timeout(defaults), std::chrono::minutes(30));
  set("DEEPSPEED_TIMEOUT", "5");
  EXPECT_EQ(comm::resolve_timeout(defaults), std::chrono::minutes(5));
  comm::InitOptions explicit_timeout;
  explicit_timeout.timeout = std::chrono::seconds(42);
  EXPECT_EQ(comm::resolve_timeout(explicit_timeout), std::chrono::seconds(42));
  set("DEEPSPEED_TIMEOUT", "soon");
  EXPECT_THROW(comm::resolve_timeout(defaults), deepspeed::ConfigError);
  set("DEEPSPEED_TIMEOUT", "0");
  EXPECT_THROW(comm::resolve_timeout(defaults), deepspeed::ConfigError);
}

TEST_F(ProcessInfoTest, ConfigFileTimeoutBeatsTheEnvironment) {
  std::string path = ::testing::TempDir() + "/timeout_config.json";
  auto write = [&](const std::string& body) { std::ofstream(path) << body; };
  comm::InitOptions from_config;
  from_config.config_path = path;
  write(R"({"train_batch_size": 8, "comm_timeout_seconds": 90})");
  set("DEEPSPEED_TIMEOUT", "5");
  EXPECT_EQ(comm::resolve_timeout(from_config), std::chrono::seconds(90));
  write(R"({"train_batch_size": 8})");  // key absent: the environment decides
  EXPECT_EQ(comm::resolve_timeout(from_config), std::chrono::minutes(5));
  write(R"({"comm_timeout_seconds": "12"})");
  EXPECT_EQ(comm::resolve_timeout(from_config), std::chrono::seconds(12));
  write(R"({"comm_timeout_seconds": -3})");
  try {
    comm::resolve_timeout(from_config);
    FAIL() << "negative timeout accepted";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("comm_timeout_seconds"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  from_config.config_path = path + ".missing";
  EXPECT_THROW(comm::resolve_timeout(from_config), deepspeed::ConfigError);
}

// The file is read as load_config reads it (hjson, as DeepSpeed does): a config that
// initialize() accepts has its timeout taken here too, not silently skipped.
TEST_F(ProcessInfoTest, ConfigFileTimeoutIsReadFromAnHjsonFile) {
  std::string path = ::testing::TempDir() + "/timeout_hjson.json";
  std::ofstream(path) << "{\n"
                         "  # a comment, as DeepSpeed's hjson reader allows\n"
                         "  train_batch_size: 8\n"
                         "  \"comm_timeout_seconds\": 45,\n"
                         "}\n";
  comm::InitOptions from_config;
  from_config.config_path = path;
  EXPECT_EQ(comm::resolve_timeout(from_config), std::chrono::seconds(45));
  EXPECT_EQ(deepspeed::load_config(path, 1).comm_timeout_seconds, 45);
}

// A syntax error is reported where it is met, naming the file, not skipped in silence.
TEST_F(ProcessInfoTest, ConfigFileSyntaxErrorNamesTheFile) {
  std::string path = ::testing::TempDir() + "/timeout_broken.json";
  std::ofstream(path) << R"({"comm_timeout_seconds": 45, "train_batch_size": [8})";
  comm::InitOptions from_config;
  from_config.config_path = path;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [&] { comm::resolve_timeout(from_config); }),
                  path);
}

// resolve_timeout (before initialize) and parse_config (inside it) take and refuse the same
// values of comm_timeout_seconds, with the same meaning.
TEST_F(ProcessInfoTest, ConfigFileTimeoutAgreesWithParseConfig) {
  std::string path = ::testing::TempDir() + "/timeout_agree.json";
  comm::InitOptions from_config;
  from_config.config_path = path;
  for (const nlohmann::json& value :
       {nlohmann::json(90), nlohmann::json("90"), nlohmann::json(90.0), nlohmann::json("9e1"),
        nlohmann::json(12.5), nlohmann::json("12.5"), nlohmann::json(0), nlohmann::json(-3),
        nlohmann::json("soon"), nlohmann::json(true)}) {
    nlohmann::json doc = {{"train_batch_size", 8}, {"comm_timeout_seconds", value}};
    std::ofstream(path) << doc.dump();
    std::optional<int64_t> parsed;
    try {
      parsed = deepspeed::parse_config(doc, 1).comm_timeout_seconds;
    } catch (const deepspeed::ConfigError&) {
    }
    std::optional<std::chrono::milliseconds> resolved;
    try {
      resolved = comm::resolve_timeout(from_config);
    } catch (const deepspeed::ConfigError& e) {
      EXPECT_CONTAINS(e.what(), "comm_timeout_seconds");
      EXPECT_CONTAINS(e.what(), path);
    }
    ASSERT_EQ(parsed.has_value(), resolved.has_value()) << value.dump();
    if (parsed) EXPECT_EQ(*resolved, std::chrono::seconds(*parsed)) << value.dump();
  }
}

// Without launcher variables init_distributed() is a single process and sets world() once.
TEST_F(ProcessInfoTest, InitDistributedSingleProcess) {
  auto c = deepspeed::init_distributed();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_TRUE(comm::is_initialized());
  EXPECT_EQ(comm::world(), c);
  EXPECT_EQ(deepspeed::init_distributed(), c);
}

}  // namespace

}  // namespace process_info_test
