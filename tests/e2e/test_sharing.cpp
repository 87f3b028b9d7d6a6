// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of sharing a GPU: -n, --exclusive, --status, -a, and MPS
// with several users, through the real CLI and shim on the stand-in driver.
#include "e2e_fixture.hpp"

using namespace e2e;


TEST_F(Sharing, CountPacksWholeGpcsAndAvoidsTpcsOthersHold) {
  // 4 TPCs: GPC 0 whole (clusters of 8), not the striped 0-3.
  const long a = start_task({"-v", "-n", "4"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2, 4, 6}));
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0,2,4,6"));
  // The next -n 3 takes GPC 1, which no one holds.
  const long b = start_task({"-n", "3"}, "b");
  ASSERT_GT(b, 0);
  EXPECT_EQ(mask_of(b), hopper_disable({1, 3, 5}));
  // Two left free of 8... one, TPC 7: --exclusive refuses -n 2, one line, no kernel.
  const Result r = run({kCli, "--no-mps", "--exclusive", "-n", "2", kLauncher, "--kernels", "1"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("only 1 of 8 TPCs of device 0 are free"), std::string::npos) << r;
  // Without --exclusive it runs, sharing, and says so.
  const Result s = run({kCli, "--no-mps", "-n", "2", kLauncher, "--kernels", "1"});
  EXPECT_TRUE(ExitedWith(s, 0)) << s;
  EXPECT_NE(s.err.find("-n 2: only 1 of 8 TPCs of device 0 are free"), std::string::npos) << s;
  stop_all();
}

TEST_F(Sharing, SpreadTakesOneTpcPerGpcFirst) {
  const long a = start_task({"-n", "2", "--spread"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_EQ(run({kCli, "-p", std::to_string(a)}).out, pid_line(a, "current TPC list", "0-1"));
  stop_all();
  const Result r = run({kCli, "--no-mps", "--spread", "-t", "0", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
}

TEST_F(Sharing, CountIsValidatedBeforeAnythingRuns) {
  const std::string marker = path("marker");
  for (const std::string bad : {"0", "9", "-1", "1x", "", "129", "99999999999999999999"}) {
    const Result r = run({kCli, "--no-mps", "-n", bad, "touch", marker});
    EXPECT_TRUE(FailedWithOneLine(r)) << bad << ": " << r;
    EXPECT_FALSE(exists(marker)) << bad;
  }
  const Result r = run({kCli, "--no-mps", "-n", "9", "touch", marker});
  EXPECT_NE(r.err.find("device 0 has 8 TPCs"), std::string::npos) << r;
}

TEST_F(Sharing, ExclusiveRefusesOverlapAndSharedGpcsAreNamed) {
  const long a = start_task({"-t", "0,2"}, "a");
  ASSERT_GT(a, 0);
  // Overlap: refused under --exclusive, at launch and on -p.
  const std::string marker = path("marker");
  Result r = run({kCli, "--no-mps", "--exclusive", "-t", "2-3", "touch", marker});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("TPCs 2 of device 0 are held by pid " + std::to_string(a)), std::string::npos) << r;
  EXPECT_FALSE(exists(marker));
  const long b = start_task({"-t", "4"}, "b");
  ASSERT_GT(b, 0);
  // TPC 4 shares GPC 0 with a: said at launch, with a same-size list in a GPC no one uses.
  const Proc& pb = *tasks_.back();
  EXPECT_NE(pb.err().find("TPCs 4 of device 0 share GPC 0 with pid " + std::to_string(a)), std::string::npos)
      << pb.err();
  EXPECT_NE(pb.err().find("GPCs no other task uses hold the same size: -t 1"), std::string::npos) << pb.err();
  r = run({kCli, "-p", "--exclusive", "-t", "0", std::to_string(b)});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_EQ(run({kCli, "-p", std::to_string(b)}).out, pid_line(b, "current TPC list", "4"));
  // Its own TPCs never count against a task: -p --exclusive to a superset of them.
  r = run({kCli, "-p", "--exclusive", "-t", "4,6", std::to_string(b)});
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  // --status marks the pair.
  const Result st = run({kCli, "--status"});
  EXPECT_TRUE(ExitedWith(st, 0)) << st;
  EXPECT_NE(st.out.find("share a GPC: each hosts smaller thread-block clusters than whole GPCs"), std::string::npos) << st.out;
  stop_all();
}

TEST_F(Sharing, LiveCountKeepsTheTpcsTheTaskHas) {
  const long a = start_task({"-g", "0"}, "a");
  ASSERT_GT(a, 0);
  const Result r = run({kCli, "-p", "-n", "2", std::to_string(a)});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  // A change answers in the terms of the new value (a TPC list).
  EXPECT_EQ(r.out, pid_line(a, "current TPC list", "0,2,4,6") + pid_line(a, "new TPC list", "0,2")) << r;
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2}));
  stop_all();
}

TEST_F(Sharing, StatusListsEveryTaskOfEveryUserWithCountersForTheOwner) {
  const long a = start_task({"-n", "4"}, "a");
  // Task b is started by a path far longer than any column (as from a deep
  // checkout): the table still shows its program's name, and --json the
  // whole command line, wherever the tests run from.
  const std::string deep = path(std::string(120, 'd') + "/" + std::string(120, 'e'));
  fs::create_directories(deep);
  const std::string long_launcher = deep + "/launcher";
  fs::create_symlink(kLauncher, long_launcher);
  const long b = start_task({"-t", "1,3"}, "b", nullptr, {}, long_launcher);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["tasks"].size(), 2u) << st.out;
  EXPECT_EQ(j["tasks"][0]["pid"], a);
  EXPECT_EQ(j["tasks"][0]["tpcs"], "0,2,4,6");
  EXPECT_EQ(j["tasks"][0]["gpcs"], "0");
  EXPECT_EQ(j["tasks"][0]["gpcs_whole"], 1);
  EXPECT_EQ(j["tasks"][0]["sms"], 8);
  EXPECT_GT(j["tasks"][0]["kernels_launched"].get<long>(), 0);
  EXPECT_EQ(j["tasks"][1]["pid"], b);
  EXPECT_EQ(j["tasks"][1]["gpcs_whole"], 0);
  const std::string whole = long_launcher + " --until-file " + path("until") + " --interval-ms 5 --ready-file " +
                            path("ready.b");
  EXPECT_EQ(j["tasks"][1]["command"], whole) << st.out;
  EXPECT_EQ(j["tasks"][1]["argv"][0], long_launcher) << st.out;
  st = run({kCli, "--status"});
  EXPECT_NE(st.out.find("PID"), std::string::npos);
  EXPECT_NE(st.out.find(std::to_string(a) + "  "), std::string::npos) << st.out;
  // The table: the program's name and its first arguments, on one line.
  bool named = false;
  for (const auto& l : lines_of(st.out))
    if (l.starts_with(std::to_string(b) + " ")) {
      named = l.find("  launcher --until-file ") != std::string::npos;
      EXPECT_LT(l.size(), 200u) << l;
    }
  EXPECT_TRUE(named) << st.out;
  // Another user sees both partitions, not the owner's counters.
  if (const auto other = second_user()) {
    const Result o = run(as_user(*other, {kCli, "--status", "--json"}));
    ASSERT_TRUE(ExitedWith(o, 0)) << o;
    const auto oj = nlohmann::json::parse(o.out);
    ASSERT_EQ(oj["tasks"].size(), 2u) << o.out;
    EXPECT_EQ(oj["tasks"][0]["tpcs"], "0,2,4,6");
    EXPECT_FALSE(oj["tasks"][0].contains("kernels_launched")) << o.out;
  }
  stop_all();
  // Ended tasks never show, and their entries are cleaned.
  st = run({kCli, "--status", "--json"});
  EXPECT_EQ(nlohmann::json::parse(st.out)["tasks"].size(), 0u) << st.out;
  std::size_t left = 0;
  for (const auto& f : fs::directory_iterator(path("status")))
    left += f.path().filename().string().starts_with("nvtaskset-status.");
  EXPECT_EQ(left, 0u);
}

TEST_F(Sharing, NoUserCanForgeOrHideAnotherUsersEntry) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  const long a = start_task({"-t", "0-1"}, "a");
  ASSERT_GT(a, 0);
  // The other user copies root's entry under its own name, claiming root's
  // task sits on TPCs 6-7, and tries to remove root's entry.
  std::string mine;
  for (const auto& f : fs::directory_iterator(path("status")))
    if (f.path().filename().string().starts_with("nvtaskset-status." + std::to_string(a) + "."))
      mine = f.path().string();
  ASSERT_FALSE(mine.empty());
  std::string text = read_file(mine);
  const std::string forged = path("status") + "/nvtaskset-status." + std::to_string(a) + ".00000000deadbeef";
  const Result w = run(as_user(*other, {"sh", "-c", "sed 's/,0x[0-9a-f]*,0x3,/,0x1,0xc0,/' " + mine + " > " + forged +
                                                        "; touch -d '+1 hour' " + forged + "; rm -f " + mine}));
  EXPECT_TRUE(exists(mine)) << "another user removed the entry";
  const Result st = run({kCli, "--status", "--json"});
  const auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j["tasks"].size(), 1u) << st.out;
  EXPECT_EQ(j["tasks"][0]["tpcs"], "0-1") << st.out;
  // And a -n chooser is not fooled either: TPCs 0-1 are the ones taken.
  const Result r = run({kCli, "--no-mps", "--exclusive", "-t", "1", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  (void)w;
  stop_all();
}

TEST_F(Sharing, AllTasksMovesTheTaskAndItsChildren) {
  Proc* p = nullptr;
  const long pid = start_task({"-t", "0-1"}, "a", &p, {"--fork"});
  ASSERT_GT(pid, 0);
  const long child = wait_ready(path("ready.a") + ".child", *p);
  ASSERT_GT(child, 0);
  Result q = run({kCli, "-a", "-p", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-1") + pid_line(child, "current TPC list", "0-1")) << q;
  q = run({kCli, "-a", "-p", "-t", "6", std::to_string(pid)});
  ASSERT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.out, pid_line(pid, "current TPC list", "0-1") + pid_line(pid, "new TPC list", "6") +
                       pid_line(child, "current TPC list", "0-1") + pid_line(child, "new TPC list", "6"))
      << q;
  const std::size_t before = records().size();
  for (const auto& rec : records_after(child, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({6})) << rec;
  for (const auto& rec : records_after(pid, before, 1, 3)) EXPECT_EQ(rec.mask, hopper_disable({6})) << rec;
  // The child holds TPC 6 too, but it is the task's own: no "held by" warning.
  q = run({kCli, "-p", "--exclusive", "-t", "6,7", std::to_string(pid)});
  EXPECT_TRUE(ExitedWith(q, 0)) << q;
  EXPECT_EQ(q.err.find("held by"), std::string::npos) << q;
  // Without -a only the task moves.
  EXPECT_EQ(run({kCli, "-p", std::to_string(child)}).out, pid_line(child, "current TPC list", "6"));
  EXPECT_TRUE(FailedWithOneLine(run({kCli, "-a", "-t", "1", "true"})));
  stop_all();
}

// Launches that choose at the same moment never end up sharing TPCs unseen,
// and no lock serialises them (a lock in /dev/shm is one any user could hold
// forever). Each one publishes its choice, reads the status again and, when
// an entry that appeared meanwhile shares its TPCs or GPCs, takes its entry
// back and chooses again. NVTASKSET_CLAIM_DELAY_MS holds every launch between
// its snapshot and its first publish, so they all first choose from the same
// empty status: the same TPCs.
class Racing : public Sharing {
 protected:
  struct Outcome {
    Proc* proc;
    long pid;  // -1: did not start
  };
  std::vector<Outcome> launch_together(const std::vector<std::string>& options, int n) {
    Env env = env_;
    env["NVTASKSET_CLAIM_DELAY_MS"] = "300";
    std::vector<Outcome> out;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv{kCli, "--no-mps"};
      argv.insert(argv.end(), options.begin(), options.end());
      argv.insert(argv.end(), {kLauncher, "--until-file", path("until"), "--interval-ms", "5", "--ready-file",
                               path("ready.r" + std::to_string(i))});
      out.push_back({&start(argv, env), -1});
    }
    for (int i = 0; i < n; ++i) {
      out[i].pid = wait_ready(path("ready.r" + std::to_string(i)), *out[i].proc);
      if (out[i].pid > 0) tasks_.push_back(out[i].proc);
    }
    return out;
  }
  // "0,2,4-6" -> {0, 2, 4, 5, 6}, as --status writes lists.
  static std::vector<unsigned> expand(const std::string& list) {
    std::vector<unsigned> out;
    std::istringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
      const auto dash = item.find('-');
      const unsigned lo = static_cast<unsigned>(std::stoul(item.substr(0, dash)));
      const unsigned hi = dash == std::string::npos ? lo : static_cast<unsigned>(std::stoul(item.substr(dash + 1)));
      for (unsigned k = lo; k <= hi; ++k) out.push_back(k);
    }
    return out;
  }
  // TPCs each started task is listed with, checked against the mask its
  // kernels get.
  std::map<long, std::vector<unsigned>> listed_and_applied(const std::vector<Outcome>& started) {
    const Result st = run({kCli, "--status", "--json"});
    EXPECT_TRUE(ExitedWith(st, 0)) << st;
    std::map<long, std::vector<unsigned>> out;
    const auto j = nlohmann::json::parse(st.out);
    for (const auto& t : j["tasks"]) out[t["pid"].get<long>()] = expand(t["tpcs"].get<std::string>());
    for (const Outcome& o : started) {
      if (o.pid < 0) continue;
      EXPECT_TRUE(out.count(o.pid)) << o.pid << " is not listed: " << st.out;
      EXPECT_EQ(mask_of(o.pid), hopper_disable(out[o.pid])) << o.pid;
    }
    return out;
  }
};

TEST_F(Racing, ExclusiveChoicesAtTheSameMomentAreDisjointOrRefused) {
  const auto outcomes = launch_together({"--exclusive", "-n", "2"}, 4);
  int started = 0;
  for (const Outcome& o : outcomes) {
    if (o.pid > 0) {
      ++started;
      continue;
    }
    // Refused: one line, no kernel.
    EXPECT_TRUE(FailedWithOneLine(o.proc->wait())) << o.proc->result;
  }
  EXPECT_GE(started, 1);
  const auto tpcs = listed_and_applied(outcomes);
  std::set<unsigned> seen;
  for (const Outcome& o : outcomes) {
    if (o.pid < 0) continue;
    for (unsigned k : tpcs.at(o.pid)) EXPECT_TRUE(seen.insert(k).second) << "TPC " << k << " taken twice";
  }
  stop_all();
}

TEST_F(Racing, CountChoicesAtTheSameMomentShareTpcsOnlyWhenTheySaySo) {
  const auto outcomes = launch_together({"-n", "2"}, 3);
  for (const Outcome& o : outcomes) ASSERT_GT(o.pid, 0) << o.proc->err();
  const auto tpcs = listed_and_applied(outcomes);
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    for (std::size_t j = 0; j < outcomes.size(); ++j) {
      if (i == j) continue;
      const auto& a = tpcs.at(outcomes[i].pid);
      const auto& b = tpcs.at(outcomes[j].pid);
      std::vector<unsigned> common;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
      if (common.empty()) continue;
      // 8 TPCs hold three pairs: sharing is only ever the last resort, and said.
      const std::string said = outcomes[i].proc->err() + outcomes[j].proc->err();
      EXPECT_NE(said.find("share"), std::string::npos) << outcomes[i].pid << " and " << outcomes[j].pid;
    }
  stop_all();
}

// The same for two live changes: each publishes the task's new partition,
// reads again, and on a race republishes what the task's region still holds
// and chooses again.
TEST_F(Racing, LiveChangesAtTheSameMomentAreDisjointOrRefused) {
  const long a = start_task({"-t", "7"}, "a");
  const long b = start_task({"-t", "6"}, "b");
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Env env = env_;
  env["NVTASKSET_CLAIM_DELAY_MS"] = "300";
  Proc& pa = start({kCli, "-p", "--exclusive", "-n", "3", std::to_string(a)}, env);
  Proc& pb = start({kCli, "-p", "--exclusive", "-n", "3", std::to_string(b)}, env);
  const Result ra = pa.wait(), rb = pb.wait();
  for (const Result* r : {&ra, &rb})
    EXPECT_TRUE(ExitedWith(*r, 0) || FailedWithOneLine(*r)) << *r;
  EXPECT_TRUE(ExitedWith(ra, 0) || ExitedWith(rb, 0)) << ra << rb;
  const auto tpcs = listed_and_applied({{&pa, a}, {&pb, b}});
  std::vector<unsigned> common;
  std::set_intersection(tpcs.at(a).begin(), tpcs.at(a).end(), tpcs.at(b).begin(), tpcs.at(b).end(),
                        std::back_inserter(common));
  EXPECT_TRUE(common.empty()) << "TPC " << common.front() << " held by both";
  EXPECT_EQ(tpcs.at(a).size(), ExitedWith(ra, 0) ? 3u : 1u);
  EXPECT_EQ(tpcs.at(b).size(), ExitedWith(rb, 0) ? 3u : 1u);
  stop_all();
}

// Another user's files in the status directory block no one: a lock held on
// the name an older nvtaskset locked, a FIFO and a directory named like
// entries.
TEST_F(Sharing, AnotherUsersFilesInTheStatusDirectoryBlockNoChoice) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  const std::string dir = path("status");
  Proc& squatter = start(as_user(*other, {"sh", "-c",
                                          "mkfifo " + dir + "/nvtaskset-status.1.0000000000000001 && mkdir " + dir +
                                              "/nvtaskset-status.2.0000000000000002 && exec flock " + dir +
                                              "/nvtaskset-status.lock sleep 30"}));
  ASSERT_TRUE(wait_until([&] { return exists(dir + "/nvtaskset-status.lock"); })) << squatter.err();
  const auto t0 = std::chrono::steady_clock::now();
  const long a = start_task({"--exclusive", "-n", "4"}, "a");
  ASSERT_GT(a, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(mask_of(a), hopper_disable({0, 2, 4, 6}));
  EXPECT_TRUE(ExitedWith(run({kCli, "-p", "--exclusive", "-n", "3", std::to_string(a)}), 0));
  ::kill(-squatter.pid, SIGKILL);
  squatter.wait();
  stop_all();
}

// A child forked without exec that uses the GPU (its own cuInit) is listed
// by --status with its own entry, which follows `-p` on it; a child that
// never initialises CUDA is not listed.
TEST_F(Sharing, StatusListsAForkedChildThatUsesTheGpu) {
  Proc* p = nullptr;
  const long pid = start_task({"-t", "0-1"}, "a", &p, {"--fork"});
  ASSERT_GT(pid, 0);
  const long child = wait_ready(path("ready.a") + ".child", *p);
  ASSERT_GT(child, 0);
  auto listed = [&] {
    const Result st = run({kCli, "--status", "--json"});
    EXPECT_TRUE(ExitedWith(st, 0)) << st;
    std::map<long, std::string> out;
    const auto j = nlohmann::json::parse(st.out);
    for (const auto& t : j["tasks"]) out[t["pid"].get<long>()] = t["tpcs"];
    return out;
  };
  auto m = listed();
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m[pid], "0-1");
  EXPECT_EQ(m[child], "0-1");
  ASSERT_TRUE(ExitedWith(run({kCli, "-p", "-t", "6", std::to_string(child)}), 0));
  m = listed();
  EXPECT_EQ(m[pid], "0-1");
  EXPECT_EQ(m[child], "6");
  // -n now avoids the child's TPC too: 5 free of 8 (0, 1 and 6 held).
  const Result r = run({kCli, "--no-mps", "--exclusive", "-n", "6", "true"});
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_NE(r.err.find("only 5 of 8 TPCs"), std::string::npos) << r;
  stop_all();
  EXPECT_TRUE(listed().empty());
}

// A child forked without exec that never touches CUDA (a data-loader worker)
// keeps the partition but is not listed.
TEST_F(Sharing, AForkedChildWithoutCudaIsNotListed) {
  const long pid = start_task({"-t", "0-1"}, "a", nullptr, {"--spawn", "sleep", "1"});
  ASSERT_GT(pid, 0);
  const Result st = run({kCli, "--status", "--json"});
  ASSERT_TRUE(ExitedWith(st, 0)) << st;
  const auto tasks = nlohmann::json::parse(st.out)["tasks"];
  ASSERT_EQ(tasks.size(), 1u) << st.out;
  EXPECT_EQ(tasks[0]["pid"], pid);
  stop_all();
}

// MPS serves one user at a time: a task that would wait behind another
// user's clients is told so, and NVTASKSET_MPS_OTHER_USER=fail refuses it.
// An MPS client gets a plain process's 8 kernel queues (2 otherwise
// serialise its streams) and 2 copy queues (each queue costs start-up time;
// copy pipelines ran as fast with 2 as with 4; measured on an H100,
// docs/hardware.md "MPS"), unless the user chose either number.
TEST_F(E2E, EnvironmentOfAnMpsClient) {
  Env env = env_;
  env["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env["FAKE_MPS_IDLE_MS"] = "20000";
  const std::string conn = "CUDA_DEVICE_MAX_CONNECTIONS";
  const std::string copy = "CUDA_DEVICE_MAX_COPY_CONNECTIONS";
  auto launch = [&](const Env& e) {
    return run({kCli, "-t", "0", kLauncher, "--print-env", conn, "--print-env", copy}, e);
  };
  Result r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "8") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "2") << r;
  // The user's number of connections also sets the copy queues, in CUDA:
  // nvtaskset adds no copy setting of its own beside it.
  env[conn] = "2";
  r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "2") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "<unset>") << r;
  // The user's copy queues are kept; the kernels still get 8.
  env.erase(conn);
  env[copy] = "1";
  r = launch(env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(printed_env(r.out, conn).value_or("<unset>"), "8") << r;
  EXPECT_EQ(printed_env(r.out, copy).value_or("<unset>"), "1") << r;
  Proc& q = start({"sh", "-c", "echo quit | \"$0\"", kFakeMps}, env);
  q.wait();
}

TEST_F(E2E, AnotherUsersMpsServerIsNamedNeverWaitedForSilently) {
  const auto other = second_user();
  if (!other) GTEST_SKIP() << "needs root to create a second Unix user (CI runs as root)";
  Proc& server = start(as_user(*other, {"sleep", "30"}));  // stands for the server the daemon runs for them
  ASSERT_TRUE(wait_until([&] { return fs::exists("/proc/" + std::to_string(server.pid)); }));
  Env env = env_;
  env["NVTASKSET_MPS_CONTROL"] = kFakeMps;
  env["FAKE_MPS_SERVERS"] = std::to_string(server.pid) + ":3";
  env["FAKE_MPS_IDLE_MS"] = "20000";
  const std::string marker = path("marker");
  Result r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(exists(marker));
  EXPECT_NE(r.err.find("serves user nvtaskset-e2e with 3 clients: this task waits until they exit"),
            std::string::npos)
      << r;
  ::unlink(marker.c_str());
  // An unknown value is said, and the default (wait) applies.
  env["NVTASKSET_MPS_OTHER_USER"] = "bogus";
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_NE(r.err.find("NVTASKSET_MPS_OTHER_USER=bogus: unknown value (wait|fail); using wait"), std::string::npos)
      << r;
  ::unlink(marker.c_str());
  env["NVTASKSET_MPS_OTHER_USER"] = "FAIL";  // any case, as every choice option
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(FailedWithOneLine(r)) << r;
  EXPECT_FALSE(exists(marker));
  // --status shows the server and whom it serves.
  const Result st = run({kCli, "--status"}, env);
  EXPECT_NE(st.out.find("mps: server pid " + std::to_string(server.pid) + " serves user nvtaskset-e2e, 3 clients"),
            std::string::npos)
      << st;
  // Our own user's server is no reason to warn.
  env["FAKE_MPS_SERVERS"] = std::to_string(::getpid()) + ":1";
  Proc& q = start({"sh", "-c", "echo quit | \"$0\"", kFakeMps}, env);
  q.wait();
  env.erase("NVTASKSET_MPS_OTHER_USER");
  r = run({kCli, "-t", "0-1", "touch", marker}, env);
  EXPECT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_EQ(r.err.find("serves user"), std::string::npos) << r;
  Proc& q2 = start({"sh", "-c", "echo quit | \"$0\"", kFakeMps}, env);
  q2.wait();
}
