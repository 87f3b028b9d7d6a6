// SPDX-License-Identifier: Apache-2.0
// The end-to-end fixture's code (e2e_fixture.hpp), compiled once for every
// test file.
#include "e2e_fixture.hpp"

namespace e2e {

std::string region_fd(long pid) {
  const std::string want = "/memfd:nvtaskset." + std::to_string(pid) + " (deleted)";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    if (fs::read_symlink(e.path(), ec2).string() == want) return e.path().string();
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

void touch(const std::string& p) { std::ofstream(p) << ""; }

bool wait_until(const std::function<bool()>& pred, Ms timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

std::string hex128(std::uint64_t hi, std::uint64_t lo) {
  char buf[40];
  if (hi)
    std::snprintf(buf, sizeof buf, "0x%llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
  else
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(lo));
  return buf;
}

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "\n  command: " << r.command << "\n  ";
  if (r.timed_out) os << "TIMED OUT (killed)";
  else if (r.exited) os << "exit " << r.code;
  else os << "killed by signal " << r.signal << " (" << strsignal(r.signal) << ")";
  return os << "\n  stdout: [" << r.out << "]\n  stderr: [" << r.err << "]";
}

::testing::AssertionResult ExitedWith(const Result& r, int code) {
  if (!r.timed_out && r.exited && r.code == code) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected exit " << code << r;
}

::testing::AssertionResult OneErrorLine(const Result& r) {
  const auto ls = lines_of(r.err);
  if (ls.size() == 1 && ls[0].starts_with("nvtaskset: ") && ls[0].size() > 11 && r.err.ends_with("\n"))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected one stderr line \"nvtaskset: <message>\"" << r;
}

::testing::AssertionResult FailedWithOneLine(const Result& r, int code) {
  if (auto a = ExitedWith(r, code); !a) return a;
  return OneErrorLine(r);
}

std::ostream& operator<<(std::ostream& os, const Record& r) {
  return os << r.pid << " " << r.layout << " " << r.valid << " " << r.mask << " " << r.source;
}

bool Proc::running() {
  if (reaped) return false;
  int st = 0;
  const pid_t r = ::waitpid(pid, &st, WNOHANG);
  if (r == pid) {
    finish(st, false);
    return false;
  }
  return true;
}

Result Proc::wait(Ms timeout) {
  if (reaped) return result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      finish(st, true);
      return result;
    }
    std::this_thread::sleep_for(1ms);
  }
  finish(st, false);
  return result;
}

void Proc::kill_group() {
  if (reaped) return;
  ::kill(-pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  finish(st, true);
}

void Proc::finish(int st, bool timed_out) {
  reaped = true;
  result.timed_out = timed_out;
  result.exited = WIFEXITED(st);
  result.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  result.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  result.out = out();
  result.err = err();
  result.command = command;
}

void E2E::SetUp() {
  char tmpl[] = "/tmp/nvtaskset-e2e-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
  dir_ = tmpl;
  record_ = path("record");
  fs::create_directories(path("tmp"));
  // The public status entries of this test's tasks (control/status.hpp):
  // sticky and world-writable, as /dev/shm, for the second-user tests.
  fs::create_directories(path("status"));
  ::chmod(path("status").c_str(), 01777);
  env_ = base_env();
}

void E2E::TearDown() {
  for (auto& p : procs_) {
    p->kill_group();
  }
  for (const auto& f : cleanup_) ::unlink(f.c_str());
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

E2E::Copies E2E::copies_for_other_users() {
  const std::string d = path("pub");
  fs::create_directories(d + "/bin");
  fs::create_directories(d + "/lib/nvtaskset");
  fs::create_directories(d + "/driver");
  const Copies c{d + "/bin/nvtaskset", d + "/lib/nvtaskset/libcuda.so.1", d + "/bin/launcher",
                 d + "/bin/launcher_dlopen"};
  const std::string fake = d + "/driver/libcuda.so.1";
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {kCli, c.cli}, {kShim, c.shim}, {kLauncher, c.launcher}, {kLauncherDlopen, c.launcher_dlopen}, {kFake, fake}})
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  for (const std::string& x : {d, d + "/bin", d + "/lib", d + "/lib/nvtaskset", d + "/driver", c.cli, c.shim,
                               c.launcher, c.launcher_dlopen, fake})
    ::chmod(x.c_str(), 0755);
  ::chmod(dir_.c_str(), 0711);
  env_["NVTASKSET_REAL_LIBCUDA"] = fake;
  return c;
}

Env E2E::base_env() const {
  Env e;
  for (char** p = environ; *p; ++p) {
    const std::string kv = *p;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq);
    if (k.starts_with("NVTASKSET_") || k.starts_with("FAKECUDA_") || k.starts_with("CUDA_") ||
        k.starts_with("LD_") || k.starts_with("XDG_") || k == "SPDLOG_LEVEL" || k == "TMPDIR")
      continue;
    e[k] = kv.substr(eq + 1);
  }
  e["NVTASKSET_REAL_LIBCUDA"] = kFake;
  e["FAKECUDA_RECORD"] = record_;
  // Keep any topology cache or config of the CLI inside this test.
  e["XDG_CACHE_HOME"] = path("cache");
  e["XDG_CONFIG_HOME"] = path("config");
  e["XDG_RUNTIME_DIR"] = path("runtime");
  e["TMPDIR"] = path("tmp");
  // Every nvtaskset run here passes --no-mps; should one still reach for
  // MPS, it finds no daemon and no control program.
  e["CUDA_MPS_PIPE_DIRECTORY"] = path("mps-pipe");
  e["CUDA_MPS_LOG_DIRECTORY"] = path("mps-log");
  e["NVTASKSET_MPS_CONTROL"] = path("no-such-mps-control");
  e["NVTASKSET_STATUS_DIR"] = path("status");
  return e;
}

Proc& E2E::start(const std::vector<std::string>& argv, const Env& env) {
  auto p = std::make_unique<Proc>();
  const std::string tag = std::to_string(procs_.size());
  p->out_path = path("out." + tag);
  p->err_path = path("err." + tag);
  for (const auto& a : argv) p->command += (p->command.empty() ? "" : " ") + ("'" + a + "'");

  std::vector<std::string> envs;
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& s : envs) cenv.push_back(const_cast<char*>(s.c_str()));
  cenv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // Dies with the test binary, even if it is killed before TearDown
    // (kept across the exec, and across nvtaskset's exec of the command).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(p->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(p->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || ::chdir(dir_.c_str()) != 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    ::_exit(125);  // distinct from 127: the test harness, not nvtaskset, failed to exec
  }
  if (pid > 0) ::setpgid(pid, pid);
  p->pid = pid;
  procs_.push_back(std::move(p));
  return *procs_.back();
}

std::vector<Record> E2E::records() const {
  std::vector<Record> out;
  std::string text = read_file(record_);
  // Only whole lines: a reader may catch a launch's write half-way.
  text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  for (const auto& l : lines_of(text)) {
    std::istringstream in(l);
    Record r;
    in >> r.pid >> r.layout >> r.valid >> r.mask >> r.source;
    out.push_back(r);
  }
  return out;
}

std::vector<Record> E2E::records_of(long pid) const {
  std::vector<Record> out;
  for (const auto& r : records())
    if (r.pid == pid) out.push_back(r);
  return out;
}

long E2E::wait_ready(const std::string& ready, Proc& p) {
  if (!wait_until([&] { return exists(ready) || !p.running(); })) return -1;
  if (!exists(ready)) return -1;
  return std::stol(read_file(ready));
}

long E2E::printed_pid(const std::string& out) {
  const auto ls = lines_of(out);
  if (ls.empty() || !ls[0].starts_with("pid ")) return -1;
  return std::stol(ls[0].substr(4));
}

std::optional<std::string> E2E::printed_env(const std::string& out, const std::string& name) {
  for (const auto& l : lines_of(out)) {
    if (l == "env " + name + " unset") return std::nullopt;
    if (l.starts_with("env " + name + "=")) return l.substr(5 + name.size());
  }
  ADD_FAILURE() << "launcher did not print " << name << " in: " << out;
  return std::nullopt;
}

std::vector<Record> E2E::records_after(long pid, std::size_t from, std::size_t skip, std::size_t n) {
  std::vector<Record> mine;
  wait_until([&] {
    mine.clear();
    const auto all = records();
    for (std::size_t i = from; i < all.size(); ++i)
      if (all[i].pid == pid) mine.push_back(all[i]);
    return mine.size() >= skip + n;
  });
  if (mine.size() < skip + n) {
    ADD_FAILURE() << "only " << mine.size() << " launches of pid " << pid << " after record " << from;
    return {};
  }
  return {mine.begin() + static_cast<long>(skip), mine.end()};
}

std::string pid_line(long pid, const std::string& what, const std::string& value) {
  return "pid " + std::to_string(pid) + "'s " + what + ": " + value + "\n";
}

std::vector<Record> graph_records(const std::vector<Record>& all, long pid, std::size_t from) {
  std::vector<Record> out;
  for (std::size_t i = from; i < all.size(); ++i)
    if (all[i].pid == pid && all[i].source.starts_with("graph")) out.push_back(all[i]);
  return out;
}

std::string hopper_topology_json(const std::string& uuid, const std::array<unsigned, 8>& bits) {
  std::string tpcs;
  const char* gpc[8] = {"0", "1", "0", "1", "0", "1", "0", "null"};
  for (unsigned k = 0; k < 8; ++k)
    tpcs += std::string(k ? "," : "") + "{\"tpc\": " + std::to_string(k) + ", \"bit\": " + std::to_string(bits[k]) +
            ", \"gpc\": " + gpc[k] + ", \"cluster_capable\": " + (k == 7 ? "false" : "true") + "}";
  return "{\"schema\": \"nvtaskset-topology/1\", \"device\": {\"name\": \"Stand-in GPU\", \"uuid\": \"" + uuid +
         "\", \"pci_bus_id\": \"0000:01:00.0\", \"compute_capability\": \"9.0\", \"sm_count\": 16, "
         "\"driver_version\": 13000, \"driver_release\": \"\"}, \"source\": \"file\", \"calibrated_at\": null, "
         "\"calibration_ms\": null, \"tpcs\": [" + tpcs + "], \"gpcs\": ["
         "{\"gpc\": 0, \"tpcs\": [0, 2, 4, 6], \"max_cluster\": 8}, {\"gpc\": 1, \"tpcs\": [1, 3, 5], \"max_cluster\": 4}]}";
}

std::string hopper_disable(const std::vector<unsigned>& tpcs) {
  std::uint64_t lo = 0, hi = 0;
  for (unsigned k : tpcs) (kBits[k] < 64 ? lo : hi) |= std::uint64_t{1} << (kBits[k] % 64);
  return disable128(hi, lo);
}

void TopologyFile::SetUp() {
  E2E::SetUp();
  env_["FAKECUDA_CC"] = "9.0";
  file_ = path("topology.json");
  std::ofstream(file_) << hopper_topology_json();
}

std::optional<std::pair<uid_t, gid_t>> second_user(const char* name) {
  if (::getuid() != 0) return std::nullopt;
  if (::getpwnam(name) == nullptr) {
    const std::string cmd = std::string("useradd --system --no-create-home --shell /usr/sbin/nologin ") + name +
                            " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0 && ::getpwnam(name) == nullptr) return std::nullopt;
  }
  const passwd* pw = ::getpwnam(name);
  if (pw == nullptr) return std::nullopt;
  return std::make_pair(pw->pw_uid, pw->pw_gid);
}

std::vector<std::string> as_user(std::pair<uid_t, gid_t> user, std::vector<std::string> argv) {
  std::vector<std::string> out{"setpriv", "--reuid=" + std::to_string(user.first),
                               "--regid=" + std::to_string(user.second), "--clear-groups", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

void Sharing::SetUp() {
  TopologyFile::SetUp();
  env_["NVTASKSET_TOPOLOGY"] = file_;
  // Another user must reach the status directory, as it reaches /dev/shm.
  ::chmod(dir_.c_str(), 0711);
}

long Sharing::start_task(const std::vector<std::string>& options, const std::string& tag, Proc** out,
                         const std::vector<std::string>& launcher_args, const std::string& launcher) {
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {launcher, "--until-file", path("until"), "--interval-ms", "5", "--ready-file",
                           path("ready." + tag)});
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  Proc& p = start(argv, env_);
  tasks_.push_back(&p);
  if (out) *out = &p;
  return wait_ready(path("ready." + tag), p);
}

void Sharing::stop_all() {
  touch(path("until"));
  for (Proc* p : tasks_) EXPECT_TRUE(ExitedWith(p->wait(), 0)) << p->command;
}

std::string Sharing::mask_of(long pid) {
  const std::size_t before = records().size();
  const auto recs = records_after(pid, before, 1, 2);
  return recs.empty() ? std::string("none") : recs.back().mask;
}

}  // namespace e2e
