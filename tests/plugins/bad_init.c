/* A plugin whose init crashes (BAD_INIT=crash), hangs (=hang) or fails (otherwise; =daemon first
 * forks a helper that outlives it by 8 s): refused with
 * the reason, and never run in the loading process (tutti tries every init in a child first). */
#include <stdlib.h>
#include <string.h>
#include <tutti/plugin.h>
#include <unistd.h>

#include "inert_backend.h"

static tuttiResult_t init(void** state, tuttiError_v1_t* err) {
  (void)state;
  const char* how = getenv("BAD_INIT");
  if (how != NULL && strcmp(how, "crash") == 0) {
    volatile int* nowhere = NULL;
    *nowhere = 1;
  }
  if (how != NULL && strcmp(how, "hang") == 0) {
    for (;;) pause();
  }
  if (how != NULL && strcmp(how, "daemon") == 0 && fork() == 0) {
    sleep(8); /* a helper left running: it holds what the init inherited */
    _exit(0);
  }
  strcpy(err->message, "no device here");
  return TUTTI_ERR_UNAVAILABLE;
}

static const tuttiBackend_v1_t never = {
    "never",      TUTTI_SCOPE_ANY_HOST, 0,           1u << TUTTI_DEVICE_CPU, NULL,
    inert_create, inert_destroy,        inert_abort,
};
static const tuttiBackend_v1_t* const backends[] = {&never};

__attribute__((visibility("default")))
const tuttiPlugin_v1_t tuttiPlugin_v1 = {"badinit", init, NULL, backends, 1, NULL, 0};
