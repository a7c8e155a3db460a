/* tutti's plugin ABI: collective backends and tensor transports in shared objects found at run
 * time, written in C (or anything that can export C), built against this header only.
 *
 * A plugin exports one symbol named after the ABI version it was built for, tuttiPlugin_v<N>,
 * of type tuttiPlugin_v<N>_t (examples/plugin/storeloop.c is a complete one):
 *
 *     #include <tutti/plugin.h>
 *     const tuttiPlugin_v1_t tuttiPlugin_v1 = {"myplugin", init, fini, backends, 1, NULL, 0};
 *
 * tutti loads the plugins TUTTI_PLUGINS names (a comma-separated list of paths, or names
 * looked up as libtutti-plugin-<name>.so on TUTTI_PLUGIN_PATH, a colon-separated list of
 * directories, then the library search path) when a group or an agent first looks a backend or
 * transport up, or when the program calls tutti::load_plugin (tutti/plugin_loader.h). It takes
 * the newest version it supports that the plugin exports (tuttiPlugin_v<N>, N from
 * TUTTI_PLUGIN_ABI_VERSION down to TUTTI_PLUGIN_ABI_MIN_VERSION): a plugin built for version N
 * keeps loading when tutti adds N+1 (a plugin may export several versions). One it cannot take
 * (only older or newer versions, missing functions, an init that fails or crashes: every
 * plugin's init is first tried in a child process) is refused with an error naming it and why;
 * tutti stays usable.
 *
 * Backends and transports then register under their names as built-in ones do: "auto" may take
 * them by priority, PutOptions::transport and init_collective_group name them. Every function
 * returns TUTTI_OK or an error code, with a message in `err` (a buffer tutti owns); tutti turns
 * them into tutti::Error naming the plugin, the group or agent, and the op.
 *
 * Threads: tutti calls a backend's ops one at a time per group (abort may come from any thread
 * meanwhile and must make a running op return promptly), and a transport's functions from any
 * thread, concurrently.
 */
#ifndef TUTTI_PLUGIN_H_
#define TUTTI_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TUTTI_PLUGIN_ABI_VERSION 1
#define TUTTI_PLUGIN_ABI_MIN_VERSION 1

/* tutti::ErrorCode's values. */
typedef enum {
  TUTTI_OK = 0,
  TUTTI_ERR_INVALID_ARGUMENT = 1,
  TUTTI_ERR_INVALID_USAGE = 2,
  TUTTI_ERR_TIMEOUT = 3,
  TUTTI_ERR_REMOTE = 4,
  TUTTI_ERR_IO = 5,
  TUTTI_ERR_ABORTED = 6,
  TUTTI_ERR_UNAVAILABLE = 7,
  TUTTI_ERR_INTERNAL = 8
} tuttiResult_t;

/* Where a failing function says why (NUL-terminated, truncated to fit). */
typedef struct {
  char message[512];
} tuttiError_v1_t;

typedef enum {
  TUTTI_BOOL = 0,
  TUTTI_INT8 = 1,
  TUTTI_UINT8 = 2,
  TUTTI_INT32 = 3,
  TUTTI_UINT32 = 4,
  TUTTI_INT64 = 5,
  TUTTI_UINT64 = 6,
  TUTTI_FLOAT16 = 7,
  TUTTI_BFLOAT16 = 8,
  TUTTI_FLOAT32 = 9,
  TUTTI_FLOAT64 = 10
} tuttiDataType_t;

typedef enum {
  TUTTI_SUM = 0,
  TUTTI_PRODUCT = 1,
  TUTTI_MIN = 2,
  TUTTI_MAX = 3,
  TUTTI_AVG = 4
} tuttiReduceOp_t;

#define TUTTI_DEVICE_CPU 0
#define TUTTI_DEVICE_CUDA 1

/* A dense, contiguous tensor in place (tutti::TensorView). */
typedef struct {
  void* data;
  tuttiDataType_t dtype;
  int32_t ndim;
  const int64_t* shape;
  int32_t device_type; /* TUTTI_DEVICE_* */
  int32_t device_index;
  int64_t numel;
  uint64_t nbytes;
} tuttiTensor_v1_t;

/* The group's store (keys private to the group incarnation), for a backend's set-up. */
typedef struct {
  void* handle;
  tuttiResult_t (*set)(void* handle, const char* key, const void* value, size_t size,
                       tuttiError_v1_t* err);
  /* Waits up to timeout_ms for the key, then copies its value into `buffer` (capacity *size);
   * *size is the value's size. A value larger than the buffer: TUTTI_ERR_INVALID_ARGUMENT, with
   * *size the size needed, nothing copied. */
  tuttiResult_t (*get)(void* handle, const char* key, void* buffer, size_t* size,
                       int64_t timeout_ms, tuttiError_v1_t* err);
  tuttiResult_t (*add)(void* handle, const char* key, int64_t delta, int64_t* result,
                       tuttiError_v1_t* err);
  tuttiResult_t (*wait)(void* handle, const char* const* keys, size_t count, int64_t timeout_ms,
                        tuttiError_v1_t* err);
} tuttiStore_v1_t;

/* ---- collective backends ---- */

#define TUTTI_SCOPE_ANY_HOST 0
#define TUTTI_SCOPE_ONE_HOST 1

typedef struct {
  const char* group_name;
  const char* instance; /* unique to this group incarnation on this host, for OS resources */
  int32_t rank;
  int32_t world_size;
  int64_t timeout_ms;
  const tuttiStore_v1_t* store; /* valid until the backend's destroy */
  const char* const* hosts;     /* by rank: each rank's host identity (equal: one host) */
} tuttiBackendArgs_v1_t;

/* One op as the group numbered it (equal on every rank). */
typedef struct {
  uint64_t seq;
  uint32_t tag;
  int64_t timeout_ms; /* from the op's start */
  const char* what;   /* "allreduce #3 on group 'g' (rank 1/4)", for messages */
  void* stream;       /* CUDA ops: the caller's cudaStream_t */
} tuttiOp_v1_t;

typedef struct {
  const char* name; /* case-insensitive, not "auto" */
  int32_t scope;    /* TUTTI_SCOPE_* */
  int32_t priority; /* for "auto" (built in: shm 20, hier 15, gloo 10); negative: never */
  uint32_t devices; /* bit (1 << TUTTI_DEVICE_*) per device its tensors may be on */
  /* Whether it can work here (its libraries load, a device exists); NULL: always. */
  int (*available)(void* plugin_state);
  /* Collective over the group's ranks: meet them (through args->store), make the backend. */
  tuttiResult_t (*create)(void* plugin_state, const tuttiBackendArgs_v1_t* args, void** comm,
                          tuttiError_v1_t* err);
  void (*destroy)(void* comm); /* local: never waits for other ranks */
  /* From any thread while an op runs: the op returns promptly with an error. */
  void (*abort)(void* comm, const char* reason);
  /* The ops; NULL where the backend has none (the group then fails that op, naming it). The
   * group has checked every argument; tensors are on one device, contiguous, never empty. */
  tuttiResult_t (*allreduce)(void* comm, const tuttiTensor_v1_t* tensor, tuttiReduceOp_t op,
                             const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  tuttiResult_t (*broadcast)(void* comm, const tuttiTensor_v1_t* tensor, int32_t root,
                             const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  tuttiResult_t (*reduce)(void* comm, const tuttiTensor_v1_t* tensor, tuttiReduceOp_t op,
                          int32_t root, const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  /* output: world_size blocks shaped like input, in rank order */
  tuttiResult_t (*allgather)(void* comm, const tuttiTensor_v1_t* output,
                             const tuttiTensor_v1_t* input, const tuttiOp_v1_t* ctx,
                             tuttiError_v1_t* err);
  /* input: world_size blocks shaped like output, in rank order */
  tuttiResult_t (*reduce_scatter)(void* comm, const tuttiTensor_v1_t* output,
                                  const tuttiTensor_v1_t* input, tuttiReduceOp_t op,
                                  const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  tuttiResult_t (*barrier)(void* comm, const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  /* Point to point: the k-th send from a to b meets b's k-th receive from a. With both, tutti
   * builds alltoall, gather and scatter. */
  tuttiResult_t (*send)(void* comm, const tuttiTensor_v1_t* tensor, int32_t peer,
                        const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
  tuttiResult_t (*recv)(void* comm, const tuttiTensor_v1_t* tensor, int32_t peer,
                        const tuttiOp_v1_t* ctx, tuttiError_v1_t* err);
} tuttiBackend_v1_t;

/* ---- tensor transports (the direct transport: tutti/tensor_transport.h) ---- */

typedef struct {
  const char* name; /* the agent's name, for messages */
  uint8_t uuid[16];
  uint32_t pid;
} tuttiAgent_v1_t;

/* The consumer's line to the owner's transport of the same name (TransportPeer::call), and the
 * get's cancellation. */
typedef struct {
  void* handle;
  const tuttiAgent_v1_t* owner;
  /* Sends `request`; the owner's answer is copied into `reply` (capacity *reply_size, which
   * becomes its size; too small: TUTTI_ERR_INVALID_ARGUMENT with *reply_size the size needed:
   * call again, the owner answers again). */
  tuttiResult_t (*call)(void* handle, const void* request, size_t size, void* reply,
                        size_t* reply_size, tuttiError_v1_t* err);
  /* Non-zero once the get was cancelled or the agent aborted: a long fetch looks now and then,
   * and returns TUTTI_ERR_ABORTED. */
  int32_t (*cancelled)(void* handle);
} tuttiPeer_v1_t;

/* A reference carries up to TUTTI_BLOB_MAX bytes of its transport's (the ones publish writes).
 * publish is offered TUTTI_BLOB_FIRST bytes first; a transport that needs more returns
 * TUTTI_ERR_INVALID_ARGUMENT with *blob_size set to the size it needs (any other failure leaves
 * *blob_size at most the capacity). It may keep what that call made: the agent then calls
 * publish for the same object once more, with that capacity, unless the size is above
 * TUTTI_BLOB_MAX (the put fails, naming both). Whenever publish fails (for a put, a fulfil or a
 * consumer on another host), the agent calls unpublish for the object, which a transport ignores
 * for an object it does not hold. (An agent older than TUTTI_BLOB_FIRST offered 65536 bytes and
 * took no more.) */
#define TUTTI_BLOB_FIRST 65536
#define TUTTI_BLOB_MAX 1048576

typedef struct {
  const char* name;
  uint32_t devices;   /* bit (1 << TUTTI_DEVICE_*) per device its tensors may be on */
  int32_t priority;   /* for PutOptions::transport "auto" (built in: shm 20, socket 10) */
  int32_t cross_host; /* works between hosts (else only on the owner's host) */
  int (*available)(void* plugin_state);
  tuttiResult_t (*create)(void* plugin_state, const tuttiAgent_v1_t* agent, void** transport,
                          tuttiError_v1_t* err);
  void (*destroy)(void* transport);
  /* Owner, at put: makes the tensors reachable; writes the reference's bytes into `blob`
   * (capacity *blob_size; *blob_size becomes what it wrote, or, where that was too small, what
   * it needs: see TUTTI_BLOB_FIRST). The agent keeps the object (its tensors unchanged) until
   * unpublish, and no consumer reads it after. */
  tuttiResult_t (*publish)(void* transport, uint64_t object, const tuttiTensor_v1_t* tensors,
                           size_t count, void* blob, size_t* blob_size, tuttiError_v1_t* err);
  void (*unpublish)(void* transport, uint64_t object);
  /* Owner: answers a consumer's tuttiPeer_v1_t::call (NULL: the transport takes none). */
  tuttiResult_t (*answer)(void* transport, const void* request, size_t size, void* reply,
                          size_t* reply_size, tuttiError_v1_t* err);
  /* Consumer: copies the object a reference's blob describes into `targets` (one per tensor,
   * checked by the agent) within timeout_ms (TUTTI_ERR_TIMEOUT past it). The agent holds the
   * object at the owner meanwhile. */
  tuttiResult_t (*fetch)(void* transport, const void* blob, size_t blob_size,
                         const tuttiTensor_v1_t* targets, size_t count, const tuttiPeer_v1_t* owner,
                         int64_t timeout_ms, tuttiError_v1_t* err);
} tuttiTransport_v1_t;

/* ---- the plugin ---- */

typedef struct {
  const char* name;
  /* Once, when the plugin is loaded; *state is handed to its functions. NULL: nothing to do. */
  tuttiResult_t (*init)(void** state, tuttiError_v1_t* err);
  void (*fini)(void* state);
  const tuttiBackend_v1_t* const* backends;
  size_t num_backends;
  const tuttiTransport_v1_t* const* transports;
  size_t num_transports;
} tuttiPlugin_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* TUTTI_PLUGIN_H_ */
