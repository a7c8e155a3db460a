// tutti-bench: its arithmetic, its option parser, its check, and a short run end to end.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "bench_math.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using namespace tutti::bench;
using std::chrono::milliseconds;

TEST(BenchMath, BusBandwidthFactors) {
  // nccl-tests' factors, written out for n = 4.
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kReduce, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kSendRecv, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAlltoall, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllreduce, 1), 0.0);
}

TEST(BenchMath, SizesAndCounts) {
  EXPECT_EQ(elements_per_rank(BenchOp::kAllreduce, 1024, 4, 3), 256);
  EXPECT_EQ(elements_per_rank(BenchOp::kAllgather, 1024, 4, 4), 64);
  EXPECT_EQ(message_bytes(BenchOp::kAllgather, 64, 4, 4), 1024u);
  EXPECT_EQ(elements_per_rank(BenchOp::kAllgather, 8, 4, 3), 1);  // at least one element
  EXPECT_EQ(message_bytes(BenchOp::kReduceScatter, 85, 4, 3), 1020u);
  // alltoall, gather and scatter: the whole buffer of world-size blocks, as nccl-tests.
  EXPECT_EQ(elements_per_rank(BenchOp::kAlltoall, 1024, 4, 4), 64);
  EXPECT_EQ(message_bytes(BenchOp::kGather, 64, 4, 4), 1024u);
  EXPECT_EQ(elements_per_rank(BenchOp::kScatter, 1000, 4, 3), 83);
  EXPECT_EQ(sweep(8, 64, 2), (std::vector<uint64_t>{8, 16, 32, 64}));
  EXPECT_EQ(sweep(8, 50, 4), (std::vector<uint64_t>{8, 32, 50}));
  EXPECT_EQ(sweep(100, 100, 2), (std::vector<uint64_t>{100}));
  EXPECT_EQ(parse_size("64M"), 64ull << 20);
  EXPECT_EQ(parse_size("8"), 8u);
  EXPECT_EQ(parse_size("1.5K"), 1536u);
  EXPECT_EQ(parse_size("2G"), 2ull << 30);
  EXPECT_FALSE(parse_size("12Q").has_value());
  EXPECT_FALSE(parse_size("").has_value());
  std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_DOUBLE_EQ(quantile(v, 0.5), 3);
  EXPECT_DOUBLE_EQ(quantile(v, 0.99), 5);
  std::vector<double> hundred;
  for (int i = 100; i >= 1; --i) hundred.push_back(i);
  EXPECT_DOUBLE_EQ(quantile(hundred, 0.99), 99);
  // The mean counts an outlier the median leaves out: 99 ops of 1 us and one of 901 us.
  std::vector<double> stalled(99, 1.0);
  stalled.push_back(901);
  EXPECT_DOUBLE_EQ(mean(stalled), 10);
  EXPECT_DOUBLE_EQ(quantile(stalled, 0.5), 1);
  EXPECT_DOUBLE_EQ(mean({}), 0);
}

// Runs tutti-bench with args; returns its result.
WorkerResult bench(const std::vector<std::string>& args,
                   milliseconds limit = milliseconds(120000)) {
  std::vector<std::string> argv = {TUTTI_BENCH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, limit);
}

TEST(BenchOptions, BadValuesExit2WithAMessage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-b", "12Q"}, "-b needs a size"},
      {{"-e", "0"}, "-e needs a size"},
      {{"-f", "1"}, "factor above 1"},
      {{"-d", "float128"}, "unknown dtype 'float128'"},
      {{"-o", "xor"}, "unknown reduce op 'xor'"},
      {{"-n", "0"}, "-n needs a count >= 1"},
      {{"-c", "2"}, "-c needs 0 or 1"},
      {{"--op", "alltoallw"}, "unknown op 'alltoallw'"},
      {{"--op", "gather", "--async"}, "--async measures allreduce, not gather"},
      {{"--async", "--baseline"}, "--async and --baseline are separate runs"},
      {{"-b", "1M", "-e", "1K"}, "larger than -e"},
      {{"-d", "int32", "-o", "avg"}, "avg needs a floating dtype"},
      {{"--frobnicate", "1"}, "unknown option '--frobnicate'"},
      {{"-w"}, "-w needs a value"},
      {{"--op", "transfer", "--source", "stack"}, "--source needs shareable or heap"},
      {{"--source", "heap"}, "--source is for --op transfer"},
  };
  for (const auto& [args, message] : cases) {
    auto r = bench(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos)
        << "wanted '" << message << "' in: " << r.output;
  }
  auto help = bench({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("busbw"), std::string::npos);
}

TEST(BenchCheck, APlantedWrongResultIsCounted) {
  auto good = bench({"--ranks", "2", "-b", "64", "-e", "256", "-n", "2", "-w", "1"});
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_NE(good.output.find("Out of bounds values : 0 OK"), std::string::npos) << good.output;
  auto bad = bench(
      {"--ranks", "2", "-b", "64", "-e", "256", "-n", "2", "-w", "1", "--debug-corrupt-rank", "1"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  // One wrong element per size (3 sizes), caught by the check.
  EXPECT_NE(bad.output.find("Out of bounds values : 3 FAILED"), std::string::npos) << bad.output;
}

TEST(BenchEndToEnd, JsonAndCsvHaveEveryColumn) {
  TempDir dir;
  for (const std::string op : {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                               "sendrecv", "barrier", "alltoall", "gather", "scatter"}) {
    const std::string json = dir.path() + "/" + op + ".json";
    const std::string csv = dir.path() + "/" + op + ".csv";
    std::vector<std::string> args = {"--ranks", "2", "--op", op,  "-b",     "1K", "-e",    "4K",
                                     "-n",      "3", "-w",   "1", "--json", json, "--csv", csv};
    if (op != "reduce_scatter") args.push_back("--baseline");
    auto r = bench(args);
    ASSERT_EQ(r.exit_code, 0) << op << ": " << r.output;
    auto v = run_command(
        {"python3", CHECK_BENCH_JSON, json, csv, op, op != "reduce_scatter" ? "baseline" : "plain"},
        milliseconds(30000));
    EXPECT_EQ(v.exit_code, 0) << op << ": " << v.output;
  }
}

// --async: the overlap columns are there and consistent (not their values: speed is measured by
// benchmarks, not tests).
TEST(BenchEndToEnd, AsyncReportsOverlap) {
  TempDir dir;
  const std::string json = dir.path() + "/async.json", csv = dir.path() + "/async.csv";
  auto r = bench({"--ranks", "2", "--async", "-b", "4K", "-e", "64K", "-f", "4", "-n", "3", "-w",
                  "1", "--json", json, "--csv", csv});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Allreduce hidden behind compute: median"), std::string::npos)
      << r.output;
  auto v = run_command({"python3", CHECK_BENCH_JSON, json, csv, "allreduce", "async"},
                       milliseconds(30000));
  EXPECT_EQ(v.exit_code, 0) << v.output;
}

}  // namespace
}  // namespace tutti::testing
