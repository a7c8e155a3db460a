// "64K", "1M", "2.5G": a size with an optional binary suffix, for the benchmark programs'
// command lines (tutti-membw, the Open MPI baseline). Header-only: the Open MPI baseline is built
// with mpicxx, outside CMake.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

inline uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  switch (*end) {
    case 'K':
    case 'k': v *= 1024; break;
    case 'M':
    case 'm': v *= 1024 * 1024; break;
    case 'G':
    case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<uint64_t>(v);
}
