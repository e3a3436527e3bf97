// The per-process cache of training corpora, so that in-process ranks share one copy.
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>

#include "tandem/data/token_corpus.h"

namespace tandem::data {

std::shared_ptr<const Corpus> shared_corpus(const std::string& data, size_t synthetic_bytes,
                                            double validation_fraction) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Corpus>> cache;
  const size_t bytes = synthetic_bytes > 0 ? synthetic_bytes : kSyntheticBytes;
  const std::string key = fmt::format("{}|{}|{}", data, bytes, validation_fraction);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto corpus = std::make_shared<const Corpus>(
      data.empty()            ? synthetic_corpus(bytes, kSyntheticSeed, validation_fraction)
      : is_shard_folder(data) ? load_shard_corpus(data)
                              : load_text_corpus(data, validation_fraction));
  if (cache.size() > 8) cache.clear();
  cache[key] = corpus;
  return corpus;
}

}  // namespace tandem::data
