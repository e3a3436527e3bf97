// GPT model configs as the JSON a checkpoint stores, read back with errors naming the source, and
// the keys a checkpoint's model must match for a run to resume from it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/nn/gpt.h"

namespace tandem::train {

nlohmann::json model_config_to_json(const nn::GPTConfig& c);
// UserError naming `source` and the field when a field is missing or ill-typed.
nn::GPTConfig model_config_from_json(const nlohmann::json& j, const std::string& source);
// The model keys a checkpoint must match to be resumed.
std::vector<std::string> model_compat_keys();

}  // namespace tandem::train
