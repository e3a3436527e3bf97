// GPT-2's byte-level BPE from a Hugging Face tokenizer.json: the file checked to be that kind and
// read, text cut into words by GPT-2's pattern, each word's bytes mapped to the byte-level
// alphabet and merged by rank, and ids decoded back to bytes.
#include "hf_bpe.h"

#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "tandem/core/error.h"
#include "unicode_classes.h"

namespace tandem::data::detail {
namespace {

using nlohmann::json;

constexpr size_t kCachedWordBytes = 64;       // longer words are merged every time
constexpr size_t kCacheWordsPerShard = 4096;  // a full shard is emptied

// GPT-2's bytes_to_unicode(): the code point that stands for each byte in the vocabulary. The
// printable bytes stand for themselves; the others for 256, 257, ... in byte order.
std::array<char32_t, 256> byte_code_points() {
  std::array<char32_t, 256> cp{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return cp;
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// A vocabulary token's bytes: each character of the byte-level alphabet is its byte; any other
// character is kept as its UTF-8 (as Hugging Face's ByteLevel decoder does).
std::string token_bytes(std::string_view token, const std::unordered_map<char32_t, char>& byte_of) {
  std::string out;
  for (size_t at = 0; at < token.size();) {
    const CodePoint c = code_point_at(token, at);
    const auto it = byte_of.find(c.c);
    if (it != byte_of.end())
      out += it->second;
    else
      out.append(token.substr(at, c.bytes));
    at += c.bytes;
  }
  return out;
}

[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
  user_error(
      "tokenizer '{}' is not supported: {}; tandem reads Hugging Face tokenizer.json files of "
      "GPT-2's byte-level BPE",
      path, what);
}

// The "type" of a component (pre_tokenizer, decoder, ...), "" for null or absent.
std::string type_of(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "";
  const json& c = j[key];
  if (!c.is_object() || !c.contains("type") || !c["type"].is_string()) return "(untyped)";
  return c["type"].get<std::string>();
}

bool set(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (j[key].is_string()) return !j[key].get<std::string>().empty();
  if (j[key].is_boolean()) return j[key].get<bool>();
  if (j[key].is_number()) return j[key].get<double>() != 0;
  return true;
}

// The checks that make a tokenizer.json GPT-2's kind; each refusal names what differs.
void check_kind(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    unsupported(path, "it has no \"model\" (it is not a Hugging Face tokenizer.json)");
  const json& m = j["model"];
  const std::string model =
      m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "untyped";
  if (model != "BPE") unsupported(path, fmt::format("its model is {}, not BPE", model));
  if (!m.contains("vocab") || !m["vocab"].is_object())
    unsupported(path, "its BPE model has no vocab");
  if (!m.contains("merges") || !m["merges"].is_array())
    unsupported(path, "its BPE model has no merges");
  for (const char* key :
       {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"})
    if (set(m, key)) unsupported(path, fmt::format("its BPE model sets {}", key));
  if (const std::string n = type_of(j, "normalizer"); !n.empty())
    unsupported(path, fmt::format("its normalizer is {} (GPT-2's has none)", n));
  const std::string pre = type_of(j, "pre_tokenizer");
  if (pre != "ByteLevel")
    unsupported(path, pre.empty() ? "it has no pre-tokenizer (GPT-2's is ByteLevel)"
                                  : fmt::format("its pre-tokenizer is {}, not ByteLevel", pre));
  const json& p = j["pre_tokenizer"];
  if (set(p, "add_prefix_space"))
    unsupported(path, "its ByteLevel pre-tokenizer sets add_prefix_space");
  if (p.contains("use_regex") && p["use_regex"].is_boolean() && !p["use_regex"].get<bool>())
    unsupported(path, "its ByteLevel pre-tokenizer does not use GPT-2's pattern (use_regex false)");
  if (const std::string d = type_of(j, "decoder"); d != "ByteLevel")
    unsupported(path, d.empty() ? "it has no decoder (GPT-2's is ByteLevel)"
                                : fmt::format("its decoder is {}, not ByteLevel", d));
}

// A merge: "left right" (the classic form) or ["left", "right"].
std::pair<std::string, std::string> merge_pair(const json& merge, size_t index,
                                               const std::string& path) {
  if (merge.is_string()) {
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    if (space != std::string::npos && s.find(' ', space + 1) == std::string::npos)
      return {s.substr(0, space), s.substr(space + 1)};
  } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
             merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  user_error("tokenizer '{}' is malformed: merge {} ({}) is not two tokens", path, index,
             merge.dump());
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string reason(const json::exception& e) {
  std::string why = e.what();
  if (const size_t at = why.find("] "); at != std::string::npos) why.erase(0, at + 2);
  return why;
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };

CharClass class_of(char32_t c) {
  if (is_letter(c)) return CharClass::kLetter;
  if (is_number(c)) return CharClass::kNumber;
  if (is_space(c)) return CharClass::kSpace;
  return CharClass::kOther;
}

// GPT-2's pre-tokenization: where the word that starts at t[i] ends, as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matches it (the first alternative that matches at i wins; i < t.size()).
size_t gpt2_word_end(std::string_view t, size_t i) {
  const size_t n = t.size();
  // 's 't 're 've 'm 'll 'd
  if (t[i] == '\'' && i + 1 < n) {
    const char a = t[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const char b = t[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a run of one class after an optional space.
  size_t j = i;
  CodePoint c = code_point_at(t, i);
  if (c.c == ' ' && i + 1 < n) {
    j = i + 1;
    c = code_point_at(t, j);
  }
  if (const CharClass k = class_of(c.c); k != CharClass::kSpace) {
    size_t e = j + c.bytes;
    while (e < n) {
      const CodePoint d = code_point_at(t, e);
      if (class_of(d.c) != k) break;
      e += d.bytes;
    }
    return e;
  }
  // Whitespace: `\s+(?!\S)` takes the run but the last character before a non-space (which then
  // starts the next word: " word", or `\s+` alone); `\s+` takes a single one.
  size_t e = i, last = i;
  while (e < n) {
    const CodePoint d = code_point_at(t, e);
    if (!is_space(d.c)) break;
    last = e;
    e += d.bytes;
  }
  if (e == n || last == i) return e;
  return last;
}

}  // namespace

HfBpe::HfBpe(const std::string& text, const std::string& path)
    : cache_(std::make_unique<std::array<CacheShard, kCacheShards>>()) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    user_error("tokenizer '{}' is not valid JSON: {}", path, reason(e));
  }
  check_kind(j, path);
  const json& m = j["model"];
  try {
    // Ids: the vocabulary's and the added tokens', which must run from 0 without gaps.
    std::unordered_map<std::string, int32_t> id_of;
    std::vector<const std::string*> token_of;
    std::vector<bool> special;
    const json none = json::array();
    const json& added =
        j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : none;
    const int64_t tokens = static_cast<int64_t>(m["vocab"].size() + added.size());
    auto assign = [&](const std::string& token, int64_t id, bool is_special) {
      if (id < 0 || id >= tokens)
        user_error(
            "tokenizer '{}' is malformed: token '{}' has id {} (ids must run from 0 without gaps)",
            path, token, id);
      const auto [it, fresh] = id_of.emplace(token, static_cast<int32_t>(id));
      if (!fresh && it->second != id)
        user_error("tokenizer '{}' is malformed: token '{}' has ids {} and {}", path, token,
                   it->second, id);
      if (static_cast<size_t>(id) >= token_of.size()) {
        token_of.resize(static_cast<size_t>(id) + 1, nullptr);
        special.resize(static_cast<size_t>(id) + 1, false);
      }
      const std::string*& slot = token_of[static_cast<size_t>(id)];
      if (slot != nullptr && *slot != token)
        user_error("tokenizer '{}' is malformed: tokens '{}' and '{}' have the same id {}", path,
                   *slot, token, id);
      slot = &it->first;
      special[static_cast<size_t>(id)] = special[static_cast<size_t>(id)] || is_special;
    };
    for (const auto& [token, id] : m["vocab"].items()) assign(token, id.get<int64_t>(), false);
    for (const json& a : added)
      assign(a.at("content").get<std::string>(), a.at("id").get<int64_t>(),
             a.value("special", false));
    if (const auto it = id_of.find("<|endoftext|>"); it != id_of.end()) {
      eos_id_ = it->second;
      special[static_cast<size_t>(eos_id_)] = true;  // appended between documents: decodes to ""
    }
    for (size_t id = 0; id < token_of.size(); ++id)
      if (token_of[id] == nullptr)
        user_error(
            "tokenizer '{}' is malformed: it has no token of id {} (ids must run from 0 without "
            "gaps)",
            path, id);
    if (token_of.empty()) unsupported(path, "its BPE model's vocab is empty");

    // Each byte's one-character token, and every token's bytes.
    const std::array<char32_t, 256> cps = byte_code_points();
    std::unordered_map<char32_t, char> byte_of;
    for (size_t b = 0; b < 256; ++b) {
      byte_of[cps[b]] = static_cast<char>(b);
      const auto it = id_of.find(utf8(cps[b]));
      if (it == id_of.end())
        unsupported(path, fmt::format("its vocabulary has no token for byte 0x{:02x} ('{}'), so "
                                      "it is not a byte-level BPE",
                                      b, utf8(cps[b])));
      byte_id_[b] = it->second;
    }
    bytes_of_id_.resize(token_of.size());
    for (size_t id = 0; id < token_of.size(); ++id) {
      const std::string& token = *token_of[id];
      if (special[id]) continue;
      // Added tokens outside the vocabulary are kept as written; vocabulary tokens are byte-level.
      bytes_of_id_[id] = m["vocab"].contains(token) ? token_bytes(token, byte_of) : token;
      if (m["vocab"].contains(token))
        id_of_bytes_.emplace(bytes_of_id_[id], static_cast<int32_t>(id));
    }
    ignore_merges_ = m.value("ignore_merges", false);

    const json& merges = m["merges"];
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto [left, right] = merge_pair(merges[r], r, path);
      const auto a = id_of.find(left), b = id_of.find(right), ab = id_of.find(left + right);
      if (a == id_of.end() || b == id_of.end() || ab == id_of.end())
        user_error("tokenizer '{}' is malformed: merge {} ('{} {}') names a token not in its vocab",
                   path, r, left, right);
      const uint64_t key =
          (static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second);
      merges_.emplace(key, Merge{static_cast<int32_t>(r), ab->second});  // the first rank stays
    }
  } catch (const json::exception& e) {
    user_error("tokenizer '{}' is malformed: {}", path, reason(e));
  }
}

// Byte-level BPE of one word: its bytes as their one-character tokens, then, while any adjacent
// pair has a merge, the pair of lowest rank (the leftmost among equals) merged.
void HfBpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(word.size());
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_)
    if (const auto it = id_of_bytes_.find(std::string(word)); it != id_of_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  struct Symbol {
    int32_t id;
    int prev, next;  // neighbours in the word (-1: none); merged-away symbols have id -1
  };
  std::vector<Symbol> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    s[static_cast<size_t>(i)] = {byte_id_[static_cast<unsigned char>(word[static_cast<size_t>(i)])],
                                 i - 1, i + 1 < n ? i + 1 : -1};
  struct Candidate {
    int32_t rank;
    int left;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto merge_of = [&](int left) -> const Merge* {
    const Symbol& a = s[static_cast<size_t>(left)];
    if (a.id < 0 || a.next < 0) return nullptr;
    const uint64_t key = (static_cast<uint64_t>(a.id) << 32) |
                         static_cast<uint32_t>(s[static_cast<size_t>(a.next)].id);
    const auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto offer = [&](int left) {
    if (left < 0) return;
    if (const Merge* m = merge_of(left)) queue.push({m->rank, left});
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const Merge* m = merge_of(c.left);
    if (m == nullptr || m->rank != c.rank) continue;  // the pair changed since it was offered
    Symbol& a = s[static_cast<size_t>(c.left)];
    Symbol& b = s[static_cast<size_t>(a.next)];
    a.id = m->id;
    a.next = b.next;
    if (b.next >= 0) s[static_cast<size_t>(b.next)].prev = c.left;
    b.id = -1;
    offer(a.prev);
    offer(c.left);
  }
  for (int i = 0; i >= 0; i = s[static_cast<size_t>(i)].next)
    out.push_back(s[static_cast<size_t>(i)].id);
}

void HfBpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kCachedWordBytes) return merge_word(word, out);
  CacheShard& shard = (*cache_)[std::hash<std::string_view>()(word) % kCacheShards];
  std::string key(word);
  {
    const std::lock_guard<std::mutex> lock(shard.mutex);
    if (const auto it = shard.words.find(key); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t from = out.size();
  merge_word(word, out);
  std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(from), out.end());
  const std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.words.size() >= kCacheWordsPerShard) shard.words.clear();
  shard.words.emplace(std::move(key), std::move(ids));
}

std::vector<int32_t> HfBpe::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  for (size_t at = 0; at < text.size();) {
    const size_t end = gpt2_word_end(text, at);
    encode_word(text.substr(at, end - at), out);
    at = end;
  }
  return out;
}

std::string HfBpe::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += bytes_of_id_[static_cast<size_t>(id)];
  return lossy_utf8(out);
}

}  // namespace tandem::data::detail
