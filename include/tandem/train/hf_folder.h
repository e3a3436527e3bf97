// Checkpoints exchanged with Hugging Face (io/hf_folder.h): `tandem export --format hf` writes a
// checkpoint's weights as a GPT2LMHeadModel folder (a GPT-2 model) or a LlamaForCausalLM folder
// (a Llama model; Qwen2ForCausalLM with q/k/v biases), and `tandem train --init-from` starts a
// run from such a folder (its weights, a fresh optimizer, step 0).
//
// Both directions stream one tensor at a time through one description of where each of Hugging
// Face's tensors sits in tandem's (src/train/hf_folder.cc, hf_layout): GPT-2's are tandem's,
// prefixed; Llama's fused tensors are cut into nn.Linear's (out, in) matrices: attn.c_attn
// (C, q | k | v) into q_proj, k_proj and v_proj (and their biases), mlp.c_fc (C, gate | up) into
// gate_proj and up_proj, the two (in, out) projections transposed into o_proj and down_proj.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/nn/gpt.h"

namespace tandem::train {

struct HfExport {
  std::string checkpoint;          // the checkpoint folder read (a series' newest step)
  int64_t step = 0;                // the step it was saved at
  nn::GPTConfig config;            // its model
  std::vector<std::string> files;  // the files written into the folder, in order
};

// Writes the weights of the checkpoint `checkpoint` names (a folder, or the newest of a --save
// series) into folder `out_dir`: model.safetensors (GPT2LMHeadModel's or LlamaForCausalLM's
// names, f32, a tied LM head left out), config.json, and the tokenizer the checkpoint's data
// recorded, as tokenizer.model (or tokenizer.json), checked against its recorded SHA-256;
// `tokenizer`, when given, is used instead of the recorded file (one moved since). The tensors
// are read and written one at a time. `out_dir` is replaced whole and atomically: a failure
// leaves it as it was. A folder holding files an export does not write is refused, never emptied.
HfExport export_hf(const std::string& checkpoint, const std::string& out_dir,
                   const std::string& tokenizer = "");

// The model of the Hugging Face folder `dir`, from its config.json: tandem's config with
// seq_len = max_positions = n_positions (Llama: max_position_embeddings) and GPT-2's dropout
// (a Llama folder's: 0; its config has no residual dropout). A missing folder or file, a config
// tandem cannot compute, or a LayerNorm epsilon other than tandem's is a UserError.
nn::GPTConfig hf_model_config(const std::string& dir);

// config.json's names for the sizes every family has, in the folder's family (GPT-2's n_layer,
// Llama's num_hidden_layers), for messages that name the field.
struct HfFieldNames {
  const char *vocab, *layers, *heads, *d_model, *positions;
};
HfFieldNames hf_field_names(nn::Arch arch);

// A field of the block (the family, its sizes but the vocabulary and positions, the Llama
// fields) in which a folder's model and a run's differ: config.json's name and value, the run's
// value, and the flag that sets it ("--kv-heads", value "4"). Only the family when that differs.
struct HfFieldDifference {
  std::string field, folder_value, run_value, flag;
};
std::vector<HfFieldDifference> hf_block_differences(const nn::GPTConfig& folder,
                                                    const nn::GPTConfig& run);

}  // namespace tandem::train
