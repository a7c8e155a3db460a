/* A plugin naming one backend twice, in two cases ("dupe", "DUPE"; names ignore case): refused
 * before anything of it registers. */
#include <stddef.h>
#include <tutti/plugin.h>

static tuttiResult_t create(void* s, const tuttiBackendArgs_v1_t* a, void** c, tuttiError_v1_t* e) {
  (void)s;
  (void)a;
  (void)c;
  (void)e;
  return TUTTI_ERR_INTERNAL;
}
static void destroy(void* comm) {
  (void)comm;
}
static void abort_comm(void* comm, const char* reason) {
  (void)comm;
  (void)reason;
}

static const tuttiBackend_v1_t lower = {
    "dupe", TUTTI_SCOPE_ANY_HOST, 0, 1u << TUTTI_DEVICE_CPU, NULL, create, destroy, abort_comm,
};
static const tuttiBackend_v1_t upper = {
    "DUPE", TUTTI_SCOPE_ANY_HOST, 0, 1u << TUTTI_DEVICE_CPU, NULL, create, destroy, abort_comm,
};
static const tuttiBackend_v1_t* const backends[] = {&lower, &upper};

__attribute__((visibility("default")))
const tuttiPlugin_v1_t tuttiPlugin_v1 = {"dupnames", NULL, NULL, backends, 2, NULL, 0};
