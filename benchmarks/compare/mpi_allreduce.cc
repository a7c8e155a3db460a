// The allreduce sweep through Open MPI's MPI_Allreduce, printing tutti-bench's columns and
// writing the same JSON, so the two can be compared side by side (benchmarks/compare/run.sh).
//
//   mpirun -np 2 mpi_allreduce -b 8 -e 64M -f 2 -w 10 -n 50 --json mpi.json [--label "openmpi sm"]
//
// float32 sum, in place (MPI_IN_PLACE); every rank times every iteration and the slowest
// rank's time per iteration is combined after the loop, as tutti-bench does.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "../parse_size.h"
#include "../stats.h"

using tutti::bench::mean;
using tutti::bench::quantile;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  uint64_t min_bytes = 8, max_bytes = 64ull << 20;
  double factor = 2;
  int warmup = 10, iters = 50;
  std::string json, label = "openmpi";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "-b")
      min_bytes = parse_size(argv[i + 1]);
    else if (a == "-e")
      max_bytes = parse_size(argv[i + 1]);
    else if (a == "-f")
      factor = std::atof(argv[i + 1]);
    else if (a == "-w")
      warmup = std::atoi(argv[i + 1]);
    else if (a == "-n")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--json")
      json = argv[i + 1];
    else if (a == "--label")
      label = argv[i + 1];
  }
  std::vector<float> buf(max_bytes / 4 + 1);
  std::vector<double> times(iters), slowest(iters);
  std::ofstream out;
  if (rank == 0) {
    std::printf("# Open MPI MPI_Allreduce (%s), world size %d, float32 sum, in place\n",
                label.c_str(), world);
    std::printf("# %10s %12s %9s %9s %7s %7s %6s\n", "size", "count", "time", "p99", "algbw",
                "busbw", "#wrong");
    if (!json.empty()) {
      out.open(json);
      out.precision(10);
      out << "{\n  \"config\": {\"tool\": \"mpi_allreduce\", \"op\": \"allreduce\", \"backend\": "
             "\""
          << label << "\", \"world_size\": " << world
          << ", \"dtype\": \"float32\", \"redop\": "
             "\"sum\", \"warmup\": "
          << warmup << ", \"iters\": " << iters << ", \"bus_factor\": " << 2.0 * (world - 1) / world
          << "},\n  \"rows\": [\n";
    }
  }
  bool first = true;
  for (double s = static_cast<double>(min_bytes);; s *= factor) {
    const uint64_t bytes = std::min<uint64_t>(static_cast<uint64_t>(std::llround(s)), max_bytes);
    const int count = std::max<int>(1, static_cast<int>(bytes / 4));
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    for (int i = 0; i < iters; ++i) {
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[i] = (MPI_Wtime() - t0) * 1e6;
    }
    MPI_Allreduce(times.data(), slowest.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    // Check: rank r contributes r + 1 everywhere.
    for (int i = 0; i < count; ++i) buf[i] = static_cast<float>(rank + 1);
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = 0;
    for (int i = 0; i < count; ++i) wrong += buf[i] != world * (world + 1) / 2.0f;
    long total_wrong = 0;
    MPI_Allreduce(&wrong, &total_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    const double t = quantile(slowest, 0.5), p99 = quantile(slowest, 0.99), avg = mean(slowest);
    const double algbw = count * 4.0 / t / 1e3, busbw = algbw * 2.0 * (world - 1) / world;
    if (rank == 0) {
      std::printf("  %10d %12d %9.1f %9.1f %7.3f %7.3f %6ld\n", count * 4, count, t, p99, algbw,
                  busbw, total_wrong);
      if (out.is_open()) {
        out << (first ? "" : ",\n") << "    {\"op\": \"allreduce\", \"size_bytes\": " << count * 4
            << ", \"count\": " << count
            << ", \"dtype\": \"float32\", \"redop\": \"sum\", "
               "\"root\": -1, \"in_place\": true, \"time_us\": "
            << t << ", \"p99_us\": " << p99 << ", \"mean_us\": " << avg
            << ", \"algbw_gbps\": " << algbw << ", \"busbw_gbps\": " << busbw
            << ", \"wrong\": " << total_wrong << "}";
      }
      first = false;
    }
    if (bytes >= max_bytes) break;
  }
  if (rank == 0 && out.is_open()) out << "\n  ]\n}\n";
  MPI_Finalize();
  return 0;
}
