/* A transport ("bigblob") whose refs need more bytes than the agent offers first (plugin.h,
 * TUTTI_BLOB_FIRST): 100 bytes a tensor and 1000 more. Asked with too little room, it keeps its
 * publication for the agent's next call (which fails for 2000 tensors); it counts what it was
 * offered and what it keeps, for plugin_test (bigblob_stats, found with dlsym). Its fetch checks
 * every byte of the blob and fills each target with 0x5a: the consumer sees the blob arrived
 * whole. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tutti/plugin.h>

typedef struct {
  size_t offers[8]; /* the capacities publish was called with, in order */
  size_t calls;
  long kept; /* objects published and not yet unpublished */
} Stats;

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static Stats stats;
static uint64_t kept_objects[64];

__attribute__((visibility("default"))) Stats bigblob_stats(void) {
  pthread_mutex_lock(&mutex);
  Stats s = stats;
  pthread_mutex_unlock(&mutex);
  return s;
}

static size_t needed(size_t count) {
  return 1000 + 100 * count;
}

static uint8_t byte_at(size_t i) {
  return (uint8_t)(i * 7 + 3);
}

static tuttiResult_t fail(tuttiError_v1_t* err, tuttiResult_t code, const char* what) {
  snprintf(err->message, sizeof(err->message), "%s", what);
  return code;
}

/* kept_objects holds object + 1; 0 is a free slot. */
static int find_slot(uint64_t stored) {
  for (int i = 0; i < 64; ++i)
    if (kept_objects[i] == stored) return i;
  return -1;
}

static tuttiResult_t create(void* state, const tuttiAgent_v1_t* agent, void** transport,
                            tuttiError_v1_t* err) {
  (void)state, (void)agent, (void)err;
  *transport = &stats;
  return TUTTI_OK;
}

static void destroy(void* transport) {
  (void)transport;
}

static tuttiResult_t publish(void* transport, uint64_t object, const tuttiTensor_v1_t* tensors,
                             size_t count, void* blob, size_t* blob_size, tuttiError_v1_t* err) {
  (void)transport, (void)tensors;
  const size_t n = needed(count);
  pthread_mutex_lock(&mutex);
  if (stats.calls < 8) stats.offers[stats.calls] = *blob_size;
  ++stats.calls;
  if (find_slot(object + 1) < 0) {
    const int slot = find_slot(0);
    if (slot < 0) {
      pthread_mutex_unlock(&mutex);
      return fail(err, TUTTI_ERR_INTERNAL, "bigblob: more than 64 objects");
    }
    kept_objects[slot] = object + 1;
    ++stats.kept;
  }
  pthread_mutex_unlock(&mutex);
  if (*blob_size < n) {
    *blob_size = n;
    return fail(err, TUTTI_ERR_INVALID_ARGUMENT, "bigblob: more room, please");
  }
  if (count == 2000) return fail(err, TUTTI_ERR_IO, "bigblob: not a second time");
  for (size_t i = 0; i < n; ++i) ((uint8_t*)blob)[i] = byte_at(i);
  *blob_size = n;
  return TUTTI_OK;
}

static void unpublish(void* transport, uint64_t object) {
  (void)transport;
  pthread_mutex_lock(&mutex);
  const int slot = find_slot(object + 1);
  if (slot >= 0) {
    kept_objects[slot] = 0;
    --stats.kept;
  }
  pthread_mutex_unlock(&mutex);
}

static tuttiResult_t fetch(void* transport, const void* blob, size_t blob_size,
                           const tuttiTensor_v1_t* targets, size_t count,
                           const tuttiPeer_v1_t* owner, int64_t timeout_ms, tuttiError_v1_t* err) {
  (void)transport, (void)owner, (void)timeout_ms;
  if (blob_size != needed(count)) return fail(err, TUTTI_ERR_INVALID_ARGUMENT, "bigblob: size");
  for (size_t i = 0; i < blob_size; ++i) {
    if (((const uint8_t*)blob)[i] != byte_at(i))
      return fail(err, TUTTI_ERR_INVALID_ARGUMENT, "bigblob: a byte changed");
  }
  for (size_t i = 0; i < count; ++i) memset(targets[i].data, 0x5a, targets[i].nbytes);
  return TUTTI_OK;
}

static const tuttiTransport_v1_t transport = {
    "bigblob", 1u << TUTTI_DEVICE_CPU, 1, 0, NULL, create, destroy, publish, unpublish, NULL, fetch,
};
static const tuttiTransport_v1_t* const transports[] = {&transport};

__attribute__((visibility("default")))
const tuttiPlugin_v1_t tuttiPlugin_v1 = {"bigblob", NULL, NULL, NULL, 0, transports, 1};
