/* Callgrind's client requests for a Python process (ctypes): run it under
   valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no and wrap
   each measured phase in cg_begin() / cg_end("phase"), one dump per phase.
   Build: cc -O2 -shared -fPIC -o libcgctl.so cgctl.c */
#include <valgrind/callgrind.h>

void cg_begin(void) {
  CALLGRIND_START_INSTRUMENTATION;
  CALLGRIND_ZERO_STATS;
  CALLGRIND_TOGGLE_COLLECT;
}

void cg_end(const char *phase) {
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS_AT(phase);
  CALLGRIND_STOP_INSTRUMENTATION;
}
