// Flags that name one of a few choices (a backend, an executor, an optimizer, a tier): each text
// parsed once, here, into the value the configuration holds, every refusal naming its flag.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/backend.h"
#include "tandem/core/dtype.h"
#include "tandem/exec/runner.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/train/auto.h"

namespace tandem::cli {

comm::Backend parse_backend(const std::string& text);      // --backend thread|mpi
exec::RunnerKind parse_executor(const std::string& text);  // --executor compiled|plan|reference
parallel::OptimizerKind parse_optimizer(const std::string& text);  // --optimizer adamw|lamb
train::Auto<DType> parse_grad_dtype(const std::string& text);      // --grad-dtype f32|bf16|auto
train::Auto<DType> parse_tp_dtype(const std::string& text);        // --tp-dtype f32|bf16|auto
// --precision fp32|bf16|auto: the matmuls' type; auto is bf16 where core/bf16.h says bf16 is
// native on this CPU, else fp32.
DType parse_precision(const std::string& text);
// --attention fused|unfused: the attention kernel (nn::AttentionKernel).
nn::AttentionKernel parse_attention(const std::string& text);
parallel::GradExchange parse_grad_exchange(
    const std::string& text);                                // --grad-exchange overlap|after
parallel::Sharding parse_sharding(const std::string& text);  // --shard moments|weights
std::optional<ooc::TierSpec> parse_optimizer_state(
    const std::string& text);                                             // memory|host|file:DIR
std::optional<ooc::TierSpec> parse_model_state(const std::string& text);  // memory|host|file:DIR
ooc::TierSpec parse_slow_tier(const std::string& text);           // --slow-tier host|file:DIR
train::Auto<int> parse_resident_blocks(const std::string& text);  // --resident-blocks N|auto
train::Auto<int> parse_gather_ahead(const std::string& text);     // --gather-ahead N|auto
bool parse_grid(const std::string& text);  // --grid auto (the one value: true)
// --stage-layers A,B,...: the layers of each pipeline stage, integers separated by commas (their
// count and sum are checked against --pp and the model by TrainConfig::validate).
parallel::StageLayers parse_stage_layers(const std::string& text);

// Adds `flag`, whose text `parse` turns into `target` when the command line is parsed (a refusal
// is the UserError `parse` throws); `shown` is the default --help prints.
template <typename T>
CLI::Option* add_choice(CLI::App* cmd, const std::string& flag, T& target,
                        T (*parse)(const std::string&), std::string help, std::string_view shown) {
  return cmd
      ->add_option_function<std::string>(
          flag, [&target, parse](const std::string& text) { target = parse(text); },
          std::move(help))
      ->default_str(std::string(shown));
}

// --precision fp32|bf16|auto into `target` (fp32 by default): train, plan, eval and sample.
CLI::Option* add_precision_flag(CLI::App* cmd, DType& target);

// --attention fused|unfused into `target` (fused by default): train and plan.
CLI::Option* add_attention_flag(CLI::App* cmd, nn::AttentionKernel& target);

// Adds to every integer flag of `app` and its subcommands a check of its text before CLI11
// converts it (CLI11 clamps a value past 64 bits to the largest, and reads "-1" into an unsigned
// flag as 2^64 - 1): a value past 64 bits, or a negative one for an unsigned flag, is refused
// naming the flag. The ranges each setting allows (and real numbers' finiteness) are checked
// later, by the config that holds it.
void check_numbers(CLI::App& app);

}  // namespace tandem::cli
