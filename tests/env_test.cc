// Reading the launchers' environment variables (set here by the test, one launcher at a time).
#include <gtest/gtest.h>

#include <cstdlib>

#include "test_util.h"

namespace tutti {
std::string first_slurm_host(const std::string& list);  // env.cc
}

namespace tutti::testing {
namespace {

const char* const kAllVars[] = {"TUTTI_RANK",
                                "TUTTI_WORLD_SIZE",
                                "TUTTI_STORE",
                                "TUTTI_LOCAL_RANK",
                                "TUTTI_LOCAL_WORLD_SIZE",
                                "TUTTI_JOB_ID",
                                "TUTTI_BACKEND",
                                "RANK",
                                "WORLD_SIZE",
                                "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR",
                                "MASTER_PORT",
                                "TORCHELASTIC_RUN_ID",
                                "SLURM_PROCID",
                                "SLURM_NTASKS",
                                "SLURM_LOCALID",
                                "SLURM_JOB_NODELIST",
                                "SLURM_JOB_ID",
                                "SLURM_STEP_ID",
                                "SLURM_NTASKS_PER_NODE",
                                "OMPI_COMM_WORLD_RANK",
                                "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK",
                                "OMPI_COMM_WORLD_LOCAL_SIZE",
                                "OMPI_MCA_ess_base_jobid"};

class Env : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kAllVars) ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }
};

TEST_F(Env, NothingSetIsUnavailable) {
  EXPECT_FALSE(has_launch_env());
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kUnavailable, "no launcher variables");
  EXPECT_EQ(local_rank(), -1);
}

TEST_F(Env, Tutti) {
  set("TUTTI_RANK", "2");
  set("TUTTI_WORLD_SIZE", "4");
  set("TUTTI_STORE", "tcp://127.0.0.1:4000");
  set("TUTTI_LOCAL_RANK", "0");
  set("TUTTI_LOCAL_WORLD_SIZE", "2");
  set("TUTTI_JOB_ID", "j1");
  set("TUTTI_BACKEND", "gloo");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "tutti");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.store_url, "tcp://127.0.0.1:4000");
  EXPECT_EQ(e.job_id, "j1");
  EXPECT_EQ(e.backend, "gloo");
  EXPECT_EQ(local_rank(), 0);
  EXPECT_EQ(local_world_size(), 2);
}

// open_store("env://") opens the launcher's store; without a launcher it says what it needs.
TEST_F(Env, OpenStoreOfEnvOpensTheLaunchersStore) {
  EXPECT_TUTTI_ERROR(open_store("env://"), ErrorCode::kUnavailable,
                     "store URL 'env://' names the launcher's store", "no launcher variables");
  EXPECT_TUTTI_ERROR(open_store("env://x"), ErrorCode::kInvalidArgument,
                     "env:// takes nothing after it");
  TempDir dir;
  const std::string url = "file://" + dir.path() + "/store";
  set("TUTTI_RANK", "1");
  set("TUTTI_WORLD_SIZE", "2");
  set("TUTTI_STORE", url.c_str());
  auto store = open_store("env://");
  store->set("k", "v");
  EXPECT_EQ(open_store(url)->get("k"), "v");  // the same file, opened by its own URL
}

TEST_F(Env, TorchrunUnderSrunIsNormal) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.1.2.3");
  set("MASTER_PORT", "29500");
  set("SLURM_PROCID", "1");  // srun's own numbering of the torchrun agents
  set("SLURM_NTASKS", "4");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.store_url, "tcp://10.1.2.3:29500");
}

TEST_F(Env, TorchrunIPv6Master) {
  set("RANK", "0");
  set("WORLD_SIZE", "1");
  set("MASTER_ADDR", "fd00::1");
  set("MASTER_PORT", "29500");
  EXPECT_EQ(read_launch_env().store_url, "tcp://[fd00::1]:29500");
}

TEST_F(Env, Slurm) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "8");
  set("SLURM_LOCALID", "1");
  set("SLURM_NTASKS_PER_NODE", "4(x2)");
  set("SLURM_JOB_NODELIST", "gpu[007-008,010],cpu1");
  set("SLURM_JOB_ID", "123456");
  set("SLURM_STEP_ID", "0");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.store_url, "tcp://gpu007:23456");
  EXPECT_EQ(e.job_id, "slurm-123456.0");
  set("MASTER_ADDR", "head");
  set("MASTER_PORT", "1234");
  EXPECT_EQ(read_launch_env().store_url, "tcp://head:1234");
}

TEST_F(Env, SlurmHostLists) {
  EXPECT_EQ(first_slurm_host("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("n[3]"), "n3");
}

TEST_F(Env, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "TUTTI_STORE", "MASTER_ADDR");
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", "5000");
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.store_url, "tcp://127.0.0.1:5000");
}

TEST_F(Env, IncompleteOrContradictorySetsNameTheVariable) {
  set("TUTTI_RANK", "0");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "TUTTI_WORLD_SIZE is not");
  set("TUTTI_WORLD_SIZE", "2");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "TUTTI_STORE is not");
  set("TUTTI_STORE", "tcp://h:1");
  set("TUTTI_RANK", "2");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "TUTTI_RANK=2",
                     "TUTTI_WORLD_SIZE=2");
  set("TUTTI_RANK", "one");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "TUTTI_RANK='one'");
  SetUp();
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "x");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "torchrun",
                     "MASTER_PORT is not");
  set("MASTER_PORT", "1");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "2");
  EXPECT_TUTTI_ERROR(read_launch_env(), ErrorCode::kInvalidArgument, "LOCAL_RANK=3");
}

}  // namespace
}  // namespace tutti::testing
