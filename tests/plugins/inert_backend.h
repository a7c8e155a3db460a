/* The functions of a backend that never makes a communicator, for the test plugins that tutti
 * refuses before (or without) calling them. Static: each plugin is a library of its own. */
#pragma once
#include <tutti/plugin.h>

__attribute__((unused)) static tuttiResult_t inert_create(void* s, const tuttiBackendArgs_v1_t* a,
                                                          void** c, tuttiError_v1_t* e) {
  (void)s;
  (void)a;
  (void)c;
  (void)e;
  return TUTTI_ERR_INTERNAL;
}
static void inert_destroy(void* comm) {
  (void)comm;
}
static void inert_abort(void* comm, const char* reason) {
  (void)comm;
  (void)reason;
}
