// Checkpoints exchanged with Hugging Face in GPT-2's layout (io/hf_gpt2.h): `tandem export
// --format hf` writes a checkpoint's weights as a GPT2LMHeadModel folder, and `tandem train
// --init-from` starts a run from such a folder (its weights, a fresh optimizer, step 0).
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
// series) into folder `out_dir`: model.safetensors (GPT2LMHeadModel's names, f32, the LM head
// tied and left out), config.json, and the tokenizer the checkpoint's data recorded, as
// tokenizer.model (or tokenizer.json), checked against its recorded SHA-256; `tokenizer`, when
// given, is used instead of the recorded file (one moved since). The tensors are read and written
// one at a time. `out_dir` is replaced whole and atomically: a failure leaves it as it was. A
// folder holding files an export does not write is refused, never emptied.
HfExport export_hf_gpt2(const std::string& checkpoint, const std::string& out_dir,
                        const std::string& tokenizer = "");

// The model of the Hugging Face GPT-2 folder `dir`, from its config.json: tandem's config with
// seq_len = max_positions = n_positions and the config's dropout. A missing folder or file, a
// config tandem cannot compute, or a LayerNorm epsilon other than tandem's is a UserError.
nn::GPTConfig hf_model_config(const std::string& dir);

}  // namespace tandem::train
