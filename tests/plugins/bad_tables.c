/* A plugin whose backend has no create: refused, naming the backend and what it lacks. */
#include <stddef.h>
#include <tutti/plugin.h>

#include "inert_backend.h"

static const tuttiBackend_v1_t incomplete = {
    "incomplete",      TUTTI_SCOPE_ANY_HOST, 0,           1u << TUTTI_DEVICE_CPU, NULL,
    NULL /* create */, inert_destroy,        inert_abort,
};
static const tuttiBackend_v1_t* const backends[] = {&incomplete};

__attribute__((visibility("default")))
const tuttiPlugin_v1_t tuttiPlugin_v1 = {"incomplete", NULL, NULL, backends, 1, NULL, 0};
