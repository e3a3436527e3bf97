// The per-process cache of training corpora, so that in-process ranks share one copy.
#include "corpus_cache.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>

#include "tandem/data/token_corpus.h"

namespace tandem::train::detail {

std::shared_ptr<const data::Corpus> corpus_for(const TrainConfig& c) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const data::Corpus>> cache;
  const size_t bytes = c.synthetic_bytes > 0 ? c.synthetic_bytes : data::kSyntheticBytes;
  const std::string key = fmt::format("{}|{}|{}", c.data, bytes, c.validation_fraction);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto corpus = std::make_shared<const data::Corpus>(
      c.data.empty() ? data::synthetic_corpus(bytes, data::kSyntheticSeed, c.validation_fraction)
      : data::is_shard_folder(c.data) ? data::load_shard_corpus(c.data)
                                      : data::load_text_corpus(c.data, c.validation_fraction));
  if (cache.size() > 8) cache.clear();
  cache[key] = corpus;
  return corpus;
}

}  // namespace tandem::train::detail
