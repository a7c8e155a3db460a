// Joining from the environment that a launcher set: tutti-run, torchrun, Slurm's srun, Open MPI's
// mpirun. Pure reads of the environment; thread-safe as far as getenv is.
#pragma once

#include <string>
#include <string_view>

#include "tutti/export.h"
#include "tutti/options.h"

namespace tutti {

// What a launcher told this process.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;        // -1 where the launcher did not say
  int local_world_size = -1;  // -1 where the launcher did not say
  std::string store_url;      // tcp://MASTER_ADDR:MASTER_PORT, or TUTTI_STORE
  std::string job_id;         // TUTTI_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID.STEP; may be empty
  std::string backend;        // TUTTI_BACKEND; may be empty
  std::string source;         // "tutti", "torchrun", "slurm" or "openmpi"
};

// Reads the first complete set of variables, in this order:
//   tutti:    TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_STORE [TUTTI_LOCAL_RANK, TUTTI_LOCAL_WORLD_SIZE,
//             TUTTI_JOB_ID]
//   torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT [LOCAL_RANK, LOCAL_WORLD_SIZE]
//   Slurm:    SLURM_PROCID, SLURM_NTASKS, and MASTER_ADDR or the first host of SLURM_JOB_NODELIST;
//             MASTER_PORT, else 20000 + SLURM_JOB_ID % 10000 [SLURM_LOCALID,
//             SLURM_NTASKS_PER_NODE]
//   Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, and TUTTI_STORE or MASTER_ADDR and
//             MASTER_PORT [OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE]
// torchrun started under srun (both sets present) is normal: torchrun's wins.
// Throws Error(kInvalidArgument) naming the variable when a set is incomplete or contradicts
// itself (a rank not below the world size, a non-number), and Error(kUnavailable) when no set
// is present at all.
TUTTI_API LaunchEnv read_launch_env();

// True when some launcher's variables are present (complete or not).
TUTTI_API bool has_launch_env();

// init_collective_group with rank, world size and store from read_launch_env(). An empty
// backend takes TUTTI_BACKEND, else "auto" (shm on one host, else gloo).
TUTTI_API void init_collective_group_from_env(std::string_view backend = "",
                                              std::string_view group_name = "default",
                                              GroupOptions options = {});

// The launcher's local rank and local world size, for choosing a GPU; -1 where unknown.
TUTTI_API int local_rank();
TUTTI_API int local_world_size();

}  // namespace tutti
