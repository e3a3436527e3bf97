// The model's matmul FLOPs, written once from the one block description (GPT-2's or Llama's):
// what the performance model divides by the GEMM rate, and what benchmarks quote as a step's work.
#pragma once

#include "tandem/nn/gpt.h"

namespace tandem::perf {

// Matmul FLOPs a token of one block's attention forward over sequences of T: the projections (q,
// k and v, then out) and the scores and weighted sum.
double attention_flops_per_token(const nn::GPTConfig& m, double T);
// Matmul FLOPs a token of one block's MLP forward: the up projection(s) (GPT-2's fc; Llama's gate
// and up) and down.
double mlp_flops_per_token(const nn::GPTConfig& m);
// Matmul FLOPs a token of the LM head's forward (C x V).
double head_flops_per_token(const nn::GPTConfig& m);
// A training step's matmul FLOPs a token at sequence length T, forward and backward (the
// backward twice the forward), no recomputation: every block and the head.
double step_flops_per_token(const nn::GPTConfig& m, double T);

}  // namespace tandem::perf
