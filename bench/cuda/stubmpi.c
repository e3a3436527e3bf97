/* A one-process stand-in for Open MPI 4.x's libmpi.so.40: only what the emitted tandem CUDA
 * programs call (nm -D: MPI_Init, _Comm_rank, _Comm_size, _Comm_split_type, _Bcast, _Barrier,
 * _Reduce, _Allreduce, _Abort, _Finalize) and the predefined handles they copy-relocate, with
 * Open MPI's sizes. Used by run.sh only if the bundled Open MPI cannot initialise a singleton. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* The predefined handles: the programs take their addresses, so each must exist and be at least
 * as large as Open MPI's object (the linker copies it into the program). */
char ompi_mpi_comm_world[0x200] __attribute__((aligned(64)));
char ompi_mpi_byte[0x200] __attribute__((aligned(64)));
char ompi_mpi_float[0x200] __attribute__((aligned(64)));
char ompi_mpi_int[0x200] __attribute__((aligned(64)));
char ompi_mpi_info_null[0x100] __attribute__((aligned(64)));
char ompi_mpi_op_sum[0x800] __attribute__((aligned(64)));
char ompi_mpi_op_max[0x800] __attribute__((aligned(64)));
static size_t size_of(void* dt) {
  if (dt == (void*)ompi_mpi_byte) return 1;
  if (dt == (void*)ompi_mpi_float || dt == (void*)ompi_mpi_int) return 4;
  fprintf(stderr, "stubmpi: unknown datatype\n");
  abort();
}
int MPI_Init(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "stubmpi: one-process MPI stand-in\n");
  return 0;
}
int MPI_Finalize(void) { return 0; }
int MPI_Comm_rank(void* c, int* r) {
  (void)c;
  *r = 0;
  return 0;
}
int MPI_Comm_size(void* c, int* s) {
  (void)c;
  *s = 1;
  return 0;
}
int MPI_Comm_split_type(void* c, int t, int k, void* info, void** out) {
  (void)t;
  (void)k;
  (void)info;
  *out = c;
  return 0;
}
int MPI_Bcast(void* b, int n, void* dt, int root, void* c) {
  (void)b;
  (void)n;
  (void)dt;
  (void)root;
  (void)c;
  return 0;
}
int MPI_Barrier(void* c) {
  (void)c;
  return 0;
}
int MPI_Reduce(const void* s, void* r, int n, void* dt, void* op, int root, void* c) {
  (void)op;
  (void)root;
  (void)c;
  /* One rank: the result is the input; (void*)1 is Open MPI's MPI_IN_PLACE. */
  if ((const void*)s != (const void*)1 && n > 0) memmove(r, s, (size_t)n * size_of(dt));
  return 0;
}
int MPI_Allreduce(const void* s, void* r, int n, void* dt, void* op, void* c) {
  return MPI_Reduce(s, r, n, dt, op, 0, c);
}
int MPI_Abort(void* c, int code) {
  (void)c;
  fflush(stdout);
  _exit(code);
}
