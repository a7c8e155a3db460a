/* A shared object that exports no tuttiPlugin_v<N>. */
__attribute__((visibility("default"))) int something_else(void) {
  return 42;
}
