// The benchmarks' statistics over a run's iteration times: the median and p99 (quantile) and the
// mean. Header-only: the Open MPI baseline (compare/mpi_allreduce.cc) is built with mpicxx,
// outside CMake, and reports the same figures as tutti-bench.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tutti::bench {

// The q-quantile (0..1) of values by nearest rank (0 for none); values is sorted in place.
inline double quantile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The arithmetic mean of values (0 for none).
inline double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

}  // namespace tutti::bench
