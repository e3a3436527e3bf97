// The choices flags name, parsed from their text: the one place those names are compared.
#include "choices.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "tandem/core/bf16.h"
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

train::Auto<DType> parse_grad_dtype(const std::string& text) {
  if (text == "auto") return {};
  for (DType t : {DType::F32, DType::BF16})
    if (text == dtype_name(t)) return t;
  user_error(
      "--grad-dtype {}: the gradient dtypes are f32 and bf16 (or auto: the autotuner's choice)",
      text);
}

train::Auto<DType> parse_tp_dtype(const std::string& text) {
  if (text == "auto") return {};
  for (DType t : {DType::F32, DType::BF16})
    if (text == dtype_name(t)) return t;
  user_error(
      "--tp-dtype {}: the tensor-parallel dtypes are f32 and bf16 (or auto: the autotuner's "
      "choice)",
      text);
}

DType parse_precision(const std::string& text) {
  if (text == "fp32") return DType::F32;
  if (text == "bf16") return DType::BF16;
  if (text == "auto") return bf16_native() ? DType::BF16 : DType::F32;
  user_error(
      "--precision {}: the precisions are fp32, bf16 and auto (bf16 where the CPU has "
      "AVX512_BF16)",
      text);
}

CLI::Option* add_precision_flag(CLI::App* cmd, DType& target) {
  return add_choice(cmd, "--precision", target, parse_precision,
                    "The matmuls' type: fp32, bf16 (bf16 operands, f32 accumulation, f32 master "
                    "weights; docs/training.md) or auto (bf16 where the CPU has AVX512_BF16)",
                    "fp32");
}

nn::AttentionKernel parse_attention(const std::string& text) {
  for (nn::AttentionKernel k : {nn::AttentionKernel::Fused, nn::AttentionKernel::Unfused})
    if (text == nn::attention_kernel_name(k)) return k;
  user_error(
      "--attention {}: the attention kernels are fused (blocked, saves a value a row: the "
      "default) and unfused (saves the T x T softmax: the reference)",
      text);
}

CLI::Option* add_attention_flag(CLI::App* cmd, nn::AttentionKernel& target) {
  return add_choice(cmd, "--attention", target, parse_attention,
                    "The attention kernel: fused (blocked, flash style: saves each row's "
                    "log-sum-exp, memory linear in --seq-len) or unfused (saves the softmax, "
                    "heads x seq-len x seq-len a sample: the reference; docs/training.md)",
                    nn::attention_kernel_name(target));
}

parallel::GradExchange parse_grad_exchange(const std::string& text) {
  for (parallel::GradExchange e : {parallel::GradExchange::Overlap, parallel::GradExchange::After})
    if (text == parallel::grad_exchange_name(e)) return e;
  user_error(
      "--grad-exchange {}: the exchanges are overlap (with the backward) and after (the backward)",
      text);
}

parallel::Sharding parse_sharding(const std::string& text) {
  for (parallel::Sharding s : {parallel::Sharding::Moments, parallel::Sharding::Weights})
    if (text == parallel::sharding_name(s)) return s;
  user_error(
      "--shard {}: the data-parallel ranks shard the moments (ZeRO-1) or the weights (ZeRO-3: "
      "weights, gradients and moments)",
      text);
}

namespace {

// --optimizer-state and --model-state: "memory" (unset), "host" or "file:DIR".
std::optional<ooc::TierSpec> parse_state_tier(const std::string& flag, const std::string& text) {
  if (text == "memory") return std::nullopt;
  try {
    return ooc::TierSpec::parse(text);
  } catch (const UserError&) {
    user_error(
        "{} {}: write memory, host (a slow tier in host memory) or file:DIR (an O_DIRECT file in "
        "folder DIR)",
        flag, text);
  }
}

}  // namespace

std::optional<ooc::TierSpec> parse_optimizer_state(const std::string& text) {
  return parse_state_tier("--optimizer-state", text);
}

std::optional<ooc::TierSpec> parse_model_state(const std::string& text) {
  return parse_state_tier("--model-state", text);
}

train::Auto<int> parse_resident_blocks(const std::string& text) {
  if (text == "auto") return {};
  int n = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0)
    user_error("--resident-blocks {}: give a count of blocks (0 or more) or auto", text);
  return n;
}

train::Auto<int> parse_gather_ahead(const std::string& text) {
  if (text == "auto") return {};
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1)
    user_error("--gather-ahead {}: give a count of blocks (1 or more) or auto", text);
  return n;
}

bool parse_grid(const std::string& text) {
  if (text == "auto") return true;
  user_error(
      "--grid {}: the one value is auto (the fastest grid of --ranks N that `tandem plan` finds); "
      "give a grid with --dp, --tp and --pp",
      text);
}

parallel::StageLayers parse_stage_layers(const std::string& text) {
  std::vector<int> counts;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(',', begin), text.size());
    int n = 0;
    const char* first = text.data() + begin;
    const char* last = text.data() + end;
    const auto [stop, ec] = std::from_chars(first, last, n);
    if (first == last || ec != std::errc() || stop != last)
      user_error(
          "--stage-layers {}: '{}' is not a count of layers; give one integer a stage, separated "
          "by commas (e.g. 3,5)",
          text, std::string(first, last));
    counts.push_back(n);
    if (end == text.size()) break;
    begin = end + 1;
  }
  if (counts.size() > static_cast<size_t>(parallel::StageLayers::kMostStages))
    user_error(
        "--stage-layers {}: {} counts; a split names at most {} stages (a longer pipeline splits "
        "its layers evenly)",
        text, counts.size(), parallel::StageLayers::kMostStages);
  return counts;
}

ooc::TierSpec parse_slow_tier(const std::string& text) {
  try {
    return ooc::TierSpec::parse(text);
  } catch (const UserError& e) {
    user_error("--slow-tier: {}", e.what());
  }
}

namespace {

// What is wrong with `text` as an integer of the kind `type` names (CLI11's "INT" or "UINT"), or
// "": text that is not an integer at all is left to CLI11's own message.
std::string number_problem(const std::string& type, const std::string& text) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  const bool negative = !text.empty() && text[0] == '-';
  const bool digits = text.size() > (negative ? 1u : 0u) &&
                      text.find_first_not_of("0123456789", negative ? 1 : 0) == std::string::npos;
  if (!digits) return "";
  if (type == "UINT" && negative) return "must not be negative";
  uint64_t u = 0;
  int64_t i = 0;
  const std::from_chars_result r =
      type == "UINT" ? std::from_chars(begin, end, u) : std::from_chars(begin, end, i);
  if (r.ec == std::errc::result_out_of_range) return "is out of range";
  return "";
}

}  // namespace

void check_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string full = option->get_type_name();
    const std::string type = full.substr(0, full.find(':'));
    if (type != "INT" && type != "UINT") continue;
    option->check(CLI::Validator(
        [type](std::string& text) {
          const std::string problem = number_problem(type, text);
          return problem.empty() ? problem : fmt::format("'{}' {}", text, problem);
        },
        "", "number"));
  }
  for (CLI::App* sub : app.get_subcommands({})) check_numbers(*sub);
}

}  // namespace tandem::cli
