/* A plugin built for an ABI version tutti does not know yet (7): refused as too new. */
#include <tutti/plugin.h>

typedef struct {
  const char* name;
} FuturePlugin;

__attribute__((visibility("default"))) const FuturePlugin tuttiPlugin_v7 = {"future"};
