// tutti-flight: merges the flight-recorder dumps of a job's ranks (TUTTI_FLIGHT_RECORDER_DIR)
// and says, per group, which rank is behind and on which op. See src/group/flight_recorder.h for
// the dump format.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage: tutti-flight [-v] PATH...

Reads flight-recorder dumps (files tutti-flight.*.txt, or directories holding them: what
TUTTI_FLIGHT_RECORDER_DIR collects from every rank of a job) and says, for each group, what
each rank did last, which ranks are behind and on which op, and where the ranks disagree.
  -v   also list every op each rank recorded
Exit status: 0 when the dumps were read, 1 when none could be, 2 for bad usage.
)";

std::string unescape(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size()) {
      out.push_back(static_cast<char>(std::strtol(in.substr(i + 1, 2).c_str(), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  in >> word;  // the record's kind
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = unescape(word.substr(eq + 1));
  }
  return out;
}

// A dump is another process's file: numbers out of range read as 0 (strtoll saturates where
// atoll's behaviour is undefined), and are then refused where they matter (rank, world).
long long num(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  if (it == f.end()) return 0;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  return errno == ERANGE || end == it->second.c_str() ? 0 : v;
}

// Larger than any job: a dump claiming more ranks is not read (the report lists each rank).
constexpr long long kMaxWorld = 1 << 20;

std::string str(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() ? std::string() : it->second;
}

struct Op {
  long long id = 0, seq = 0, peer = -1;
  std::string kind, op, sig, state, error;
  long long issued = 0, started = 0, ended = 0;

  // "allreduce #5 (float32[1000] sum)"
  std::string name() const {
    std::string out = op + " #" + std::to_string(seq);
    if (kind == "send") out += " to rank " + std::to_string(peer);
    if (kind == "recv") out += " from rank " + std::to_string(peer);
    return out + " (" + sig + ")";
  }
};

struct Dump {
  std::string file, group, instance, backend, host, reason;
  int rank = -1, world = 0;
  long long pid = 0, dumped = 0;
  std::vector<Op> ops;
};

bool read_dump(const std::string& path, Dump& d) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line.rfind("tutti-flight-record 1", 0) != 0) return false;
  d.file = path;
  bool ended = false;
  while (std::getline(in, line)) {
    if (line.rfind("group ", 0) == 0) {
      auto f = fields(line);
      d.group = str(f, "name");
      d.instance = str(f, "instance");
      d.backend = str(f, "backend");
      d.host = str(f, "host");
      d.reason = str(f, "reason");
      const long long rank = num(f, "rank"), world = num(f, "world");
      if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world) {
        std::fprintf(stderr, "tutti-flight: %s says rank %lld of world %lld\n", path.c_str(), rank,
                     world);
        return false;
      }
      d.rank = static_cast<int>(rank);
      d.world = static_cast<int>(world);
      d.pid = num(f, "pid");
      d.dumped = num(f, "dumped_us");
    } else if (line.rfind("op ", 0) == 0) {
      auto f = fields(line);
      Op op;
      op.id = num(f, "id");
      op.seq = num(f, "seq");
      op.peer = num(f, "peer");
      op.kind = str(f, "kind");
      op.op = str(f, "op");
      op.sig = str(f, "sig");
      op.state = str(f, "state");
      op.error = str(f, "error");
      op.issued = num(f, "issued_us");
      op.started = num(f, "started_us");
      op.ended = num(f, "ended_us");
      d.ops.push_back(op);
    } else if (line == "end") {
      ended = true;
    }
  }
  if (!ended)
    std::fprintf(stderr, "tutti-flight: %s is cut short; reading what is there\n", path.c_str());
  return d.rank >= 0;
}

void collect(const std::string& path, std::vector<std::string>& files) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "tutti-flight: %s: %s\n", path.c_str(), std::strerror(errno));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    // Regular files only: a FIFO would block the read forever, a device never end.
    if (S_ISREG(st.st_mode)) {
      files.push_back(path);
    } else {
      std::fprintf(stderr, "tutti-flight: %s is not a regular file\n", path.c_str());
    }
    return;
  }
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    struct stat entry;
    if (name.rfind("tutti-flight.", 0) == 0 && name.size() > 4 &&
        name.compare(name.size() - 4, 4, ".txt") == 0 &&
        ::stat((path + "/" + name).c_str(), &entry) == 0 && S_ISREG(entry.st_mode)) {
      files.push_back(path + "/" + name);
    }
  }
  ::closedir(dir);
  std::sort(files.begin(), files.end());
}

// The time from `from_us` to `to_us`, in floating point: the dump's stamps may be anything, and
// their difference must not overflow.
std::string seconds(long long to_us, long long from_us = 0) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f s",
                (static_cast<double>(to_us) - static_cast<double>(from_us)) / 1e6);
  return buf;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// What one op's state says, relative to the dump.
std::string progress(const Op& op, long long dumped) {
  if (op.state == "completed") return "completed in " + seconds(op.ended, op.started);
  if (op.state == "failed") {
    return "failed after " + seconds(op.ended, op.started) +
           (op.error.empty() ? "" : ": " + op.error);
  }
  if (op.state == "started") return "running for " + seconds(dumped, op.started) + " at the dump";
  return "queued for " + seconds(dumped, op.issued) + " at the dump";
}

void analyse(const std::string& instance, std::vector<Dump>& dumps, bool verbose) {
  std::sort(dumps.begin(), dumps.end(),
            [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  const Dump& first = dumps.front();
  std::printf("group '%s' (instance %s, backend %s, world %d)\n", first.group.c_str(),
              instance.c_str(), first.backend.c_str(), first.world);
  std::set<int> present;
  for (const Dump& d : dumps) present.insert(d.rank);
  std::vector<int> missing;
  for (int r = 0; r < first.world; ++r) {
    if (!present.count(r)) missing.push_back(r);
  }
  // Per rank: the last collective it issued.
  std::map<int, const Op*> last;
  long long frontier = -1;
  for (const Dump& d : dumps) {
    const Op* mine = nullptr;
    for (const Op& op : d.ops) {
      if (op.kind == "collective" && (mine == nullptr || op.seq >= mine->seq)) mine = &op;
    }
    last[d.rank] = mine;
    if (mine != nullptr) frontier = std::max(frontier, mine->seq);
    std::string why = d.reason;
    if (why.size() > 72) why = why.substr(0, 69) + "...";
    std::printf("  rank %d (pid %lld on %s), dumped %s\n    ", d.rank, d.pid, d.host.c_str(),
                why.c_str());
    if (mine == nullptr) {
      std::printf("no collective recorded\n");
    } else {
      std::printf("last collective %s %s\n", mine->name().c_str(),
                  progress(*mine, d.dumped).c_str());
    }
    for (const Op& op : d.ops) {
      const bool pending = op.state == "issued" || op.state == "started";
      if (op.kind != "collective" && (pending || op.state == "failed")) {
        std::printf("    point-to-point: %s %s\n", op.name().c_str(),
                    progress(op, d.dumped).c_str());
      }
      if (verbose) {
        std::printf("    %s %s\n", op.name().c_str(), progress(op, d.dumped).c_str());
      }
    }
  }
  if (frontier < 0) {
    std::printf("  => no collective recorded by any rank\n");
  } else {
    std::vector<int> ahead, behind;
    std::map<std::string, std::vector<int>> at_frontier;  // signature -> ranks
    for (const auto& [rank, op] : last) {
      if (op != nullptr && op->seq == frontier) {
        ahead.push_back(rank);
        at_frontier[op->op + " " + op->sig].push_back(rank);
      } else {
        behind.push_back(rank);
      }
    }
    const Op& reached = *last[ahead.front()];
    const std::string name = reached.op + " #" + std::to_string(frontier);
    if (!behind.empty()) {
      for (int r : behind) {
        const Op* op = last[r];
        std::printf(
            "  => rank %d is behind: %s reached %s (%s); rank %d has not issued it (its "
            "last collective: %s)\n",
            r, ranks_text(ahead).c_str(), name.c_str(), reached.sig.c_str(), r,
            op == nullptr ? "none" : (op->name() + ", " + op->state).c_str());
      }
    } else {
      std::vector<int> waiting;
      for (int r : ahead) {
        if (last[r]->state == "issued" || last[r]->state == "started") waiting.push_back(r);
      }
      if (!waiting.empty()) {
        std::printf("  => every rank issued %s; %s still in it\n", name.c_str(),
                    ranks_text(waiting).c_str());
      } else {
        std::printf("  => no rank is behind: every rank's last collective is %s\n", name.c_str());
      }
    }
    if (at_frontier.size() > 1) {
      std::printf("  => the ranks disagree on collective #%lld:", frontier);
      for (const auto& [what, ranks] : at_frontier) {
        std::printf(" %s called %s;", ranks_text(ranks).c_str(), what.c_str());
      }
      std::printf("\n");
    }
  }
  if (!missing.empty()) {
    std::printf(
        "  => no dump from %s: if it is behind, it is behind the others (send it "
        "SIGUSR1, or look for its crash)\n",
        ranks_text(missing).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a == "-v") {
      verbose = true;
    } else {
      paths.push_back(a);
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  std::vector<std::string> files;
  for (const auto& p : paths) collect(p, files);
  std::map<std::string, std::map<int, Dump>> by_instance;
  for (const auto& f : files) {
    Dump d;
    if (!read_dump(f, d)) {
      std::fprintf(stderr, "tutti-flight: %s is not a flight record\n", f.c_str());
      continue;
    }
    auto& slot = by_instance[d.instance][d.rank];
    if (slot.rank < 0 || d.dumped > slot.dumped) slot = d;
  }
  if (by_instance.empty()) {
    std::fprintf(stderr, "tutti-flight: no flight records found\n");
    return 1;
  }
  for (auto& [instance, ranks] : by_instance) {
    std::vector<Dump> dumps;
    for (auto& [rank, d] : ranks) dumps.push_back(d);
    analyse(instance, dumps, verbose);
  }
  return 0;
}
