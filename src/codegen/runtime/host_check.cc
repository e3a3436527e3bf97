// Compiles the CPU runtime (cpu.h) with the host compiler and the library's flags, so that an
// error in it fails the build rather than the first program the JIT compiles.
#include "cpu.h"
