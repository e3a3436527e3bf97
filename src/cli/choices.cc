// The choices flags name, parsed from their text: the one place those names are compared.
#include "choices.h"

#include "tandem/core/error.h"

namespace tandem::cli {

comm::Backend parse_backend(const std::string& text) {
  for (comm::Backend b : {comm::Backend::Thread, comm::Backend::Mpi})
    if (text == comm::backend_name(b)) return b;
  user_error("--backend '{}' is not a backend; choose thread or mpi", text);
}

exec::RunnerKind parse_executor(const std::string& text) {
  return exec::runner_kind_from_name(text, "--executor");
}

parallel::OptimizerKind parse_optimizer(const std::string& text) {
  for (parallel::OptimizerKind k : {parallel::OptimizerKind::AdamW, parallel::OptimizerKind::Lamb})
    if (text == parallel::optimizer_name(k)) return k;
  user_error("--optimizer {}: the optimizers are adamw and lamb", text);
}

DType parse_grad_dtype(const std::string& text) {
  for (DType t : {DType::F32, DType::BF16})
    if (text == dtype_name(t)) return t;
  user_error("--grad-dtype {}: the gradient dtypes are f32 and bf16", text);
}

parallel::GradExchange parse_grad_exchange(const std::string& text) {
  for (parallel::GradExchange e : {parallel::GradExchange::Overlap, parallel::GradExchange::After})
    if (text == parallel::grad_exchange_name(e)) return e;
  user_error(
      "--grad-exchange {}: the exchanges are overlap (with the backward) and after (the backward)",
      text);
}

std::optional<ooc::TierSpec> parse_optimizer_state(const std::string& text) {
  if (text == "memory") return std::nullopt;
  try {
    return ooc::TierSpec::parse(text);
  } catch (const UserError&) {
    user_error(
        "--optimizer-state {}: write memory, host (a slow tier in host memory) or file:DIR (an "
        "O_DIRECT "
        "file in folder DIR)",
        text);
  }
}

std::optional<ooc::TierSpec> parse_model_state(const std::string& text) {
  if (text == "memory") return std::nullopt;
  try {
    return ooc::TierSpec::parse(text);
  } catch (const UserError&) {
    user_error(
        "--model-state {}: write memory, host (a slow tier in host memory) or file:DIR (an "
        "O_DIRECT file in folder DIR)",
        text);
  }
}

ooc::TierSpec parse_slow_tier(const std::string& text) {
  try {
    return ooc::TierSpec::parse(text);
  } catch (const UserError& e) {
    user_error("--slow-tier: {}", e.what());
  }
}

}  // namespace tandem::cli
