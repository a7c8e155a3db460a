#include "tutti/env.h"

#include <cstdlib>
#include <string>

#include "tutti/collective.h"
#include "tutti/error.h"

namespace tutti {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int to_int(const char* name, int min_value) {
  const char* text = get(name);
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || v < min_value || v > 1000000000L) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("environment: ") + name + "='" + text +
                    "' is not an integer >= " + std::to_string(min_value));
  }
  return static_cast<int>(v);
}

// Throws unless every variable of a set is present, naming the first missing one.
void require_all(const char* set, std::initializer_list<const char*> names) {
  const char* present = nullptr;
  for (const char* n : names) {
    if (get(n)) present = n;
  }
  for (const char* n : names) {
    if (!get(n)) {
      throw Error(ErrorCode::kInvalidArgument, std::string("environment: ") + set +
                                                   " launch variables are incomplete: " + present +
                                                   " is set but " + n + " is not");
    }
  }
}

void check_ranks(LaunchEnv& env, const char* rank_var, const char* size_var,
                 const char* local_rank_var, const char* local_size_var) {
  env.rank = to_int(rank_var, 0);
  env.world_size = to_int(size_var, 1);
  if (env.rank >= env.world_size) {
    throw Error(ErrorCode::kInvalidArgument, std::string("environment: ") + rank_var + "=" +
                                                 std::to_string(env.rank) + " is not below " +
                                                 size_var + "=" + std::to_string(env.world_size));
  }
  if (local_rank_var && get(local_rank_var)) env.local_rank = to_int(local_rank_var, 0);
  if (local_size_var && get(local_size_var)) env.local_world_size = to_int(local_size_var, 1);
  if (env.local_rank >= 0 && env.local_world_size > 0 && env.local_rank >= env.local_world_size) {
    throw Error(ErrorCode::kInvalidArgument, std::string("environment: ") + local_rank_var + "=" +
                                                 std::to_string(env.local_rank) + " is not below " +
                                                 local_size_var + "=" +
                                                 std::to_string(env.local_world_size));
  }
}

std::string master_url(const char* addr, const std::string& port) {
  std::string host = addr;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  return "tcp://" + host + ":" + port;
}

}  // namespace

// "node[01-04,07],gpu5" -> "node01"; "a,b" -> "a"; "single" -> "single". Exported for tests.
TUTTI_API std::string first_slurm_host(const std::string& list);
std::string first_slurm_host(const std::string& list) {
  std::string first;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first.push_back(c);
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  range = range.substr(0, range.find_first_of(",-]"));
  return prefix + range;
}

bool has_launch_env() {
  for (const char* n : {"TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_STORE", "RANK", "WORLD_SIZE",
                        "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    if (get(n)) return true;
  }
  return false;
}

LaunchEnv read_launch_env() {
  LaunchEnv env;
  if (const char* b = get("TUTTI_BACKEND")) env.backend = b;
  if (get("TUTTI_RANK") || get("TUTTI_WORLD_SIZE")) {
    require_all("tutti", {"TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_STORE"});
    check_ranks(env, "TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_LOCAL_RANK",
                "TUTTI_LOCAL_WORLD_SIZE");
    env.store_url = get("TUTTI_STORE");
    if (const char* job = get("TUTTI_JOB_ID")) env.job_id = job;
    env.source = "tutti";
    return env;
  }
  if (get("RANK") || get("WORLD_SIZE")) {
    require_all("torchrun", {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"});
    check_ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    to_int("MASTER_PORT", 1);
    env.store_url = master_url(get("MASTER_ADDR"), get("MASTER_PORT"));
    if (const char* job = get("TORCHELASTIC_RUN_ID")) env.job_id = job;
    env.source = "torchrun";
    return env;
  }
  if (get("SLURM_PROCID")) {
    require_all("Slurm", {"SLURM_PROCID", "SLURM_NTASKS"});
    check_ranks(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr);
    if (const char* per_node = get("SLURM_NTASKS_PER_NODE")) {
      env.local_world_size = std::atoi(per_node);  // "4" or "4(x2)": the leading count
    }
    std::string addr;
    if (const char* m = get("MASTER_ADDR")) {
      addr = m;
    } else if (const char* nodes = get("SLURM_JOB_NODELIST")) {
      addr = first_slurm_host(nodes);
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "environment: Slurm launch variables are incomplete: neither MASTER_ADDR nor "
                  "SLURM_JOB_NODELIST is set");
    }
    std::string port;
    if (get("MASTER_PORT")) {
      port = std::to_string(to_int("MASTER_PORT", 1));
    } else if (get("SLURM_JOB_ID")) {
      port = std::to_string(20000 + to_int("SLURM_JOB_ID", 0) % 10000);
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "environment: Slurm launch variables are incomplete: neither MASTER_PORT nor "
                  "SLURM_JOB_ID is set");
    }
    env.store_url = master_url(addr.c_str(), port);
    if (const char* job = get("SLURM_JOB_ID")) {
      env.job_id =
          std::string("slurm-") + job + "." + (get("SLURM_STEP_ID") ? get("SLURM_STEP_ID") : "0");
    }
    env.source = "slurm";
    return env;
  }
  if (get("OMPI_COMM_WORLD_RANK")) {
    require_all("Open MPI", {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"});
    check_ranks(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE");
    if (const char* store = get("TUTTI_STORE")) {
      env.store_url = store;
    } else if (get("MASTER_ADDR") && get("MASTER_PORT")) {
      env.store_url = master_url(get("MASTER_ADDR"), std::to_string(to_int("MASTER_PORT", 1)));
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "environment: under Open MPI set TUTTI_STORE (e.g. tcp://HOST:PORT, hosted by "
                  "rank 0) or MASTER_ADDR and MASTER_PORT, e.g. mpirun -x MASTER_ADDR=host0 -x "
                  "MASTER_PORT=29500");
    }
    if (const char* job = get("OMPI_MCA_ess_base_jobid")) env.job_id = std::string("ompi-") + job;
    env.source = "openmpi";
    return env;
  }
  throw Error(ErrorCode::kUnavailable,
              "environment: no launcher variables found (TUTTI_RANK/TUTTI_WORLD_SIZE/TUTTI_STORE "
              "from tutti-run, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from torchrun, "
              "SLURM_PROCID/SLURM_NTASKS from srun, or OMPI_COMM_WORLD_RANK from mpirun)");
}

void init_collective_group_from_env(std::string_view backend, std::string_view group_name,
                                    GroupOptions options) {
  const LaunchEnv env = read_launch_env();
  std::string chosen(backend);
  if (chosen.empty()) chosen = env.backend.empty() ? "auto" : env.backend;
  if (!options.store && options.store_url.empty()) options.store_url = env.store_url;
  if (options.job_id.empty()) options.job_id = env.job_id;
  init_collective_group(env.world_size, env.rank, chosen, group_name, options);
}

int local_rank() {
  try {
    return read_launch_env().local_rank;
  } catch (const Error&) {
    return -1;
  }
}

int local_world_size() {
  try {
    return read_launch_env().local_world_size;
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace tutti
