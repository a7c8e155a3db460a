/* An example tutti plugin in plain C (tutti/plugin.h), built against that header alone:
 *
 * - a collective backend "storeloop": every op goes through the group's store (each rank writes
 *   its part under a key of the op, then reads the others'). Slow, and small on purpose: what a
 *   backend owes tutti, and nothing else.
 * - a tensor transport "inline": the owner answers each tensor's request with its bytes, over
 *   the agents' own connection (tuttiPeer_v1_t::call), straight into the consumer's target.
 *
 *   cc -shared -fPIC -I<tutti>/include storeloop.c -o libtutti-plugin-storeloop.so
 *   TUTTI_PLUGINS=storeloop TUTTI_PLUGIN_PATH=$PWD tutti-run -n 2 ./my_program   # backend
 * "storeloop"
 *
 * STORELOOP_PRIORITY (read by init) sets the backend's priority for "auto" (default -1: never).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/plugin.h>

/* ---- the collective backend ---- */

typedef struct {
  int rank, world;
  int64_t timeout_ms;
  char prefix[256]; /* keys: <instance>/<op seq>/... */
  tuttiStore_v1_t store;
  volatile int aborted;
  char reason[256];
} Comm;

static int fail(tuttiError_v1_t* err, tuttiResult_t rc, const char* what) {
  snprintf(err->message, sizeof(err->message), "%s", what);
  return rc;
}

static size_t dtype_size(tuttiDataType_t t) {
  switch (t) {
    case TUTTI_BOOL:
    case TUTTI_INT8:
    case TUTTI_UINT8: return 1;
    case TUTTI_FLOAT16:
    case TUTTI_BFLOAT16: return 2;
    case TUTTI_INT32:
    case TUTTI_UINT32:
    case TUTTI_FLOAT32: return 4;
    default: return 8;
  }
}

/* acc = acc (op) x, element by element, for the dtypes this example reduces. */
static int reduce_into(void* acc, const void* x, const tuttiTensor_v1_t* t, tuttiReduceOp_t op,
                       tuttiError_v1_t* err) {
#define REDUCE(T)                                                \
  {                                                              \
    T* a = (T*)acc;                                              \
    const T* b = (const T*)x;                                    \
    for (int64_t i = 0; i < t->numel; ++i) {                     \
      switch (op) {                                              \
        case TUTTI_SUM:                                          \
        case TUTTI_AVG: a[i] = a[i] + b[i]; break;               \
        case TUTTI_PRODUCT: a[i] = a[i] * b[i]; break;           \
        case TUTTI_MIN: a[i] = b[i] < a[i] ? b[i] : a[i]; break; \
        case TUTTI_MAX: a[i] = b[i] > a[i] ? b[i] : a[i]; break; \
      }                                                          \
    }                                                            \
    return TUTTI_OK;                                             \
  }
  switch (t->dtype) {
    case TUTTI_INT32: REDUCE(int32_t)
    case TUTTI_INT64: REDUCE(int64_t)
    case TUTTI_FLOAT32: REDUCE(float)
    case TUTTI_FLOAT64: REDUCE(double)
    default:
      return fail(err, TUTTI_ERR_INVALID_ARGUMENT,
                  "storeloop reduces int32, int64, float32 and float64 only");
  }
#undef REDUCE
}

static void key_of(const Comm* c, char* out, size_t n, const tuttiOp_v1_t* op, const char* what,
                   int rank) {
  snprintf(out, n, "%s/%llu/%s/%d", c->prefix, (unsigned long long)op->seq, what, rank);
}

static int put(Comm* c, const char* key, const void* data, size_t size, tuttiError_v1_t* err) {
  if (c->aborted) return fail(err, TUTTI_ERR_ABORTED, c->reason);
  return c->store.set(c->store.handle, key, data, size, err);
}

static int take(Comm* c, const char* key, void* data, size_t size, const tuttiOp_v1_t* op,
                tuttiError_v1_t* err) {
  if (c->aborted) return fail(err, TUTTI_ERR_ABORTED, c->reason);
  size_t got = size;
  int rc = c->store.get(c->store.handle, key, data, &got, op->timeout_ms, err);
  if (rc == TUTTI_OK && got != size) {
    snprintf(err->message, sizeof(err->message), "%s holds %zu bytes, expected %zu", key, got,
             size);
    return TUTTI_ERR_REMOTE;
  }
  return rc;
}

static tuttiResult_t create(void* state, const tuttiBackendArgs_v1_t* args, void** comm,
                            tuttiError_v1_t* err) {
  (void)state;
  Comm* c = (Comm*)calloc(1, sizeof(Comm));
  if (c == NULL) return fail(err, TUTTI_ERR_UNAVAILABLE, "out of memory");
  c->rank = args->rank;
  c->world = args->world_size;
  c->timeout_ms = args->timeout_ms;
  snprintf(c->prefix, sizeof(c->prefix), "storeloop/%s", args->instance);
  c->store = *args->store;
  *comm = c;
  return TUTTI_OK;
}

static void destroy(void* comm) {
  free(comm);
}

static void abort_comm(void* comm, const char* reason) {
  Comm* c = (Comm*)comm;
  snprintf(c->reason, sizeof(c->reason), "aborted: %s", reason);
  c->aborted = 1;
}

static tuttiResult_t allreduce(void* comm, const tuttiTensor_v1_t* t, tuttiReduceOp_t op,
                               const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  key_of(c, key, sizeof(key), ctx, "allreduce", c->rank);
  int rc = put(c, key, t->data, t->nbytes, err);
  if (rc != TUTTI_OK) return rc;
  void* acc = malloc(t->nbytes);
  void* part = malloc(t->nbytes);
  for (int r = 0; r < c->world && rc == TUTTI_OK; ++r) {
    key_of(c, key, sizeof(key), ctx, "allreduce", r);
    rc = take(c, key, r == 0 ? acc : part, t->nbytes, ctx, err);
    if (rc == TUTTI_OK && r > 0) rc = reduce_into(acc, part, t, op, err);
  }
  if (rc == TUTTI_OK && op == TUTTI_AVG) {
    if (t->dtype == TUTTI_FLOAT32) {
      for (int64_t i = 0; i < t->numel; ++i) ((float*)acc)[i] /= (float)c->world;
    } else if (t->dtype == TUTTI_FLOAT64) {
      for (int64_t i = 0; i < t->numel; ++i) ((double*)acc)[i] /= (double)c->world;
    }
  }
  if (rc == TUTTI_OK) memcpy(t->data, acc, t->nbytes);
  free(acc);
  free(part);
  return rc;
}

static tuttiResult_t broadcast(void* comm, const tuttiTensor_v1_t* t, int32_t root,
                               const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  key_of(c, key, sizeof(key), ctx, "broadcast", root);
  if (c->rank == root) return put(c, key, t->data, t->nbytes, err);
  return take(c, key, t->data, t->nbytes, ctx, err);
}

static tuttiResult_t allgather(void* comm, const tuttiTensor_v1_t* out, const tuttiTensor_v1_t* in,
                               const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  key_of(c, key, sizeof(key), ctx, "allgather", c->rank);
  int rc = put(c, key, in->data, in->nbytes, err);
  for (int r = 0; r < c->world && rc == TUTTI_OK; ++r) {
    key_of(c, key, sizeof(key), ctx, "allgather", r);
    rc = take(c, key, (char*)out->data + (size_t)r * in->nbytes, in->nbytes, ctx, err);
  }
  return rc;
}

static tuttiResult_t barrier(void* comm, const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  const char one = 1;
  key_of(c, key, sizeof(key), ctx, "barrier", c->rank);
  int rc = put(c, key, &one, 1, err);
  for (int r = 0; r < c->world && rc == TUTTI_OK; ++r) {
    char got;
    key_of(c, key, sizeof(key), ctx, "barrier", r);
    rc = take(c, key, &got, 1, ctx, err);
  }
  return rc;
}

/* The k-th message from a to b lives under "<a>-><b>/<k>": seq counts per peer and direction. */
static tuttiResult_t send_to(void* comm, const tuttiTensor_v1_t* t, int32_t peer,
                             const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  snprintf(key, sizeof(key), "%s/p2p/%d->%d/%llu", c->prefix, c->rank, peer,
           (unsigned long long)ctx->seq);
  return put(c, key, t->data, t->nbytes, err);
}

static tuttiResult_t recv_from(void* comm, const tuttiTensor_v1_t* t, int32_t peer,
                               const tuttiOp_v1_t* ctx, tuttiError_v1_t* err) {
  Comm* c = (Comm*)comm;
  char key[512];
  snprintf(key, sizeof(key), "%s/p2p/%d->%d/%llu", c->prefix, peer, c->rank,
           (unsigned long long)ctx->seq);
  return take(c, key, t->data, t->nbytes, ctx, err);
}

static tuttiBackend_v1_t storeloop = {
    "storeloop",
    TUTTI_SCOPE_ANY_HOST,
    -1,
    1u << TUTTI_DEVICE_CPU,
    NULL,
    create,
    destroy,
    abort_comm,
    allreduce,
    broadcast,
    NULL /* reduce */,
    allgather,
    NULL /* reduce_scatter */,
    barrier,
    send_to,
    recv_from,
};

/* ---- the tensor transport ---- */

typedef struct {
  uint64_t id;
  size_t count;
  tuttiTensor_v1_t* tensors;
} Object;

typedef struct {
  pthread_mutex_t mutex;
  Object* objects;
  size_t count, capacity;
} Inline;

static tuttiResult_t inline_create(void* state, const tuttiAgent_v1_t* agent, void** transport,
                                   tuttiError_v1_t* err) {
  (void)state;
  (void)agent;
  Inline* t = (Inline*)calloc(1, sizeof(Inline));
  if (t == NULL) return fail(err, TUTTI_ERR_UNAVAILABLE, "out of memory");
  pthread_mutex_init(&t->mutex, NULL);
  *transport = t;
  return TUTTI_OK;
}

static void inline_destroy(void* transport) {
  Inline* t = (Inline*)transport;
  for (size_t i = 0; i < t->count; ++i) free(t->objects[i].tensors);
  free(t->objects);
  pthread_mutex_destroy(&t->mutex);
  free(t);
}

/* The blob: the object's id; the owner keeps its tensors' places until unpublish. */
static tuttiResult_t inline_publish(void* transport, uint64_t object,
                                    const tuttiTensor_v1_t* tensors, size_t count, void* blob,
                                    size_t* blob_size, tuttiError_v1_t* err) {
  Inline* t = (Inline*)transport;
  if (*blob_size < sizeof(object)) return fail(err, TUTTI_ERR_INTERNAL, "no room for the blob");
  pthread_mutex_lock(&t->mutex);
  if (t->count == t->capacity) {
    t->capacity = t->capacity ? t->capacity * 2 : 16;
    t->objects = (Object*)realloc(t->objects, t->capacity * sizeof(Object));
  }
  Object* o = &t->objects[t->count++];
  o->id = object;
  o->count = count;
  o->tensors = (tuttiTensor_v1_t*)malloc(count * sizeof(tuttiTensor_v1_t));
  memcpy(o->tensors, tensors, count * sizeof(tuttiTensor_v1_t));
  pthread_mutex_unlock(&t->mutex);
  memcpy(blob, &object, sizeof(object));
  *blob_size = sizeof(object);
  return TUTTI_OK;
}

static void inline_unpublish(void* transport, uint64_t object) {
  Inline* t = (Inline*)transport;
  pthread_mutex_lock(&t->mutex);
  for (size_t i = 0; i < t->count; ++i) {
    if (t->objects[i].id == object) {
      free(t->objects[i].tensors);
      t->objects[i] = t->objects[--t->count];
      break;
    }
  }
  pthread_mutex_unlock(&t->mutex);
}

/* A request: object id, tensor index; the answer: the tensor's bytes. */
static tuttiResult_t inline_answer(void* transport, const void* request, size_t size, void* reply,
                                   size_t* reply_size, tuttiError_v1_t* err) {
  Inline* t = (Inline*)transport;
  uint64_t ask[2];
  if (size != sizeof(ask)) return fail(err, TUTTI_ERR_INVALID_ARGUMENT, "a malformed request");
  memcpy(ask, request, sizeof(ask));
  int rc = TUTTI_ERR_INVALID_USAGE;
  snprintf(err->message, sizeof(err->message), "object %llu is not published here",
           (unsigned long long)ask[0]);
  pthread_mutex_lock(&t->mutex);
  for (size_t i = 0; i < t->count; ++i) {
    if (t->objects[i].id != ask[0]) continue;
    if (ask[1] >= t->objects[i].count) {
      rc = fail(err, TUTTI_ERR_INVALID_ARGUMENT, "no such tensor in the object");
      break;
    }
    const tuttiTensor_v1_t* x = &t->objects[i].tensors[ask[1]];
    const size_t capacity = *reply_size;
    *reply_size = x->nbytes;
    if (x->nbytes > capacity) {
      rc = fail(err, TUTTI_ERR_INVALID_ARGUMENT, "the reply buffer is too small");
    } else {
      memcpy(reply, x->data, x->nbytes);
      rc = TUTTI_OK;
    }
    break;
  }
  pthread_mutex_unlock(&t->mutex);
  return rc;
}

static tuttiResult_t inline_fetch(void* transport, const void* blob, size_t blob_size,
                                  const tuttiTensor_v1_t* targets, size_t count,
                                  const tuttiPeer_v1_t* owner, int64_t timeout_ms,
                                  tuttiError_v1_t* err) {
  (void)transport;
  (void)timeout_ms; /* each call is bounded by the agent's own deadline */
  uint64_t ask[2];
  if (blob_size != sizeof(uint64_t))
    return fail(err, TUTTI_ERR_INVALID_ARGUMENT, "a malformed blob");
  memcpy(&ask[0], blob, sizeof(uint64_t));
  for (size_t i = 0; i < count; ++i) {
    if (owner->cancelled(owner->handle)) return fail(err, TUTTI_ERR_ABORTED, "cancelled");
    ask[1] = i;
    size_t got = targets[i].nbytes;
    int rc = owner->call(owner->handle, ask, sizeof(ask), targets[i].data, &got, err);
    if (rc != TUTTI_OK) return rc;
    if (got != targets[i].nbytes) return fail(err, TUTTI_ERR_REMOTE, "the owner sent another size");
  }
  return TUTTI_OK;
}

static const tuttiTransport_v1_t inline_transport = {
    "inline",      1u << TUTTI_DEVICE_CPU, -1 /* never "auto" */, 1 /* any host */, NULL,
    inline_create, inline_destroy,         inline_publish,        inline_unpublish, inline_answer,
    inline_fetch,
};

/* ---- the plugin ---- */

static tuttiResult_t init(void** state, tuttiError_v1_t* err) {
  (void)err;
  *state = NULL;
  const char* p = getenv("STORELOOP_PRIORITY");
  if (p != NULL) storeloop.priority = atoi(p);
  return TUTTI_OK;
}

static const tuttiBackend_v1_t* const backends[] = {&storeloop};
static const tuttiTransport_v1_t* const transports[] = {&inline_transport};

__attribute__((visibility("default"))) const tuttiPlugin_v1_t tuttiPlugin_v1 = {
    "storeloop", init, NULL, backends, 1, transports, 1,
};
