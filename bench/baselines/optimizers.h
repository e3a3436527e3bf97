// The optimizer baselines of the step benchmarks, written as the loops a PyTorch DDP user's fused
// optimizer runs after MPI_Allreduce: one vectorised pass over the whole tensor (AdamW), or two
// (LAMB: the trust ratio needs whole-tensor norms first), compiled as their own translation unit
// with the project's flags; and the user-defined MPI_Op such a user writes to sum bf16 gradients.
#pragma once

#include <cstdint>

#include "tandem/comm/mpi.h"

namespace tandem::bench {

struct AdamHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  float step = 1.0f;        // 1 for the first step
  float grad_scale = 1.0f;  // 1/ranks: averages the summed gradient
};

// AdamW over n elements, in place: m, v and w updated from the summed gradient g.
//   g1 = grad_scale g, m1 = b1 m + (1 - b1) g1, v1 = b2 v + (1 - b2) g1^2,
//   w1 = w - lr (m1 / bc1 / (sqrt(v1 / bc2) + eps) + wd w), bc = 1 - beta^step.
void adamw_f32(const float* g, float* w, float* m, float* v, int64_t n, const AdamHyper& h);
void adamw_bf16(const uint16_t* g, float* w, float* m, float* v, int64_t n, const AdamHyper& h);

// LAMB over n elements, in place, with `r` scratch of n floats (apex's FusedLAMB in two passes):
// pass 1 updates m and v, writes Adam's direction r = mhat / (sqrt(vhat) + eps) + wd w and sums
// ||w||^2 and ||r||^2; pass 2 applies w1 = w - lr trust r, trust = ||w|| / ||r|| (1 when either
// is 0).
void lamb_f32(const float* g, float* w, float* m, float* v, float* r, int64_t n,
              const AdamHyper& h);
void lamb_bf16(const uint16_t* g, float* w, float* m, float* v, float* r, int64_t n,
               const AdamHyper& h);

// The MPI_Op a user defines to sum bf16 gradients (MPI has no bf16 type): elements travel as
// MPI_UINT16_T, are widened to f32, added, and rounded back to nearest even. Created on first use;
// MPI must be initialised.
MPI_Op bf16_sum_op();

}  // namespace tandem::bench
