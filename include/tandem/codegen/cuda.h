// The CUDA + NCCL emitter: one standalone GPU program per lowered plan, from the same plan walker
// (src/codegen/walker.h) as the CPU JIT's C++ (never a program special-cased by name). Built with
// nvcc against NCCL, cuBLAS and MPI; run as `mpirun -np N ./prog`.
//
// What the source looks like.
// - core/formulas.h's text (the element formulas the interpreter is compiled from, __host__
//   __device__ under nvcc), the ABI of codegen/abi.h, and the runtime files of
//   src/codegen/runtime/ (cuda_prefix.cuh, cuda_runtime.cuh, cuda_main.cu) around the plan's
//   steps and tables.
// - A fused Loop becomes a __global__ kernel, grid-stride over the loop's domain with every
//   operand reached by its index map; where every operand is contiguous and 16-byte aligned
//   (checked at launch), each thread moves 16-byte vectors (float4 / eight 16-bit values) and
//   computes them element by element. Its host driver launches it on the compute stream.
// - Collectives call NCCL on a communication stream, ordered against the compute stream by
//   events (never a host synchronisation). A fused collective (a hook) runs chunk by chunk:
//   each chunk's parts are reduced (grouped ncclReduce, one per owner), the hook's kernel runs
//   on the reduced chunk on the compute stream, and the chunk is gathered (grouped
//   ncclBroadcast), so the computation of chunk i overlaps the reduction of chunk i + 1. This
//   is NCCL's host API; the device-side API (nccl_device.h) is not used.
// - Matmuls call cuBLAS SGEMM on the compute stream; inside an overlap pipeline each row block's
//   collective starts on the communication stream as soon as its GEMM is done, while the next
//   block's GEMM runs.
// - Send/Recv between groups are ncclSend/ncclRecv on the world communicator.
// - main(): MPI and NCCL set-up (ncclGetUniqueId broadcast over MPI, ncclCommSplit per group),
//   device buffers for what the plan stores, a check against the reference interpreter's results
//   (written by `tandem emit` into check/np<N>/), and a timing loop.
//
// Results. + - * / sqrt and the 16-bit conversions round exactly as on the CPU (nvcc -fmad=false);
// exp, log, tanh, pow come from CUDA's math library (a few ulp from glibc's); NCCL reduces 16-bit
// values in their own dtype and whole-tensor sums are folded with atomics in an order the CPU
// does not use. The check therefore uses tune's tolerances, not bitwise equality.
#pragma once

#include <string>

#include "tandem/schedule/plan.h"

namespace tandem::codegen {

struct CudaProgram {
  std::string source;    // the .cu file
  std::string makefile;  // builds it with nvcc: `make` (CUDA_HOME, ARCH, MPI_* may be overridden)
};

// The program for `plan`; `name` names the executable and the .cu file (name.cu).
// Deterministic: the same plan gives the same text.
CudaProgram emit_cuda(const schedule::Plan& plan, const std::string& name);

}  // namespace tandem::codegen
