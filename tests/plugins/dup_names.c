/* A plugin naming one backend twice, in two cases ("dupe", "DUPE"; names ignore case): refused
 * before anything of it registers. */
#include <stddef.h>
#include <tutti/plugin.h>

#include "inert_backend.h"

static const tuttiBackend_v1_t lower = {
    "dupe",       TUTTI_SCOPE_ANY_HOST, 0,           1u << TUTTI_DEVICE_CPU, NULL,
    inert_create, inert_destroy,        inert_abort,
};
static const tuttiBackend_v1_t upper = {
    "DUPE",       TUTTI_SCOPE_ANY_HOST, 0,           1u << TUTTI_DEVICE_CPU, NULL,
    inert_create, inert_destroy,        inert_abort,
};
static const tuttiBackend_v1_t* const backends[] = {&lower, &upper};

__attribute__((visibility("default")))
const tuttiPlugin_v1_t tuttiPlugin_v1 = {"dupnames", NULL, NULL, backends, 2, NULL, 0};
