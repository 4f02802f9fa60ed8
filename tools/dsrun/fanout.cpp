#include "fanout.h"

#include <algorithm>
#include <sstream>

#include "spawn.h"  // LaunchError

namespace deepspeed {
namespace launcher {
namespace {

// DeepSpeed's runner.py forwards NCCL, PYTHON, MV2, UCX, MLFLOW; added are the ones a C++ job on
// Gloo reads (OMP_, GLOO_, MASTER_), this project's own switches, and the CPU BLAS libraries'
// (OPENBLAS_, MKL_): OPENBLAS_CORETYPE picks the kernels, so without it ranks started over ssh
// rounded differently from local ones (measured: the example's losses differed in the last bit).
const char* const kForwardedPrefixes[] = {"NCCL",    "PYTHON", "MV2",        "UCX",    "MLFLOW",
                                          "OMP_",    "GLOO_",  "MASTER_",    "DS_",    "DEEPSPEED_",
                                          "DSRUN_",  "OPENBLAS_", "MKL_"};

bool forwarded(const std::string& key) {
  for (const char* p : kForwardedPrefixes)
    if (key.rfind(p, 0) == 0) return true;
  return false;
}

bool valid_name(const std::string& key) {
  if (key.empty() || (key[0] >= '0' && key[0] <= '9')) return false;
  return key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
         std::string::npos;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string host_list(const Resources& world) {
  std::string out;
  for (const auto& h : world) out += (out.empty() ? "" : ",") + h.host;
  return out;
}

}  // namespace

EnvList forwarded_environment(const char* const* environ_list) {
  EnvList out;
  for (const char* const* e = environ_list; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string key = entry.substr(0, eq);
    if (forwarded(key) && valid_name(key)) out.emplace_back(key, entry.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

EnvList parse_deepspeed_env(const std::string& text, const std::string& path) {
  EnvList out;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    std::string key = eq == std::string::npos ? "" : trim(line.substr(0, eq));
    if (!valid_name(key))
      throw LaunchError(path + " line " + std::to_string(line_no) + " '" + line +
                        "': expected KEY=VALUE with KEY a variable name");
    out.emplace_back(key, trim(line.substr(eq + 1)));
  }
  return out;
}

std::vector<std::string> deepspeed_env_paths(const std::string& ds_env_file,
                                             const std::string& home, const std::string& cwd,
                                             const std::function<bool(const std::string&)>& is_file) {
  // DeepSpeed's runner reads os.path.join(path, NAME) for path in (~, .): an absolute NAME is
  // that file (once here), anything else is looked up under both.
  if (!ds_env_file.empty() && ds_env_file[0] == '/') {
    if (!is_file(ds_env_file))
      throw LaunchError("DS_ENV_FILE=" + ds_env_file +
                        " is not a file (an absolute DS_ENV_FILE is read as it is)");
    return {ds_env_file};
  }
  const std::string name = ds_env_file.empty() ? ".deepspeed_env" : ds_env_file;
  std::vector<std::string> paths;
  for (const std::string& dir : {home, cwd}) {
    if (dir.empty()) continue;
    std::string path = dir + "/" + name;
    if (is_file(path) && (paths.empty() || paths.back() != path)) paths.push_back(path);
  }
  return paths;
}

EnvList merge_env(EnvList base, const EnvList& extra) {
  for (const auto& kv : extra) {
    auto it = std::find_if(base.begin(), base.end(),
                           [&](const std::pair<std::string, std::string>& b) { return b.first == kv.first; });
    if (it != base.end())
      it->second = kv.second;
    else
      base.push_back(kv);
  }
  return base;
}

std::string shell_quote(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "@%+=:,./_-") == std::string::npos)
    return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_double_quote(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\' || c == '`') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0; else cur += c;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
      else if (c == '\\' && i + 1 < text.size() && std::string("\"\\$`").find(text[i + 1]) != std::string::npos)
        cur += text[++i];
      else cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      cur += text[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (quote != 0) throw LaunchError("--launcher_args '" + text + "': unterminated " + quote + " quote");
  if (in_word) words.push_back(cur);
  return words;
}

std::string remote_prelude(const std::string& cwd, const EnvList& exports, const EnvList& env_file) {
  std::string cmd = cwd.empty() ? "" : "cd " + shell_quote(cwd);
  auto then = [&] { return std::string(cmd.empty() ? "" : " && "); };
  auto in_env_file = [&](const std::string& key) {
    return std::any_of(
        env_file.begin(), env_file.end(),
        [&](const std::pair<std::string, std::string>& kv) { return kv.first == key; });
  };
  // Forwarded values are the launching environment's, exact; .deepspeed_env values are written
  // for the remote shell (`LD_LIBRARY_PATH=/opt/efa/lib64:$LD_LIBRARY_PATH`), as in DeepSpeed.
  for (const auto& kv : exports)
    if (!in_env_file(kv.first)) cmd += then() + "export " + kv.first + "=" + shell_quote(kv.second);
  for (const auto& kv : env_file)
    cmd += then() + "export " + kv.first + "=" + shell_double_quote(kv.second);
  return cmd;
}

std::string agent_shell_command(const AgentJob& job, const std::string& node_rank) {
  std::string cmd = remote_prelude(job.cwd, job.exports, job.env_file);
  std::vector<std::string> argv = {job.dsrun_path,   "--node_rank",   node_rank,
                                   "--world_info",   job.world_info,  "--master_addr",
                                   job.master_addr,  "--master_port", std::to_string(job.master_port),
                                   "--watch_stdin"};
  argv.insert(argv.end(), job.agent_flags.begin(), job.agent_flags.end());
  argv.insert(argv.end(), job.command.begin(), job.command.end());
  cmd += " && exec";
  for (const auto& w : argv) cmd += " " + shell_quote(w);
  return cmd;
}

std::vector<std::string> ssh_options(int ssh_port) {
  std::vector<std::string> o = {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"};
  if (ssh_port > 0) {
    o.push_back("-p");
    o.push_back(std::to_string(ssh_port));
  }
  return o;
}

std::vector<std::string> ssh_argv(const std::string& host, int ssh_port,
                                  const std::vector<std::string>& launcher_args,
                                  const std::string& remote_command) {
  std::vector<std::string> argv = {"ssh"};
  for (const auto& o : ssh_options(ssh_port)) argv.push_back(o);
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(host);
  argv.push_back(remote_command);
  return argv;
}

std::string pdsh_ssh_args(int ssh_port) {
  std::string out;
  for (const auto& o : ssh_options(ssh_port)) out += (out.empty() ? "" : " ") + o;
  return out;
}

std::vector<std::string> pdsh_argv(const Resources& world,
                                   const std::vector<std::string>& launcher_args,
                                   const std::string& remote_command) {
  std::vector<std::string> argv = {"pdsh", "-S", "-f", "1024", "-R", "ssh", "-w", host_list(world)};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(remote_command);
  return argv;
}

std::string mpi_hostfile_text(const Resources& world) {
  std::string out;
  for (const auto& h : world) out += h.host + " slots=" + std::to_string(h.slots.size()) + "\n";
  return out;
}

std::vector<std::string> mpirun_ssh_port_args(int ssh_port, const std::string& user_rsh_args,
                                              const std::vector<std::string>& launcher_args) {
  if (ssh_port <= 0) return launcher_args;
  const std::string port = "-p " + std::to_string(ssh_port);
  for (const auto& w : launcher_args)
    if (w.find("plm_rsh_args") != std::string::npos)
      throw LaunchError("--ssh_port " + std::to_string(ssh_port) +
                        " and --launcher_args' --mca plm_rsh_args both set mpirun's ssh options "
                        "(one would replace the other); put '" + port +
                        "' into that plm_rsh_args, or drop --ssh_port");
  std::string rsh = trim(user_rsh_args);
  std::vector<std::string> out = {"--mca", "plm_rsh_args", rsh.empty() ? port : rsh + " " + port};
  out.insert(out.end(), launcher_args.begin(), launcher_args.end());
  return out;
}

void require_first_slots(const Resources& world, const std::string& launcher) {
  for (const auto& h : world) {
    bool first = true;
    for (size_t k = 0; k < h.slots.size(); ++k) first = first && h.slots[k] == static_cast<int>(k);
    if (first) continue;
    std::string slots;
    for (int s : h.slots) slots += (slots.empty() ? "" : ",") + std::to_string(s);
    const std::string tool = launcher == "slurm" ? "srun" : "mpirun";
    throw LaunchError("--launcher " + launcher + " cannot run chosen slots: --include/--exclude " +
                      "leave host " + h.host + " with slots " + slots + ", but " + tool +
                      " starts a host's ranks on its devices 0..k-1 (it sets no "
                      "CUDA_VISIBLE_DEVICES); choose whole hosts or a host's first slots, or use "
                      "--launcher ssh or pdsh");
  }
}

std::vector<std::string> mpirun_argv(const Resources& world, const std::string& hostfile,
                                     const std::vector<std::string>& launcher_args,
                                     const EnvList& exports, const std::string& master_addr,
                                     int master_port, const std::vector<std::string>& command) {
  std::vector<std::string> argv = {"mpirun", "-n", std::to_string(world_size(world)), "-hostfile",
                                   hostfile, "--mca", "btl", "^openib"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  EnvList env = merge_env(exports, {{"MASTER_ADDR", master_addr},
                                    {"MASTER_PORT", std::to_string(master_port)}});
  for (const auto& kv : env) {
    argv.push_back("-x");
    argv.push_back(kv.first + "=" + kv.second);
  }
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::vector<std::string> srun_argv(const Resources& world,
                                   const std::vector<std::string>& launcher_args,
                                   const EnvList& exports, const std::string& master_addr,
                                   int master_port, const std::vector<std::string>& command) {
  const size_t per_node = world.at(0).slots.size();
  for (const auto& h : world)
    if (h.slots.size() != per_node)
      throw LaunchError("--launcher slurm: srun starts the same number of ranks on every node, but " +
                        world[0].host + " has " + std::to_string(per_node) + " and " + h.host +
                        " has " + std::to_string(h.slots.size()));
  std::string export_arg = "--export=ALL";
  EnvList env = merge_env(exports, {{"MASTER_ADDR", master_addr},
                                    {"MASTER_PORT", std::to_string(master_port)}});
  for (const auto& kv : env) {
    if (kv.second.find(',') != std::string::npos)
      throw LaunchError("--launcher slurm: " + kv.first + "='" + kv.second +
                        "' contains a comma, which srun --export cannot carry");
    export_arg += "," + kv.first + "=" + kv.second;
  }
  std::vector<std::string> argv = {"srun",
                                   "-n",
                                   std::to_string(world_size(world)),
                                   "--nodes=" + std::to_string(world.size()),
                                   "--ntasks-per-node=" + std::to_string(per_node),
                                   "--distribution=arbitrary"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(export_arg);
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::string slurm_hostfile_text(const Resources& world) {
  std::string out;
  for (const auto& h : world)
    for (size_t k = 0; k < h.slots.size(); ++k) out += h.host + "\n";
  return out;
}

}  // namespace launcher
}  // namespace deepspeed
