// `tandem sample`: generates text from a checkpoint's model, one token at a time after a prompt:
// bytes, or subword tokens decoded with the tokenizer its data recorded (or --tokenizer).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "choices.h"
#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/core/rng.h"
#include "tandem/data/tokenizer.h"
#include "tandem/nn/sampling.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct SampleFlags {
  std::string checkpoint;
  std::string prompt;
  std::string tokenizer;
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 0;
  uint64_t seed = 1;
  DType precision = DType::F32;
};

}  // namespace

void add_sample(CLI::App& app) {
  auto f = std::make_shared<SampleFlags>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", f->checkpoint,
                  "Checkpoint folder (written by tandem train --save)")
      ->required();
  cmd->add_option("--prompt", f->prompt, "Text to continue")->capture_default_str();
  cmd->add_option(
      "--tokenizer", f->tokenizer,
      "SentencePiece .model or tokenizer.json (GPT-2's, Llama 3's, Llama 2's) to decode with "
      "(default: the one the checkpoint's data recorded)");
  cmd->add_option("--tokens", f->tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", f->temperature,
                  "Sampling temperature (0: always the most likely byte)")
      ->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Sample among the k most likely bytes (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the sampling")->capture_default_str();
  add_precision_flag(cmd, f->precision);
  cmd->callback([f] {
    if (f->tokens < 0) user_error("--tokens {} must be 0 or more", f->tokens);
    if (!(f->temperature >= 0) || !std::isfinite(f->temperature))
      user_error("--temperature {} must be a finite number, 0 or more", f->temperature);
    if (f->top_k < 0) user_error("--top-k {} must be 0 or more", f->top_k);
    const train::LoadedModel model = train::load_model(f->checkpoint, f->precision);
    const nn::GPTConfig& c = model.config;
    const std::unique_ptr<data::Tokenizer> tok =
        train::model_tokenizer(model, f->tokenizer, f->checkpoint);
    std::vector<int32_t> text;
    if (tok) {
      text = tok->encode(f->prompt);
      if (tok->bos_id() >= 0)
        text.insert(text.begin(), tok->bos_id());  // a document starts with it, as in the shards
      else if (text.empty() && tok->eos_id() >= 0)
        text.push_back(tok->eos_id());  // a document start
    } else {
      for (unsigned char ch : f->prompt) text.push_back(ch);
    }
    if (text.empty()) text.push_back('\n');  // something to condition on
    std::fwrite(f->prompt.data(), 1, f->prompt.size(), stdout);
    std::fflush(stdout);
    // Subword output is printed as the decoded text grows: a character spread over byte tokens
    // appears once all of it has been drawn.
    // The new text is what the whole decodes to past what the prompt's tokens decode to: decoded
    // alone, its first word would lose the space a decoder strips at the start of a text
    // (SentencePiece's and Llama 2's tokenizer.json's).
    const std::string prompt_text = tok ? tok->decode(text) : "";
    std::string printed;
    auto print_new = [&](bool last) {
      if (!tok) return;
      const std::string whole = tok->decode(text);
      if (whole.compare(0, prompt_text.size(), prompt_text) != 0) return;
      const std::string now = whole.substr(prompt_text.size());
      if (now.compare(0, printed.size(), printed) != 0 ||
          (!last && now.find("\xEF\xBF\xBD", printed.size()) != std::string::npos))
        return;  // a partial character decodes to U+FFFD for now
      std::fwrite(now.data() + printed.size(), 1, now.size() - printed.size(), stdout);
      std::fflush(stdout);
      printed = now;
    };
    // The context is the last seq_len bytes; activations are allocated per context length.
    std::unique_ptr<nn::GPTActivations> acts;
    std::unique_ptr<nn::Workspace> ws;
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));  // the last position's
    for (int i = 0; i < f->tokens; ++i) {
      const int T = static_cast<int>(std::min<size_t>(text.size(), static_cast<size_t>(c.seq_len)));
      if (!acts || acts->seq() != T) {
        acts = std::make_unique<nn::GPTActivations>(c, 1, T);
        ws = std::make_unique<nn::Workspace>(c, 1, T);
      }
      const nn::Batch b{text.data() + (text.size() - static_cast<size_t>(T)), nullptr, 1, T};
      nn::gpt_forward(model.params, *acts, *ws, b, nn::StepRng{0, 0, 0, false});
      nn::final_logits(c, model.params.final_stage(), acts->head, *ws, 1, T, T - 1, 1,
                       logits.data());
      const int next = nn::sample_token(logits.data(), c.vocab_size, f->temperature, f->top_k,
                                        random_uniform(f->seed, static_cast<uint64_t>(i)));
      text.push_back(next);
      if (tok) {
        print_new(false);
      } else {
        std::fputc(next, stdout);
        std::fflush(stdout);
      }
    }
    print_new(true);
    std::fputc('\n', stdout);
  });
}

}  // namespace tandem::cli
