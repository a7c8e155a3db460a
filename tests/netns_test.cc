// Two "hosts": a Gloo group whose ranks live in two network namespaces joined by a veth pair,
// meeting through the TCP store that rank 0 hosts on its own address. Skipped, saying why,
// where namespaces cannot be made (not root, no `ip`).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <thread>
#include <tuple>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// Runs a shell command; returns its exit status and output.
std::pair<int, std::string> sh(const std::string& command) {
  std::string output;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) output += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// Whether `path` appears within 60 s.
bool eventually_file(const std::string& path) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "creating network namespaces needs root";
    const std::string id = std::to_string(::getpid() % 100000);
    ns_a_ = "tutti-a-" + id;
    ns_b_ = "tutti-b-" + id;
    veth_a_ = "tva" + id;
    veth_b_ = "tvb" + id;
    for (const std::string& cmd : {
             "ip netns add " + ns_a_,
             "ip netns add " + ns_b_,
             "ip link add " + veth_a_ + " type veth peer name " + veth_b_,
             "ip link set " + veth_a_ + " netns " + ns_a_,
             "ip link set " + veth_b_ + " netns " + ns_b_,
             "ip -n " + ns_a_ + " addr add " + addr_a_ + "/24 dev " + veth_a_,
             "ip -n " + ns_b_ + " addr add " + addr_b_ + "/24 dev " + veth_b_,
             "ip -n " + ns_a_ + " link set " + veth_a_ + " up",
             "ip -n " + ns_b_ + " link set " + veth_b_ + " up",
             "ip -n " + ns_a_ + " link set lo up",
             "ip -n " + ns_b_ + " link set lo up",
         }) {
      auto [rc, out] = sh(cmd);
      if (rc != 0) GTEST_SKIP() << "cannot make the two hosts (" << cmd << "): " << out;
    }
    made_ = true;
  }

  void TearDown() override {
    if (ns_a_.empty()) return;
    sh("ip netns del " + ns_a_);  // takes its end of the veth pair with it
    sh("ip netns del " + ns_b_);
    for (const std::string& ns : {ns_a_, ns_b_}) sh("rm -rf /etc/netns/" + ns);
  }

  // /etc/<file> as namespace `ns`'s processes see it (`ip netns exec` mounts /etc/netns/<ns>/*
  // over /etc); removed with the namespace.
  void etc_file(const std::string& ns, const std::string& file, const std::string& text) {
    const std::string dir = "/etc/netns/" + ns;
    ::mkdir("/etc/netns", 0755);
    ::mkdir(dir.c_str(), 0755);
    std::ofstream(dir + "/" + file) << text;
  }
  void hosts_file(const std::string& ns, const std::string& lines) {
    etc_file(ns, "hosts", "127.0.0.1 localhost\n" + lines);
  }

  // transfer_worker's owner on host A, listening on (and publishing) the name `tcp_host`.
  WorkerResult owner_named(const std::string& dir, const std::string& tcp_host) {
    return run_command({"ip", "netns", "exec", ns_a_, "env", "TUTTI_GLOO_HOSTNAME=" + addr_a_,
                        TUTTI_TRANSFER_WORKER, "owner", dir, tcp_host},
                       milliseconds(90000));
  }
  // transfer_worker's fetch on host B, its gets with this timeout (ms; "0": the default).
  WorkerResult fetch_on_b(const std::string& dir, const std::string& get_timeout_ms) {
    return run_command({"ip", "netns", "exec", ns_b_, "env", "TUTTI_GLOO_HOSTNAME=" + addr_b_,
                        TUTTI_TRANSFER_WORKER, "fetch", dir, get_timeout_ms},
                       milliseconds(60000));
  }

  // A worker scenario as `rank` of 2 inside namespace `ns`, binding `addr`; `extra_env`: more
  // NAME=value for it.
  WorkerResult rank_in(const std::string& ns, int rank, const std::string& addr,
                       const std::string& scenario = "env_allreduce",
                       const std::string& ready_dir = "",
                       const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> argv = {
        "ip", "netns", "exec", ns, "env", "TUTTI_RANK=" + std::to_string(rank),
        "TUTTI_WORLD_SIZE=2", "TUTTI_STORE=tcp://" + addr_a_ + ":29611", "TUTTI_JOB_ID=two-hosts",
        "TUTTI_GLOO_HOSTNAME=" + addr,
        // Separate hosts as far as tutti can tell (so "auto" picks Gloo, as on
        // two machines): the namespaces share this kernel and its /dev/shm.
        "TUTTI_HOST_ID=" + ns, "TUTTI_TEST_READY_DIR=" + ready_dir};
    argv.insert(argv.end(), extra_env.begin(), extra_env.end());
    argv.push_back(TUTTI_TEST_WORKER);
    argv.push_back(scenario);
    return run_command(argv, milliseconds(90000));
  }
  // Both ranks run env_until_cut (with `extra_env`); once both are ready, host B's link goes
  // down. Each rank's "CUT after N ms, <code>: <error>" line.
  std::vector<std::string> cut_while_running(const std::vector<std::string>& extra_env) {
    TempDir ready;
    WorkerResult a, b;
    std::thread host_a(
        [&] { a = rank_in(ns_a_, 0, addr_a_, "env_until_cut", ready.path(), extra_env); });
    std::thread host_b(
        [&] { b = rank_in(ns_b_, 1, addr_b_, "env_until_cut", ready.path(), extra_env); });
    // Both ranks have completed an allreduce over the link; now take host B off the network.
    const bool both =
        eventually_file(ready.path() + "/rank0") && eventually_file(ready.path() + "/rank1");
    EXPECT_TRUE(both) << "the ranks never got ready";
    auto [rc, out] = sh("ip -n " + ns_b_ + " link set " + veth_b_ + " down");
    EXPECT_EQ(rc, 0) << out;
    host_a.join();
    host_b.join();
    std::vector<std::string> lines;
    for (const auto* r : {&a, &b}) {
      EXPECT_EQ(r->exit_code, 0) << r->output;
      EXPECT_NE(r->output.find("allreduce #"), std::string::npos) << r->output;
      std::smatch m;
      EXPECT_TRUE(std::regex_search(r->output, m, std::regex("CUT after [^\n]*"))) << r->output;
      lines.push_back(m.empty() ? std::string() : m.str());
      std::printf("%s", r->output.c_str());
    }
    return lines;
  }
  static long cut_after_ms(const std::string& line) {
    std::smatch m;
    return std::regex_search(line, m, std::regex("CUT after ([0-9]+) ms")) ? std::stol(m[1]) : -1;
  }

  // An owner on host a (under the command prefix `owner_env`), and a consumer on host b (under
  // `consumer_env`) getting from it in a loop (transfer_worker `mode`: ucx-loop, socket-loop),
  // each get with this timeout, ms; once a get has succeeded, `fault` strikes (given the exchange
  // directory). Returns the consumer's output, which must say how long its failing get took.
  std::string loop_then(const std::vector<std::string>& owner_env,
                        const std::vector<std::string>& consumer_env, const std::string& mode,
                        const char* get_timeout_ms,
                        const std::function<void(const std::string&)>& fault) {
    TempDir dir;
    WorkerResult owner, loop;
    auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    std::thread host_a([&] {
      owner = run_command(with(owner_env, {TUTTI_TRANSFER_WORKER, "owner", dir.path(), addr_a_}),
                          milliseconds(90000));
    });
    std::thread host_b([&] {
      loop =
          run_command(with(consumer_env, {TUTTI_TRANSFER_WORKER, mode, dir.path(), get_timeout_ms}),
                      milliseconds(90000));
    });
    if (eventually_file(dir.path() + "/getting")) {
      fault(dir.path());
    } else {
      ADD_FAILURE() << "no get succeeded";
    }
    host_b.join();
    std::ofstream(dir.path() + "/done") << "1";  // an owner still alive may go
    host_a.join();
    EXPECT_EQ(loop.exit_code, 0) << loop.output;
    std::printf("%s", loop.output.c_str());
    return loop.output;
  }
  static long failed_after_ms(const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("failed after ([0-9]+) ms"))) {
      ADD_FAILURE() << "no failed get in:\n" << out;
      return -1;
    }
    return std::stol(m[1]);
  }

  std::string ns_a_, ns_b_, veth_a_, veth_b_;
  // Addresses inside the test's own namespaces; no traffic leaves them.
  const std::string addr_a_ = "10.231.7.1";
  const std::string addr_b_ = "10.231.7.2";
  bool made_ = false;
};

TEST_F(TwoHosts, GlooGroupAcrossNamespacesThroughTheTCPStore) {
  ASSERT_TRUE(made_);
  // The two hosts really are apart: host B reaches A only over the veth link.
  auto [rc, out] = sh("ip netns exec " + ns_b_ + " ip route get " + addr_a_);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(veth_b_), std::string::npos) << out;
  WorkerResult b;
  std::thread host_b([&] { b = rank_in(ns_b_, 1, addr_b_); });
  WorkerResult a = rank_in(ns_a_, 0, addr_a_);
  host_b.join();
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(a.output.find("env rank 0 of 2"), std::string::npos) << a.output;
  EXPECT_NE(b.output.find("env rank 1 of 2"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("sum 3"), std::string::npos) << b.output;
  EXPECT_NE(a.output.find("backend 'gloo'"), std::string::npos) << a.output;
}

TEST_F(TwoHosts, CuttingAHostOffFailsBothRanksWithinTheTimeout) {
  ASSERT_TRUE(made_);
  for (const std::string& line : cut_while_running({})) {
    // The failing op ended within its 3 s timeout plus a margin.
    const long ms = cut_after_ms(line);
    EXPECT_GE(ms, 0) << line;
    EXPECT_LT(ms, 3000 + 2000) << line;
  }
}

// With an op timeout of a minute, a cut link is named within its own bound
// (TUTTI_LINK_TIMEOUT_MS, 2 s here), by both ranks: the one whose bytes go unacknowledged and the
// one whose keepalive probes do (util/tcp_link.h). Before the link's watch, both waited out the
// op's minute.
TEST_F(TwoHosts, ACutLinkIsNamedWithinItsBoundNotAtTheOpsTimeout) {
  ASSERT_TRUE(made_);
  for (const std::string& line :
       cut_while_running({"TUTTI_TEST_OP_TIMEOUT_MS=60000", "TUTTI_LINK_TIMEOUT_MS=2000"})) {
    const long ms = cut_after_ms(line);
    EXPECT_GE(ms, 0) << line;
    // The bound, a poll's slice (a quarter of it) and a keepalive probe's second of rounding.
    EXPECT_LT(ms, 2000 + 500 + 1000 + 1000) << line;
    EXPECT_NE(line.find("I/O error"), std::string::npos) << line;
    EXPECT_NE(line.find("the link or the host is gone"), std::string::npos) << line;
    EXPECT_NE(line.find("rank "), std::string::npos) << line;
  }
}

// The direct transport between the two hosts: a one-host transport (shm) is refused naming the
// fallback, the fallback and the socket transport carry the bytes over the veth link, and so does
// the two-sided gloo transport over the agents' group (its store hosted by host A).
TEST_F(TwoHosts, DirectTransportFallsBackToTheSocketAcrossHosts) {
  ASSERT_TRUE(made_);
  TempDir dir;
  const std::string group_store = "tcp://" + addr_a_ + ":29612";
  WorkerResult owner;
  std::thread host_a([&] {
    owner = run_command({"ip", "netns", "exec", ns_a_, "env", "TUTTI_GLOO_HOSTNAME=" + addr_a_,
                         "TUTTI_RDT_GROUP_STORE=" + group_store, TUTTI_TRANSFER_WORKER, "owner",
                         dir.path(), addr_a_},
                        milliseconds(90000));
  });
  WorkerResult fetch = run_command(
      {"ip", "netns", "exec", ns_b_, "env", "TUTTI_GLOO_HOSTNAME=" + addr_b_,
       "TUTTI_RDT_GROUP_STORE=" + group_store, TUTTI_TRANSFER_WORKER, "fetch", dir.path()},
      milliseconds(60000));
  host_a.join();
  EXPECT_EQ(owner.exit_code, 0) << owner.output;
  EXPECT_EQ(fetch.exit_code, 0) << fetch.output;
  EXPECT_NE(fetch.output.find("transport 'shm' works on one host"), std::string::npos)
      << fetch.output;
  EXPECT_NE(fetch.output.find("allow_fallback"), std::string::npos) << fetch.output;
  EXPECT_NE(fetch.output.find("fallback: ok (socket, then socket)"), std::string::npos)
      << fetch.output;
  EXPECT_NE(fetch.output.find("socket: ok"), std::string::npos) << fetch.output;
  EXPECT_NE(fetch.output.find("gloo: ok"), std::string::npos) << fetch.output;
  // A warm get of a small object across the link takes network time (~40 us here), never a
  // delayed ACK's 40 ms.
  const auto at = fetch.output.find("socket warm get median: ");
  ASSERT_NE(at, std::string::npos) << fetch.output;
  EXPECT_LT(std::atof(fetch.output.c_str() + at + 24), 10000.0) << fetch.output;
  std::printf("%s", fetch.output.c_str());
}

// An owner that publishes a host name (not an address) which the consumer's host resolves to two
// addresses, the first refusing (its own loopback): the consumer's connect goes on to the second.
// Each namespace reads its own /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over it).
// Before, only the first address was tried and every get failed.
TEST_F(TwoHosts, AnOwnersNameWithTwoAddressesIsReachedByTheSecond) {
  ASSERT_TRUE(made_);
  const std::string name = "tutti-owner-" + ns_a_;
  hosts_file(ns_a_, addr_a_ + " " + name + "\n");
  hosts_file(ns_b_, "127.0.0.1 " + name + "\n" + addr_a_ + " " + name + "\n");
  auto [rc, order] = sh("ip netns exec " + ns_b_ + " getent ahostsv4 " + name);
  EXPECT_EQ(rc, 0) << order;
  // The refusing address comes first, or the test shows nothing.
  EXPECT_EQ(order.rfind("127.0.0.1", 0), 0u) << order;
  TempDir dir;
  WorkerResult owner;
  std::thread host_a([&] { owner = owner_named(dir.path(), name); });
  WorkerResult fetch = fetch_on_b(dir.path(), "0");
  host_a.join();
  EXPECT_EQ(owner.exit_code, 0) << owner.output;
  EXPECT_EQ(fetch.exit_code, 0) << fetch.output;
  EXPECT_NE(fetch.output.find("socket: ok"), std::string::npos) << fetch.output;
  std::printf("%s", fetch.output.c_str());
}

// An owner's name that the consumer's host must ask a name server for, and the server answers
// nothing (an address on the link nobody has, asked once for 30 s): the consumer's get fails at
// its own timeout (1.5 s), saying the name service gave no answer. Before, the lookup held the get
// past its timeout for the resolver's 30 s.
TEST_F(TwoHosts, AGetWhoseOwnerNameNoServerAnswersEndsAtItsTimeout) {
  ASSERT_TRUE(made_);
  const std::string name = "tutti-owner-" + ns_a_ + ".invalid";
  hosts_file(ns_a_, addr_a_ + " " + name + "\n");
  hosts_file(ns_b_, "");
  etc_file(ns_b_, "resolv.conf", "nameserver 10.231.7.99\noptions timeout:30 attempts:1\n");
  etc_file(ns_b_, "nsswitch.conf", "hosts: files dns\n");
  // Its queries go to a link-layer address nobody has: dropped, never refused (without this entry
  // the failed ARP answers "unreachable" after 3 s).
  auto [rc, out] =
      sh("ip -n " + ns_b_ + " neigh replace 10.231.7.99 lladdr 02:00:00:00:00:99 dev " + veth_b_ +
         " nud permanent");
  ASSERT_EQ(rc, 0) << out;
  TempDir dir;
  WorkerResult owner;
  std::thread host_a([&] { owner = owner_named(dir.path(), name); });
  // The owner is up before the consumer starts: its start is not part of the time measured.
  const bool ready = eventually_file(dir.path() + "/ready");
  const auto start = std::chrono::steady_clock::now();
  WorkerResult fetch = fetch_on_b(dir.path(), "1500");
  const auto took =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start).count();
  // Without the name server (files only), the name is not found at once: this side's failure,
  // which must not blame the owner.
  etc_file(ns_b_, "nsswitch.conf", "hosts: files\n");
  WorkerResult unknown = fetch_on_b(dir.path(), "1500");
  std::ofstream(dir.path() + "/done") << "1";
  host_a.join();
  EXPECT_TRUE(ready);
  EXPECT_EQ(owner.exit_code, 0) << owner.output;
  // The fallback get (timeout 1.5 s) fails, and the worker with it.
  EXPECT_NE(fetch.exit_code, 0) << fetch.output;
  EXPECT_NE(fetch.output.find("the name service gave no answer before the deadline"),
            std::string::npos)
      << fetch.output;
  // The get's 1.5 s, and the worker's start and agent around it (slower under the sanitizers);
  // before, the resolver's 30 s.
  EXPECT_LT(took, 1500 + 5000) << fetch.output;
  EXPECT_NE(unknown.exit_code, 0) << unknown.output;
  EXPECT_NE(unknown.output.find("cannot be reached from this process: cannot resolve " + name),
            std::string::npos)
      << unknown.output;
  EXPECT_EQ(unknown.output.find("destroyed"), std::string::npos) << unknown.output;
  std::printf("consumer ended after %lld ms:\n%s", static_cast<long long>(took),
              fetch.output.c_str());
}

// A consumer getting 16 MiB over the socket transport in a loop, each get with a minute's
// timeout, from an owner whose host is cut off: the get in flight fails within the link's bound
// (TUTTI_LINK_TIMEOUT_MS, 2 s here), naming the cut. Before the link's watch it took the minute.
TEST_F(TwoHosts, AGetFromAHostCutOffFailsWithinTheLinksBound) {
  ASSERT_TRUE(made_);
  auto on = [](const std::string& ns, const std::string& addr) {
    return std::vector<std::string>{"ip",
                                    "netns",
                                    "exec",
                                    ns,
                                    "env",
                                    "TUTTI_LINK_TIMEOUT_MS=2000",
                                    "TUTTI_GLOO_HOSTNAME=" + addr};
  };
  const std::string out = loop_then(
      on(ns_a_, addr_a_), on(ns_b_, addr_b_), "socket-loop", "60000",
      [&](const std::string&) { sh("ip -n " + ns_a_ + " link set " + veth_a_ + " down"); });
  const long ms = failed_after_ms(out);
  EXPECT_GE(ms, 0) << out;
  EXPECT_LT(ms, 2000 + 1000 + 1000 + 1000) << out;  // the bound, a wait's slice, probe rounding
  EXPECT_NE(out.find("(I/O error)"), std::string::npos) << out;
  EXPECT_NE(out.find("the link or the host is gone"), std::string::npos) << out;
}

#ifdef TUTTI_UCX_PLUGIN
// The ucx transport (a plugin, loaded by TUTTI_PLUGINS) between the two hosts, over TCP on the
// veth link: a tensor and 1000 views of one buffer arrive right; an owner SIGKILLed in the middle
// of the consumer's gets fails the get being made (never a hang, never wrong bytes); a host cut
// off fails it at its timeout.
class TwoHostsUcx : public TwoHosts {
 protected:
  std::vector<std::string> env(const std::string& ns, const std::string& addr) const {
    return {"ip",
            "netns",
            "exec",
            ns,
            "env",
            "TUTTI_PLUGINS=ucx",
            std::string("TUTTI_PLUGIN_PATH=") + TUTTI_UCX_PLUGIN,
            "UCX_TLS=tcp",
            "TUTTI_GLOO_HOSTNAME=" + addr};
  }
  std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  // The owner worker on host a under `owner_env` (a command prefix: env(), or one of its own),
  // and the worker `mode` (then `args`) on host b under `consumer_env`; both must exit 0. The
  // consumer's output.
  std::string owner_and(const std::vector<std::string>& owner_env,
                        const std::vector<std::string>& consumer_env, const std::string& mode,
                        const std::vector<std::string>& args = {}) {
    TempDir dir;
    WorkerResult owner;
    std::thread host_a([&] {
      owner = run_command(with(owner_env, {TUTTI_TRANSFER_WORKER, "owner", dir.path(), addr_a_}),
                          milliseconds(90000));
    });
    WorkerResult consumer =
        run_command(with(consumer_env, with({TUTTI_TRANSFER_WORKER, mode, dir.path()}, args)),
                    milliseconds(60000));
    host_a.join();
    EXPECT_EQ(owner.exit_code, 0) << owner.output;
    EXPECT_EQ(consumer.exit_code, 0) << consumer.output;
    return consumer.output;
  }
  // The fetch worker's output (its gets take `get_timeout_ms` where given).
  std::string owner_and_fetch(const std::vector<std::string>& owner_env,
                              const std::vector<std::string>& fetch_env,
                              const std::string& get_timeout_ms = "0") {
    return owner_and(owner_env, fetch_env, "fetch", {get_timeout_ms});
  }
};

TEST_F(TwoHostsUcx, TensorsAndViewsCrossTheLink) {
  ASSERT_TRUE(made_);
  const std::string out = owner_and_fetch(env(ns_a_, addr_a_), env(ns_b_, addr_b_));
  EXPECT_NE(out.find("ucx: ok"), std::string::npos) << out;
  EXPECT_NE(out.find("ucx views: ok"), std::string::npos) << out;
  EXPECT_NE(out.find("socket: ok"), std::string::npos) << out;
  // An shm ref from the other host: the owner published it on ucx when the consumer asked.
  EXPECT_NE(out.find("fallback: ok (ucx, then ucx)"), std::string::npos) << out;
}

// "auto" across hosts where the owner publishes on ucx but its UCX cannot be reached from the
// other host (its UCX_TLS without TCP): the first get fails over ucx and is made again over the
// owner's socket stream, and the consumer asks that owner for ucx no more.
TEST_F(TwoHostsUcx, AUcxThatCannotConnectFallsBackToTheSocketStream) {
  ASSERT_TRUE(made_);
  std::vector<std::string> owner_env = env(ns_a_, addr_a_);
  std::replace(owner_env.begin(), owner_env.end(), std::string("UCX_TLS=tcp"),
               std::string("UCX_TLS=posix,self"));
  const std::string out = owner_and_fetch(owner_env, env(ns_b_, addr_b_));
  EXPECT_NE(out.find("fallback: ok (socket, then socket)"), std::string::npos) << out;
  EXPECT_NE(out.find("take its socket stream, not 'ucx': a get over it failed"), std::string::npos)
      << out;
}

// "auto" across hosts where the owner's UCX listens on ports whose packets host a drops (a
// firewall that drops, not refuses: UCX's connection neither succeeds nor fails): the first get
// over ucx from that owner has half the get's timeout, and the get is made again over the
// socket stream in the other half, not failed at its timeout.
TEST_F(TwoHostsUcx, AUcxWhosePacketsAreDroppedFallsBackHalfwayThroughTheTimeout) {
  ASSERT_TRUE(made_);
  // Host a's UCX listens on ports 40960-41023 (none of its other listeners takes one), and host
  // b's packets to them (0xa000, mask 0xffc0) go to a class whose queue drops everything.
  auto [rc, said] =
      sh("ip netns exec " + ns_a_ + " sysctl -qw net.ipv4.ip_local_reserved_ports=40960-41023");
  if (rc != 0) GTEST_SKIP() << "this kernel cannot reserve host a's UCX ports: " << said;
  const std::string tc = "tc -n " + ns_b_ + " ";
  const std::string dev = " dev " + veth_b_ + " ";
  std::tie(rc, said) =
      sh(tc + "qdisc add" + dev + "root handle 1: htb default 1 && " + tc + "class add" + dev +
         "parent 1: classid 1:1 htb rate 10gbit && " + tc + "class add" + dev +
         "parent 1: classid 1:2 htb rate 10gbit && " + tc + "qdisc add" + dev +
         "parent 1:2 handle 20: blackhole && " + tc + "filter add" + dev +
         "parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff match ip dport 40960 0xffc0 "
         "flowid 1:2");
  if (rc != 0) GTEST_SKIP() << "this kernel cannot drop packets by port with tc: " << said;
  std::vector<std::string> owner_env = env(ns_a_, addr_a_);
  owner_env.push_back("UCX_TCP_PORT_RANGE=40960-41023");
  const std::string out = owner_and_fetch(owner_env, env(ns_b_, addr_b_), "4000");
  EXPECT_NE(out.find("fallback: ok (socket, then socket)"), std::string::npos) << out;
  EXPECT_NE(out.find("not 'ucx': a first get over it did not finish within half"),
            std::string::npos)
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("fallback first get: ([0-9]+) ms"))) << out;
  EXPECT_GE(std::stol(m[1]), 1900) << out;  // ucx had its half (2 s), the stream the rest
  // A ref put on ucx by name goes over ucx: that get fails at its timeout, by name.
  EXPECT_NE(out.find("ucx: failed, code"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

// With TUTTI_TRANSFER_TLS=1 the owner's stream is the private road: "auto" across hosts keeps it
// (UCX's bytes would cross in the clear), while a ref put on ucx by name still goes over ucx; a
// consumer that names ucx (TUTTI_TRANSFER_ACROSS_HOSTS=ucx) asks, and an owner in TLS that does
// not name it refuses.
TEST_F(TwoHostsUcx, InTlsTheFallbackStaysOnTheSocketStream) {
  ASSERT_TRUE(made_);
  const std::vector<std::string> tls = {"TUTTI_TRANSFER_TLS=1", "TUTTI_STORE_SECRET=two-hosts"};
  for (const char* consumer_setting :
       {"TUTTI_TRANSFER_ACROSS_HOSTS=auto", "TUTTI_TRANSFER_ACROSS_HOSTS=ucx"}) {
    const std::string out = owner_and_fetch(
        with(env(ns_a_, addr_a_), tls), with(with(env(ns_b_, addr_b_), tls), {consumer_setting}));
    EXPECT_NE(out.find("fallback: ok (socket, then socket)"), std::string::npos)
        << consumer_setting << "\n"
        << out;
    EXPECT_NE(out.find("ucx: ok"), std::string::npos) << out;
    // Asked only where named, and refused by the owner in TLS.
    EXPECT_EQ(out.find("takes TLS connections") != std::string::npos,
              std::string(consumer_setting).find("=ucx") != std::string::npos)
        << consumer_setting << "\n"
        << out;
  }
}

// "auto" across hosts where only the consumer has ucx: the owner cannot publish on it, and the
// get takes the owner's stream (the consumer does not ask again).
TEST_F(TwoHostsUcx, AnOwnerWithoutUcxServesTheSocketStream) {
  ASSERT_TRUE(made_);
  const std::string out = owner_and_fetch({"ip", "netns", "exec", ns_a_}, env(ns_b_, addr_b_));
  EXPECT_NE(out.find("fallback: ok (socket, then socket)"), std::string::npos) << out;
  EXPECT_NE(out.find("not 'ucx': not at the owner"), std::string::npos) << out;
}

// Four threads getting a 256 KiB object over ucx at once, 100 times each, share the plugin's
// worker and endpoint: every get arrives right, and the median get takes network time beside the
// others (1.1-1.9 ms here, 2.8 under ASan), not a sleep slice's 10 ms as a rule.
TEST_F(TwoHostsUcx, ConcurrentGetsArriveRightAndInNetworkTime) {
  ASSERT_TRUE(made_);
  const std::string out = owner_and(env(ns_a_, addr_a_), env(ns_b_, addr_b_), "ucx-threads");
  ASSERT_NE(out.find(", 0 wrong"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("median ([0-9]+) us"))) << out;
  EXPECT_LT(std::stol(m[1]), 10000) << out;
  std::printf("%s", out.c_str());
}

TEST_F(TwoHostsUcx, AnOwnerKilledMidGetFailsTheGetByName) {
  ASSERT_TRUE(made_);
  const std::string out = loop_then(env(ns_a_, addr_a_), env(ns_b_, addr_b_), "ucx-loop", "20000",
                                    [](const std::string& dir) {
                                      std::ifstream ready(dir + "/ready");
                                      long pid = 0;
                                      ready >> pid;
                                      ASSERT_GT(pid, 0);
                                      ::kill(static_cast<pid_t>(pid), SIGKILL);
                                    });
  EXPECT_LT(failed_after_ms(out), 5000) << out;  // far below the get's 20 s timeout
  EXPECT_NE(out.find("owner-proc"), std::string::npos) << out;
}

TEST_F(TwoHostsUcx, AHostCutOffFailsTheGetAtItsTimeout) {
  ASSERT_TRUE(made_);
  const std::string out = loop_then(
      env(ns_a_, addr_a_), env(ns_b_, addr_b_), "ucx-loop", "3000",
      [&](const std::string&) { sh("ip -n " + ns_a_ + " link set " + veth_a_ + " down"); });
  EXPECT_LT(failed_after_ms(out), 3000 + 2000) << out;
}
#endif

// The socket transport in TLS (TUTTI_TRANSFER_TLS=1, keyed by the shared secret) between two
// hosts: the bytes arrive right; a consumer without TLS is told by the owner why it is refused.
TEST_F(TwoHosts, TheSocketTransportOverTls) {
  ASSERT_TRUE(made_);
  TempDir dir;
  const std::string secret = "TUTTI_STORE_SECRET=two-hosts-secret";
  WorkerResult owner;
  std::thread host_a([&] {
    owner = run_command({"ip", "netns", "exec", ns_a_, "env", "TUTTI_TRANSFER_TLS=1", secret,
                         TUTTI_TRANSFER_WORKER, "owner", dir.path(), addr_a_},
                        milliseconds(90000));
  });
  WorkerResult plain = run_command(
      {"ip", "netns", "exec", ns_b_, "env", secret, TUTTI_TRANSFER_WORKER, "fetch", dir.path()},
      milliseconds(60000));
  WorkerResult tls = run_command({"ip", "netns", "exec", ns_b_, "env", "TUTTI_TRANSFER_TLS=1",
                                  secret, TUTTI_TRANSFER_WORKER, "fetch", dir.path()},
                                 milliseconds(60000));
  host_a.join();
  EXPECT_EQ(owner.exit_code, 0) << owner.output;
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("takes TLS connections only"), std::string::npos) << plain.output;
  EXPECT_EQ(tls.exit_code, 0) << tls.output;
  EXPECT_NE(tls.output.find("fallback: ok"), std::string::npos) << tls.output;
  EXPECT_NE(tls.output.find("socket: ok"), std::string::npos) << tls.output;

  // The other way round: a consumer with TLS, an owner without: its answer in the clear says so.
  TempDir plain_dir;
  std::thread plain_host([&] {
    owner = run_command({"ip", "netns", "exec", ns_a_, "env", secret, TUTTI_TRANSFER_WORKER,
                         "owner", plain_dir.path(), addr_a_},
                        milliseconds(90000));
  });
  WorkerResult tls_to_plain =
      run_command({"ip", "netns", "exec", ns_b_, "env", "TUTTI_TRANSFER_TLS=1", secret,
                   TUTTI_TRANSFER_WORKER, "fetch", plain_dir.path()},
                  milliseconds(60000));
  std::ofstream(plain_dir.path() + "/done") << "1";  // the failed fetch did not say it
  plain_host.join();
  EXPECT_NE(tls_to_plain.exit_code, 0) << tls_to_plain.output;
  EXPECT_NE(tls_to_plain.output.find("it answered in the clear: it does not use TLS"),
            std::string::npos)
      << tls_to_plain.output;
}

}  // namespace
}  // namespace tutti::testing
