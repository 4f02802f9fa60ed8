// dsrun's rank count on a machine without GPUs (tools/dsrun/cpu_devices.*): DeepSpeed's CPU
// accelerator's device_count(), LOCAL_SIZE else the NUMA nodes with CPUs, over fake sysfs trees.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "cpu_devices.h"
#include "spawn.h"
#include "support/expect.h"
#include "support/files.h"

namespace dsrun_cpu_devices_test {

using namespace deepspeed::launcher;

namespace {

// A sysfs root whose devices/system/node holds nodeN/cpulist for each entry (N -> cpulist text)
// and the files that sit beside the node folders on a real machine.
class FakeSysfs {
 public:
  explicit FakeSysfs(const std::map<int, std::string>& cpulists) : dir_("ds_fake_sysfs") {
    const std::string nodes = node_dir();
    std::filesystem::create_directories(nodes);
    for (const char* file : {"online", "possible", "has_cpu", "has_memory"})
      dstest::write_bytes(nodes + "/" + file, "0-1\n");
    std::filesystem::create_directories(nodes + "/power");
    for (const auto& [id, cpus] : cpulists) {
      const std::string node = nodes + "/node" + std::to_string(id);
      std::filesystem::create_directories(node);
      dstest::write_bytes(node + "/cpulist", cpus);
    }
  }
  const std::string& root() const { return dir_.path(); }
  std::string node_dir() const { return dir_ / "devices/system/node"; }

 private:
  dstest::TempDir dir_;
};

}  // namespace

TEST(DsrunCpuDevices, OnePerNumaNode) {
  EXPECT_EQ(numa_node_count(FakeSysfs({{0, "0-7\n"}}).root()), 1);
  EXPECT_EQ(numa_node_count(FakeSysfs({{0, "0-7\n"}, {1, "8-15\n"}}).root()), 2);
  // Node ids in numeric order (node10 after node2), all of them counted.
  FakeSysfs many({{0, "0-1\n"}, {1, "2-3\n"}, {2, "4-5\n"}, {10, "6-7\n"}});
  EXPECT_EQ(numa_node_count(many.root()), 4);
  EXPECT_EQ(cpu_device_count(nullptr, many.root()), 4);
}

// HBM in flat mode is a node of memory without cores: not a device.
TEST(DsrunCpuDevices, NodesWithoutCpusAreLeftOut) {
  FakeSysfs hbm({{0, "0-3\n"}, {1, "4-7\n"}, {2, "\n"}, {3, ""}});
  EXPECT_EQ(numa_node_count(hbm.root()), 2);
}

// Fake NUMA splits one node's memory into nodes that list the same CPUs: one device, also when a
// CPU-less node sits between two of them (DeepSpeed compares with the last node it counted).
TEST(DsrunCpuDevices, FakeNumaCopiesCountOnce) {
  EXPECT_EQ(numa_node_count(FakeSysfs({{0, "0-3\n"}, {1, "0-3\n"}, {2, "4-7\n"}}).root()), 2);
  EXPECT_EQ(numa_node_count(FakeSysfs({{0, "0-3\n"}, {1, "\n"}, {2, "0-3\n"}}).root()), 1);
  // Not adjacent: DeepSpeed compares with the previous node only.
  EXPECT_EQ(numa_node_count(FakeSysfs({{0, "0-3\n"}, {1, "4-7\n"}, {2, "0-3\n"}}).root()), 3);
}

// No readable node folder (no sysfs, a container hiding it): 0 nodes, so 1 rank, as DeepSpeed
// starts 1 when numactl cannot tell.
TEST(DsrunCpuDevices, NothingReadableIsOneRank) {
  dstest::TempDir empty("ds_no_sysfs");
  EXPECT_EQ(numa_node_count(empty.path()), 0);
  EXPECT_EQ(cpu_device_count(nullptr, empty.path()), 1);
  EXPECT_EQ(cpu_device_count(nullptr, empty / "missing"), 1);
  EXPECT_EQ(cpu_device_count(nullptr, FakeSysfs({{0, "\n"}}).root()), 1);
}

// LOCAL_SIZE, when a positive integer, wins over the nodes, as in DeepSpeed's device_count();
// 0, a negative value or "" leaves the count to the nodes; anything else is refused by name.
TEST(DsrunCpuDevices, LocalSizeWins) {
  FakeSysfs two({{0, "0-7\n"}, {1, "8-15\n"}});
  EXPECT_EQ(cpu_device_count("3", two.root()), 3);
  EXPECT_EQ(cpu_device_count("0", two.root()), 2);
  EXPECT_EQ(cpu_device_count("-1", two.root()), 2);
  EXPECT_EQ(cpu_device_count("", two.root()), 2);
  EXPECT_CONTAINS(dstest::message_of<LaunchError>([&] { cpu_device_count("four", two.root()); }),
                  "LOCAL_SIZE=four is not an integer");
}

}  // namespace dsrun_cpu_devices_test
