// dsrun's multi-node fan-out (tools/dsrun/fanout.*): the environment forwarded to remote nodes,
// .deepspeed_env, shell quoting, and the exact ssh / pdsh / mpirun / srun command lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "fanout.h"
#include "spawn.h"

namespace dsrun_fanout_test {

using namespace deepspeed::launcher;
using Argv = std::vector<std::string>;

namespace {
std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "(no error)";
}

Resources two_hosts() { return {{"w0", {0, 1}}, {"w1", {0, 1}}}; }

// What the remote shell makes of an agent command: `cmd` up to its final exec, run by /bin/sh
// with only HOME=/h and PATH set, followed by `env`; returns env's output (one VAR=VALUE a line).
std::string remote_environment(const std::string& cmd) {
  const std::string until_exec = cmd.substr(0, cmd.find(" && exec "));
  const std::string line =
      "env -i HOME=/h PATH=/usr/bin:/bin /bin/sh -c " + shell_quote(until_exec + " && env");
  std::string out;
  if (FILE* p = ::popen(line.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}
}  // namespace

TEST(DsrunFanout, ForwardsDeepSpeedsPrefixesSorted) {
  const char* env[] = {"PATH=/bin",      "OMP_NUM_THREADS=2", "NCCL_DEBUG=INFO", "HOME=/root",
                       "GLOO_SOCKET_IFNAME=eth0", "DS_DEVICE=cpu", "UCX_TLS=tcp", "MASTER_X=1",
                       "PYTHONPATH=/p", "LD_PRELOAD=x", "NOEQUALS", "OPENBLAS_CORETYPE=Haswell", nullptr};
  EnvList got = forwarded_environment(env);
  EnvList want = {{"DS_DEVICE", "cpu"},   {"GLOO_SOCKET_IFNAME", "eth0"}, {"MASTER_X", "1"},
                  {"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "2"},       {"OPENBLAS_CORETYPE", "Haswell"},
                  {"PYTHONPATH", "/p"},   {"UCX_TLS", "tcp"}};
  EXPECT_EQ(got, want);
}

TEST(DsrunFanout, DeepSpeedEnvLines) {
  EnvList got = parse_deepspeed_env("# comment\n\nA=1\nB=x=y z\r\n  C=  \n", "/h/.deepspeed_env");
  EnvList want = {{"A", "1"}, {"B", "x=y z"}, {"C", ""}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(what_of([] { parse_deepspeed_env("A=1\nnot a line\n", "/h/.deepspeed_env"); }),
            "/h/.deepspeed_env line 2 'not a line': expected KEY=VALUE with KEY a variable name");
  EXPECT_EQ(what_of([] { parse_deepspeed_env("1A=2\n", "f"); }),
            "f line 1 '1A=2': expected KEY=VALUE with KEY a variable name");
  EXPECT_EQ(merge_env({{"A", "1"}, {"B", "2"}}, {{"B", "3"}, {"C", "4"}}),
            (EnvList{{"A", "1"}, {"B", "3"}, {"C", "4"}}));
}

// Whitespace around the key and the value is dropped, as DeepSpeed's key.strip() / var.strip()
// (`KEY = v` was refused, and `KEY= v` kept the leading space).
TEST(DsrunFanout, DeepSpeedEnvStripsKeyAndValue) {
  EXPECT_EQ(parse_deepspeed_env("K = v w \nL= x\n\tM\t=\ty\n", "f"),
            (EnvList{{"K", "v w"}, {"L", "x"}, {"M", "y"}}));
  EXPECT_EQ(what_of([] { parse_deepspeed_env(" = v\n", "f"); }),
            "f line 1 '= v': expected KEY=VALUE with KEY a variable name");
}

// Which .deepspeed_env files are read (DeepSpeed's os.path.join(path, NAME) for path in ~, .): an
// absolute DS_ENV_FILE is used as it is; any other name, or relative path, is looked up in HOME,
// then the cwd, even when it is a file as given.
TEST(DsrunFanout, DeepSpeedEnvFilePaths) {
  std::vector<std::string> files;
  auto is_file = [&](const std::string& p) {
    return std::find(files.begin(), files.end(), p) != files.end();
  };
  files = {"/h/.deepspeed_env", "/w/.deepspeed_env"};
  EXPECT_EQ(deepspeed_env_paths("", "/h", "/w", is_file),
            (Argv{"/h/.deepspeed_env", "/w/.deepspeed_env"}));
  EXPECT_EQ(deepspeed_env_paths("", "/w", "/w", is_file), (Argv{"/w/.deepspeed_env"}));
  EXPECT_EQ(deepspeed_env_paths("", "", "/w", is_file), (Argv{"/w/.deepspeed_env"}));
  files = {"/etc/job.env", "/h/.deepspeed_env", "/h/my_env"};
  EXPECT_EQ(deepspeed_env_paths("/etc/job.env", "/h", "/w", is_file), (Argv{"/etc/job.env"}));
  EXPECT_EQ(deepspeed_env_paths("my_env", "/h", "/w", is_file), (Argv{"/h/my_env"}));
  // A relative name that is a file as given (here: in the cwd) is still looked up in HOME first,
  // then the cwd (it was once read alone, dropping HOME's).
  files = {"my_env", "/w/my_env", "/h/my_env"};
  EXPECT_EQ(deepspeed_env_paths("my_env", "/h", "/w", is_file), (Argv{"/h/my_env", "/w/my_env"}));
  files = {"conf/job.env", "/w/conf/job.env", "/h/conf/job.env", "/h/conf/other.env"};
  EXPECT_EQ(deepspeed_env_paths("conf/job.env", "/h", "/w", is_file),
            (Argv{"/h/conf/job.env", "/w/conf/job.env"}));
  EXPECT_EQ(deepspeed_env_paths("conf/other.env", "/h", "/w", is_file),
            (Argv{"/h/conf/other.env"}));
  EXPECT_EQ(what_of([&] { deepspeed_env_paths("/etc/typo.env", "/h", "/w", is_file); }),
            "DS_ENV_FILE=/etc/typo.env is not a file (an absolute DS_ENV_FILE is read as it is)");
  EXPECT_EQ(deepspeed_env_paths("missing_env", "/h", "/w", is_file), Argv{});
}

TEST(DsrunFanout, ShellQuoteAndSplit) {
  EXPECT_EQ(shell_quote("plain-word_1.2:3,@%+=/"), "plain-word_1.2:3,@%+=/");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
  EXPECT_EQ(split_words("-F 'my config' -o \"A=b c\" x\\ y"),
            (Argv{"-F", "my config", "-o", "A=b c", "x y"}));
  EXPECT_EQ(split_words("   "), Argv{});
  EXPECT_EQ(what_of([] { split_words("-o 'open"); }), "--launcher_args '-o 'open': unterminated ' quote");
}

TEST(DsrunFanout, AgentCommandAndSsh) {
  AgentJob job;
  job.dsrun_path = "/opt/ds/bin/dsrun";
  job.cwd = "/home/me/my run";
  job.exports = {{"OMP_NUM_THREADS", "1"}, {"X", "a b"}};
  job.world_info = "w0:0,1@w1:0,1";
  job.master_addr = "10.0.0.1";
  job.master_port = 29501;
  job.agent_flags = {"--no_local_rank"};
  job.command = {"./train", "--deepspeed_config", "ds config.json"};
  const std::string cmd = agent_shell_command(job, "1");
  EXPECT_EQ(cmd,
            "cd '/home/me/my run' && export OMP_NUM_THREADS=1 && export X='a b' && exec "
            "/opt/ds/bin/dsrun --node_rank 1 --world_info w0:0,1@w1:0,1 --master_addr 10.0.0.1 "
            "--master_port 29501 --watch_stdin --no_local_rank ./train --deepspeed_config "
            "'ds config.json'");
  EXPECT_NE(agent_shell_command(job, "%n").find("--node_rank %n "), std::string::npos);
  EXPECT_EQ(ssh_argv("w1", 2222, {"-F", "cfg"}, "CMD"),
            (Argv{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                  "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-p", "2222", "-F",
                  "cfg", "w1", "CMD"}));
  EXPECT_EQ(ssh_argv("w1", 0, {}, "CMD").size(), 11u);  // no -p without --ssh_port
}

// A .deepspeed_env value reaches the ranks as the remote shell expands it, as in DeepSpeed
// (`LD_LIBRARY_PATH=/opt/efa/lib64:$LD_LIBRARY_PATH` is the usual line); it was once single-quoted,
// so the ranks saw a literal "$HOME". A forwarded variable keeps its exact value, and only `$`
// is live in a file's value (no backtick command, no quote or backslash games).
TEST(DsrunFanout, DeepSpeedEnvValuesExpandOnTheRemoteShell) {
  AgentJob job;
  job.dsrun_path = "/opt/ds/bin/dsrun";
  job.cwd = "/";
  job.exports = {{"FWD", "lit:$HOME 'q'"}, {"BOTH", "forwarded"}};
  job.env_file = {{"X", "pre:$HOME"}, {"Q", "a \"b\" `echo c` \\$HOME\\"}, {"BOTH", "file"}};
  job.world_info = "w0:0";
  job.master_addr = "w0";
  job.command = {"./train"};
  const std::string cmd = agent_shell_command(job, "0");
  const std::string env = "\n" + remote_environment(cmd);
  EXPECT_NE(env.find("\nX=pre:/h\n"), std::string::npos) << env;
  EXPECT_NE(env.find("\nFWD=lit:$HOME 'q'\n"), std::string::npos) << env;
  EXPECT_NE(env.find("\nQ=a \"b\" `echo c` \\/h\\\n"), std::string::npos) << env;
  EXPECT_NE(env.find("\nBOTH=file\n"), std::string::npos) << env;  // the file wins, as merge_env
  EXPECT_EQ(cmd.find("BOTH=forwarded"), std::string::npos) << cmd;
  EXPECT_EQ(shell_double_quote("a$B"), "\"a$B\"");
}

// mpirun and srun run a host's ranks on its devices 0..k-1: a selection leaving other slots is
// refused (it was once cut down to a slot count, silently running on other devices).
TEST(DsrunFanout, MpiBackendsNeedFirstSlots) {
  require_first_slots({{"w0", {0}}, {"w1", {0, 1}}}, "openmpi");  // whole hosts, first slots
  EXPECT_EQ(what_of([] { require_first_slots({{"w0", {0, 1}}, {"w1", {1, 3}}}, "slurm"); }),
            "--launcher slurm cannot run chosen slots: --include/--exclude leave host w1 with "
            "slots 1,3, but srun starts a host's ranks on its devices 0..k-1 (it sets no "
            "CUDA_VISIBLE_DEVICES); choose whole hosts or a host's first slots, or use --launcher "
            "ssh or pdsh");
  EXPECT_NE(what_of([] { require_first_slots({{"w0", {1}}}, "openmpi"); }).find("mpirun starts"),
            std::string::npos);
}

TEST(DsrunFanout, Pdsh) {
  EXPECT_EQ(pdsh_argv(two_hosts(), {"-u", "30"}, "CMD"),
            (Argv{"pdsh", "-S", "-f", "1024", "-R", "ssh", "-w", "w0,w1", "-u", "30", "CMD"}));
  EXPECT_EQ(pdsh_ssh_args(22),
            "-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 -o "
            "ServerAliveCountMax=3 -p 22");
}

TEST(DsrunFanout, Mpirun) {
  Resources world = {{"w0", {0, 1}}, {"w1", {0, 1, 2}}};
  EXPECT_EQ(mpi_hostfile_text(world), "w0 slots=2\nw1 slots=3\n");
  EXPECT_EQ(mpirun_argv(world, "/tmp/hf", {"--allow-run-as-root"}, {{"OMP_NUM_THREADS", "1"}},
                        "10.0.0.1", 29500, {"./train", "--x"}),
            (Argv{"mpirun", "-n", "5", "-hostfile", "/tmp/hf", "--mca", "btl", "^openib",
                  "--allow-run-as-root", "-x", "OMP_NUM_THREADS=1", "-x", "MASTER_ADDR=10.0.0.1",
                  "-x", "MASTER_PORT=29500", "./train", "--x"}));
}

TEST(DsrunFanout, Srun) {
  EXPECT_EQ(srun_argv(two_hosts(), {"--partition=p"}, {{"OMP_NUM_THREADS", "1"}}, "w0", 29500,
                      {"./train"}),
            (Argv{"srun", "-n", "4", "--nodes=2", "--ntasks-per-node=2", "--distribution=arbitrary",
                  "--partition=p", "--export=ALL,OMP_NUM_THREADS=1,MASTER_ADDR=w0,MASTER_PORT=29500",
                  "./train"}));
  // The task order srun gets (SLURM_HOSTFILE): the world's, not Slurm's sorted node list.
  EXPECT_EQ(slurm_hostfile_text({{"w1", {0, 1}}, {"w0", {0, 1}}}), "w1\nw1\nw0\nw0\n");
  Resources uneven = {{"w0", {0, 1}}, {"w1", {0}}};
  EXPECT_EQ(what_of([&] { srun_argv(uneven, {}, {}, "w0", 1, {"p"}); }),
            "--launcher slurm: srun starts the same number of ranks on every node, but w0 has 2 "
            "and w1 has 1");
  EXPECT_EQ(what_of([] { srun_argv(two_hosts(), {}, {{"A", "x,y"}}, "w0", 1, {"p"}); }),
            "--launcher slurm: A='x,y' contains a comma, which srun --export cannot carry");
}

}  // namespace dsrun_fanout_test
