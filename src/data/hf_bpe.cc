// BPE from a Hugging Face tokenizer.json: byte-level (GPT-2's or Llama 3's) or SentencePiece's with
// byte fallback (Llama 2's). The file checked to be one of those kinds and read, added tokens
// matched in the text, the rest cut into words by GPT-2's or Llama 3's pattern (byte-level: each
// word's bytes mapped to the byte-level alphabet) or normalized as Llama 2's (each character its
// token, else its byte pieces), merged by rank, and ids decoded back to text.
#include "hf_bpe.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "tandem/core/error.h"
#include "tandem/io/json_file.h"
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
      "GPT-2's or Llama 3's byte-level BPE and of Llama 2's SentencePiece BPE",
      path, what);
}

constexpr std::string_view kSpacePiece = "\xE2\x96\x81";  // U+2581, SentencePiece's space: ▁

// Llama 2's byte piece for byte b: <0x0A>, <0xFF>.
std::string byte_piece(size_t b) { return fmt::format("<0x{:02X}>", b); }

// The byte a piece such as <0x0A> stands for (as Hugging Face's ByteFallback decoder reads it:
// six characters, two hex digits of either case), else -1.
int piece_byte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int b = 0;
  for (const char c : token.substr(3, 2)) {
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    b = b * 16 + d;
  }
  return b;
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

// Llama 3's pre-tokenization pattern, as its tokenizer.json writes it (a Split pre-tokenizer's
// "Regex"); llama3_word_end implements it.
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Llama 2's normalizer: Prepend "▁" (`prepend`: to text that is not empty), Replace " " with "▁".
std::string normalize_llama2(std::string_view text, bool prepend) {
  std::string normalized;
  if (text.empty()) return normalized;
  normalized.reserve(text.size() + text.size() / 4 + kSpacePiece.size());
  if (prepend) normalized += kSpacePiece;
  for (const char c : text) {
    if (c == ' ')
      normalized += kSpacePiece;
    else
      normalized += c;
  }
  return normalized;
}

// The types of a Sequence's steps (its `key`: "pretokenizers", "normalizers", "decoders").
std::vector<std::string> step_types(const json& sequence, const char* key) {
  std::vector<std::string> types;
  if (sequence.contains(key) && sequence[key].is_array())
    for (const json& q : sequence[key])
      types.push_back(q.is_object() && q.contains("type") && q["type"].is_string()
                          ? q["type"].get<std::string>()
                          : "(untyped)");
  return types;
}

std::string listed(const std::vector<std::string>& types) {
  return types.empty() ? "nothing" : fmt::format("{}", fmt::join(types, ", "));
}

// A string field of a component, or "" when it is absent or not a string.
std::string string_field(const json& c, const char* key) {
  return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : "";
}

// Whether a Replace step (normalizer or decoder) replaces the string `from` with `to`; else the
// message that says what it replaces.
std::string replace_mismatch(const json& r, const char* step, std::string_view from,
                             std::string_view to) {
  const json none;
  const json& pattern = r.contains("pattern") ? r["pattern"] : none;
  const json& content = r.contains("content") ? r["content"] : none;
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
      pattern["String"].get<std::string>() == from && content.is_string() &&
      content.get<std::string>() == to)
    return "";
  // A pattern is shown as the file writes it ({"String": " "}, {"Regex": "\\s"}) where it can be.
  const std::string shown =
      pattern.is_object() && pattern.size() == 1 && pattern.begin().value().is_string()
          ? fmt::format("{{\"{}\": {}}}", pattern.begin().key(),
                        io::json_excerpt(pattern.begin().value()))
          : io::json_excerpt(pattern);
  return fmt::format("its Replace {} replaces {} with {} (Llama 2's replaces {} with {})", step,
                     shown, io::json_excerpt(content), io::json_excerpt(json(from)),
                     io::json_excerpt(json(to)));
}

// The checks that make a tokenizer.json that sets byte_fallback Llama 2's kind (as Hugging Face's
// LlamaConverter writes it for Llama 2, Mistral and TinyLlama): no pre-tokenizer; the normalizer
// Prepend "▁" then Replace " " with "▁"; the decoder Replace "▁" with " ", ByteFallback, Fuse,
// Strip one " " at the start. Each refusal names what differs.
void check_llama2(const json& j, const std::string& path) {
  if (const std::string pre = type_of(j, "pre_tokenizer"); !pre.empty())
    unsupported(path, fmt::format("its BPE model sets byte_fallback, as Llama 2's does, but it has "
                                  "a pre-tokenizer, {} (Llama 2's has none)",
                                  pre));
  const std::string n = type_of(j, "normalizer");
  const std::vector<std::string> normalizers =
      n == "Sequence" ? step_types(j["normalizer"], "normalizers") : std::vector<std::string>{};
  if (normalizers != std::vector<std::string>{"Prepend", "Replace"})
    unsupported(path, fmt::format("its normalizer is {} (tandem implements Llama 2's: a Sequence "
                                  "of Prepend and Replace)",
                                  n.empty()         ? "missing"
                                  : n == "Sequence" ? "a Sequence of " + listed(normalizers)
                                                    : n));
  const json& prepend = j["normalizer"]["normalizers"][0];
  if (string_field(prepend, "prepend") != kSpacePiece)
    unsupported(path, fmt::format("its Prepend normalizer prepends {} (Llama 2's prepends \"▁\")",
                                  io::json_excerpt(prepend.contains("prepend") ? prepend["prepend"]
                                                                               : json())));
  if (const std::string why =
          replace_mismatch(j["normalizer"]["normalizers"][1], "normalizer", " ", kSpacePiece);
      !why.empty())
    unsupported(path, why);
  const json& m = j["model"];
  if (set(m, "ignore_merges")) unsupported(path, "its BPE model sets ignore_merges");
  const std::string d = type_of(j, "decoder");
  const std::vector<std::string> decoders =
      d == "Sequence" ? step_types(j["decoder"], "decoders") : std::vector<std::string>{};
  if (decoders != std::vector<std::string>{"Replace", "ByteFallback", "Fuse", "Strip"})
    unsupported(path, fmt::format("its decoder is {} (tandem implements Llama 2's: a Sequence of "
                                  "Replace, ByteFallback, Fuse, Strip)",
                                  d.empty()         ? "missing"
                                  : d == "Sequence" ? "a Sequence of " + listed(decoders)
                                                    : d));
  const json& steps = j["decoder"]["decoders"];
  if (const std::string why = replace_mismatch(steps[0], "decoder", kSpacePiece, " "); !why.empty())
    unsupported(path, why);
  const json& strip = steps[3];
  auto count = [&](const char* key) {
    return strip.contains(key) && strip[key].is_number_integer() ? strip[key].get<int64_t>() : -1;
  };
  if (string_field(strip, "content") != " " || count("start") != 1 || count("stop") != 0)
    unsupported(path,
                fmt::format("its Strip decoder strips {} {} at the start and {} at the end "
                            "(Llama 2's strips one \" \" at the start)",
                            io::json_excerpt(strip.contains("content") ? strip["content"] : json()),
                            count("start"), count("stop")));
}

// A ByteLevel pre-tokenizer's options: no added space; GPT-2's pattern or (after a Split) none.
void check_byte_level(const json& p, bool after_split, const std::string& path) {
  if (set(p, "add_prefix_space"))
    unsupported(path, "its ByteLevel pre-tokenizer sets add_prefix_space");
  const bool regex =
      !(p.contains("use_regex") && p["use_regex"].is_boolean() && !p["use_regex"].get<bool>());
  if (!after_split && !regex)
    unsupported(path, "its ByteLevel pre-tokenizer does not use GPT-2's pattern (use_regex false)");
  if (after_split && regex)
    unsupported(path,
                "its ByteLevel pre-tokenizer after Split uses GPT-2's pattern too (use_regex true; "
                "Llama 3's sets it false)");
}

// A Split pre-tokenizer: Llama 3's pattern, its pieces kept as words ("Isolated").
void check_split(const json& p, const std::string& path) {
  const json none;
  const json& pattern = p.contains("pattern") ? p["pattern"] : none;
  if (pattern.is_object() && pattern.contains("String"))
    unsupported(path,
                fmt::format("its Split pre-tokenizer splits on the string {} (tandem implements "
                            "Llama 3's pattern only)",
                            io::json_excerpt(pattern["String"])));
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
    unsupported(path, "its Split pre-tokenizer has no pattern {\"Regex\": ...}");
  if (const std::string regex = pattern["Regex"].get<std::string>(); regex != kLlama3Pattern)
    unsupported(path, fmt::format("its Split pre-tokenizer's pattern {} is not Llama 3's (tandem "
                                  "implements that one pattern)",
                                  io::json_excerpt(pattern["Regex"])));
  const std::string behavior =
      p.contains("behavior") && p["behavior"].is_string() ? p["behavior"].get<std::string>() : "";
  if (behavior != "Isolated")
    unsupported(path, fmt::format("its Split pre-tokenizer's behavior is {}, not Isolated",
                                  behavior.empty() ? "missing" : behavior));
  if (set(p, "invert")) unsupported(path, "its Split pre-tokenizer sets invert");
}

// The checks that make a tokenizer.json GPT-2's, Llama 3's or Llama 2's kind, and which it is
// (a BPE that sets byte_fallback is taken for Llama 2's); each refusal names what differs.
HfBpe::Kind check_kind(const json& j, const std::string& path) {
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
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
    if (set(m, key)) unsupported(path, fmt::format("its BPE model sets {}", key));
  if (set(m, "byte_fallback")) {
    check_llama2(j, path);
    return HfBpe::Kind::kLlama2;
  }
  if (const std::string n = type_of(j, "normalizer"); !n.empty())
    unsupported(path, fmt::format("its normalizer is {} (GPT-2's and Llama 3's have none; Llama "
                                  "2's kind sets byte_fallback)",
                                  n));
  if (const std::string d = type_of(j, "decoder"); d != "ByteLevel")
    unsupported(path, d.empty() ? "it has no decoder (GPT-2's and Llama 3's are ByteLevel)"
                                : fmt::format("its decoder is {}, not ByteLevel", d));
  // Pre-tokenizers: GPT-2's ByteLevel with its pattern, or Llama 3's Sequence of Split and
  // ByteLevel.
  const std::string pre = type_of(j, "pre_tokenizer");
  if (pre == "ByteLevel") {
    check_byte_level(j["pre_tokenizer"], false, path);
    return HfBpe::Kind::kGpt2;
  }
  if (pre == "Sequence") {
    const json& p = j["pre_tokenizer"];
    const std::vector<std::string> types = step_types(p, "pretokenizers");
    if (types != std::vector<std::string>{"Split", "ByteLevel"})
      unsupported(path, fmt::format("its pre-tokenizer is a Sequence of {} (tandem implements "
                                    "Llama 3's: Split, ByteLevel)",
                                    listed(types)));
    check_split(p["pretokenizers"][0], path);
    check_byte_level(p["pretokenizers"][1], true, path);
    return HfBpe::Kind::kLlama3;
  }
  unsupported(path,
              pre.empty()
                  ? "it has no pre-tokenizer (GPT-2's is ByteLevel; Llama 3's a Sequence of Split "
                    "and ByteLevel)"
                  : fmt::format("its pre-tokenizer is {}, not ByteLevel or a Sequence of Split "
                                "and ByteLevel",
                                pre));
}

// The token a TemplateProcessing post-processor puts before a single text (-1: none). Templates
// of `$A` or of one special token then `$A` are implemented; ByteLevel post-processors change
// offsets only, and are accepted alone or in a Sequence.
int template_bos(const json& j, const std::string& path,
                 const std::unordered_map<std::string, int32_t>& id_of) {
  const std::string type = type_of(j, "post_processor");
  if (type.empty()) return -1;
  std::vector<const json*> parts;
  const json& pp = j["post_processor"];
  if (type == "Sequence") {
    if (!pp.contains("processors") || !pp["processors"].is_array())
      unsupported(path, "its Sequence post-processor has no processors");
    for (const json& q : pp["processors"]) parts.push_back(&q);
  } else {
    parts.push_back(&pp);
  }
  int bos = -1;
  bool templated = false;
  for (const json* q : parts) {
    const std::string t = q->is_object() && q->contains("type") && (*q)["type"].is_string()
                              ? (*q)["type"].get<std::string>()
                              : "(untyped)";
    if (t == "ByteLevel") continue;
    if (t != "TemplateProcessing")
      unsupported(path, fmt::format("its post-processor is {} (tandem implements ByteLevel and "
                                    "TemplateProcessing)",
                                    t));
    if (templated) unsupported(path, "its post-processor has two TemplateProcessing steps");
    templated = true;
    if (!q->contains("single") || !(*q)["single"].is_array())
      unsupported(path, "its TemplateProcessing post-processor has no single template");
    // The template as words ("<|begin_of_text|> $A"), and the special tokens before $A.
    std::vector<std::string> words, before;
    bool text_seen = false, after = false;
    for (const json& item : (*q)["single"]) {
      if (item.contains("Sequence")) {
        words.push_back("$" + item["Sequence"].value("id", std::string("?")));
        if (text_seen) after = true;
        text_seen = true;
      } else if (item.contains("SpecialToken")) {
        words.push_back(item["SpecialToken"].value("id", std::string("?")));
        if (text_seen)
          after = true;
        else
          before.push_back(words.back());
      } else {
        words.push_back(io::json_excerpt(item));
        after = true;
      }
    }
    const std::string shown = fmt::format("{}", fmt::join(words, " "));
    if (!text_seen || after || before.size() > 1 || words.back() != "$A")
      unsupported(path, fmt::format("its TemplateProcessing post-processor's single template is "
                                    "'{}' (tandem implements '$A' and one special token then '$A')",
                                    shown));
    if (before.empty()) continue;
    // The special token's ids, as the template's special_tokens give them.
    const json none;
    const json& specials = q->contains("special_tokens") ? (*q)["special_tokens"] : none;
    const json& entry =
        specials.is_object() && specials.contains(before[0]) ? specials[before[0]] : none;
    if (!entry.is_object() || !entry.contains("ids") || !entry["ids"].is_array() ||
        entry["ids"].size() != 1 || !entry["ids"][0].is_number_integer())
      user_error(
          "tokenizer '{}' is malformed: its TemplateProcessing post-processor gives no single id "
          "for '{}'",
          path, before[0]);
    bos = entry["ids"][0].get<int>();
    const auto it = id_of.find(before[0]);
    if (it == id_of.end() || it->second != bos)
      user_error(
          "tokenizer '{}' is malformed: its TemplateProcessing post-processor gives '{}' the id "
          "{}, which is not that token's",
          path, before[0], bos);
  }
  return bos;
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
             io::json_excerpt(merge));
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

// A character of (?i:s) and the like: ASCII either case, and what Unicode's case folding
// folds to it (U+017F LATIN SMALL LETTER LONG S to s).
bool folds_to(char32_t c, char lower) {
  return c == static_cast<char32_t>(lower) || c == static_cast<char32_t>(lower - 'a' + 'A') ||
         (lower == 's' && c == 0x017F);
}

// Llama 3's pre-tokenization: where the word that starts at t[i] ends, as kLlama3Pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// matches it (the first alternative that matches at i wins; i < t.size()).
size_t llama3_word_end(std::string_view t, size_t i) {
  const size_t n = t.size();
  const CodePoint c = code_point_at(t, i);
  auto at = [&](size_t k) { return k < n ? code_point_at(t, k) : CodePoint{0, 0}; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c.c == '\'' && i + 1 < n) {
    const CodePoint a = at(i + 1);
    if (folds_to(a.c, 's') || folds_to(a.c, 't') || folds_to(a.c, 'm') || folds_to(a.c, 'd'))
      return i + 1 + a.bytes;
    const CodePoint b = at(i + 1 + a.bytes);
    if (b.bytes > 0 &&
        ((folds_to(a.c, 'r') && folds_to(b.c, 'e')) || (folds_to(a.c, 'v') && folds_to(b.c, 'e')) ||
         (folds_to(a.c, 'l') && folds_to(b.c, 'l'))))
      return i + 1 + a.bytes + b.bytes;
  }
  auto letters_from = [&](size_t k) {  // the end of the run of letters at k
    while (k < n) {
      const CodePoint d = code_point_at(t, k);
      if (!is_letter(d.c)) break;
      k += d.bytes;
    }
    return k;
  };
  const CharClass k = class_of(c.c);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (k == CharClass::kLetter) return letters_from(i + c.bytes);
  if (k != CharClass::kNumber && c.c != '\r' && c.c != '\n' && i + c.bytes < n &&
      is_letter(at(i + c.bytes).c))
    return letters_from(i + c.bytes);
  // \p{N}{1,3}
  if (k == CharClass::kNumber) {
    size_t e = i + c.bytes;
    for (int digits = 1; digits < 3 && e < n; ++digits) {
      const CodePoint d = code_point_at(t, e);
      if (!is_number(d.c)) break;
      e += d.bytes;
    }
    return e;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: a run of other characters after an optional space, then any
  // line ends.
  size_t j = c.c == ' ' && i + 1 < n ? i + 1 : i;
  if (class_of(at(j).c) == CharClass::kOther) {
    size_t e = j;
    while (e < n) {
      const CodePoint d = code_point_at(t, e);
      if (class_of(d.c) != CharClass::kOther) break;
      e += d.bytes;
    }
    while (e < n && (t[e] == '\r' || t[e] == '\n')) ++e;
    return e;
  }
  // Whitespace from here on (every other character matched above).
  size_t e = i, last = i, line_end = std::string_view::npos;
  while (e < n) {
    const CodePoint d = code_point_at(t, e);
    if (!is_space(d.c)) break;
    if (d.c == '\r' || d.c == '\n') line_end = e + 1;
    last = e;
    e += d.bytes;
  }
  // `\s*[\r\n]+`: the run up to its last line end.
  if (line_end != std::string_view::npos) return line_end;
  // `\s+(?!\S)`, `\s+`: as in GPT-2's pattern.
  if (e == n || last == i) return e;
  return last;
}

}  // namespace

HfBpe::HfBpe(const std::string& text, const std::string& path)
    : cache_(std::make_unique<std::array<CacheShard, kCacheShards>>()) {
  // Nesting past io::kMaxJsonDepth is refused before anything recursive walks it.
  const std::string file = fmt::format("tokenizer '{}'", path);
  const json j = io::parse_json(text, file);
  kind_ = check_kind(j, path);
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
    for (const auto& [token, id] : m["vocab"].items())
      assign(token, io::json_int(id, file, fmt::format("model.vocab[\"{}\"]", token)), false);
    // Each added token's fields, typed: a wrong type names the field.
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      const std::string at = fmt::format("added_tokens[{}]", i);
      io::json_object(a, file, at);
      for (const char* flag : {"special", "single_word", "lstrip", "rstrip", "normalized"})
        if (a.contains(flag)) io::json_bool(a[flag], file, io::json_field(at, flag));
      const std::string content = io::json_field(at, "content"), id = io::json_field(at, "id");
      assign(io::json_string(io::json_member(a, "content", file, content), file, content),
             io::json_int(io::json_member(a, "id", file, id), file, id), a.value("special", false));
    }
    // The end-of-text token: GPT-2's or Llama 3's, or Llama 2's.
    const std::vector<const char*> eos_tokens =
        kind_ == Kind::kLlama2 ? std::vector<const char*>{"</s>"}
                               : std::vector<const char*>{"<|endoftext|>", "<|end_of_text|>"};
    for (const char* eos : eos_tokens)
      if (const auto it = id_of.find(eos); it != id_of.end() && eos_id_ < 0) {
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

    if (kind_ == Kind::kLlama2) {
      read_llama2_vocab(m["vocab"], token_of, special, id_of, path);
    } else {
      read_byte_level_vocab(m, token_of, special, id_of, path);
    }
    ignore_merges_ = m.contains("ignore_merges") &&
                     io::json_bool(m["ignore_merges"], file, "model.ignore_merges");
    bos_id_ = template_bos(j, path, id_of);
    if (bos_id_ >= 0) bytes_of_id_[static_cast<size_t>(bos_id_)].clear();  // decodes to nothing

    // Added tokens, matched in the text before it is cut into words.
    for (const json& a : added) {
      const std::string content = a.at("content").get<std::string>();
      for (const char* option : {"single_word", "lstrip", "rstrip"})
        if (a.value(option, false))
          unsupported(path, fmt::format("its added token '{}' sets {}", content, option));
      if (content.empty())
        user_error("tokenizer '{}' is malformed: added token {} is empty", path,
                   a.at("id").get<int64_t>());
      // Hugging Face matches a normalized token's normalized content ("▁<s>") in the normalized
      // text.
      const bool normalized = a.value("normalized", true);
      added_[normalized ? 1 : 0].add(
          normalized && kind_ == Kind::kLlama2 ? normalize_llama2(content, true) : content,
          id_of.at(content));
    }

    const json& merges = m["merges"];
    const int32_t line_end = kind_ == Kind::kLlama2 ? byte_id_['\n'] : -1;
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto [left, right] = merge_pair(merges[r], r, path);
      const auto a = id_of.find(left), b = id_of.find(right), ab = id_of.find(left + right);
      if (a == id_of.end() || b == id_of.end() || ab == id_of.end())
        user_error("tokenizer '{}' is malformed: merge {} ('{} {}') names a token not in its vocab",
                   path, r, left, right);
      // No merge crosses a line end, so text cut at line ends encodes piece by piece.
      if (a->second == line_end || b->second == line_end)
        unsupported(path, fmt::format("its merge {} ('{} {}') joins the line end's byte piece "
                                      "(tandem encodes text in pieces cut at line ends)",
                                      r, left, right));
      const uint64_t key =
          (static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second);
      merges_.emplace(key, Merge{static_cast<int32_t>(r), ab->second});  // the first rank stays
    }
  } catch (const json::exception& e) {
    user_error("tokenizer '{}' is malformed: {}", path, reason(e));
  }
}

// Byte-level BPE: each byte's one-character token, and every token's bytes.
void HfBpe::read_byte_level_vocab(const json& m, const std::vector<const std::string*>& token_of,
                                  const std::vector<bool>& special,
                                  const std::unordered_map<std::string, int32_t>& id_of,
                                  const std::string& path) {
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
}

// Llama 2's kind: each byte's piece <0xXX> (all 256, so every character encodes), the
// one-character tokens, and every token's text with "▁" as a space. No token holds a line end, so
// text cut at line ends encodes piece by piece (tandem tokenize's chunks).
void HfBpe::read_llama2_vocab(const json& vocab, const std::vector<const std::string*>& token_of,
                              const std::vector<bool>& special,
                              const std::unordered_map<std::string, int32_t>& id_of,
                              const std::string& path) {
  for (size_t b = 0; b < 256; ++b) {
    const auto it = vocab.find(byte_piece(b));
    if (it == vocab.end())
      unsupported(path, fmt::format("its vocabulary has no piece {} for byte 0x{:02x} (byte "
                                    "fallback needs all 256)",
                                    byte_piece(b), b));
    byte_id_[b] = id_of.at(byte_piece(b));
  }
  bytes_of_id_.resize(token_of.size());
  piece_byte_.assign(token_of.size(), -1);
  for (size_t id = 0; id < token_of.size(); ++id) {
    const std::string& token = *token_of[id];
    if (token.find('\n') != std::string::npos)
      unsupported(path, fmt::format("its token {} holds a line end (tandem encodes text in "
                                    "pieces cut at line ends)",
                                    io::json_excerpt(json(token))));
    if (special[id]) continue;
    // Hugging Face's decoder turns "▁" into " " in every token, then bytes of pieces into text.
    piece_byte_[id] = static_cast<int16_t>(piece_byte(token));
    std::string& text = bytes_of_id_[id];
    for (size_t at = 0; at < token.size();) {
      if (token.compare(at, kSpacePiece.size(), kSpacePiece) == 0) {
        text += ' ';
        at += kSpacePiece.size();
      } else {
        text += token[at++];
      }
    }
    if (const CodePoint c = code_point_at(token, 0);
        c.bytes == token.size() && vocab.contains(token))
      char_id_.emplace(c.c, static_cast<int32_t>(id));
  }
}

// BPE of one word: its first symbols (byte-level: its bytes as their one-character tokens; Llama
// 2's kind: each character's token, or its bytes' pieces where the vocabulary has none, as Hugging
// Face's byte_fallback), then, while any adjacent pair has a merge, the pair of lowest rank (the
// leftmost among equals) merged.
void HfBpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_)
    if (const auto it = id_of_bytes_.find(std::string(word)); it != id_of_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  struct Symbol {
    int32_t id;
    int prev, next;  // neighbours in the word (-1: none); merged-away symbols have id -1
  };
  std::vector<Symbol> s;
  s.reserve(word.size());
  auto add = [&](int32_t id) {
    const int i = static_cast<int>(s.size());
    s.push_back({id, i - 1, i + 1});
  };
  auto add_bytes = [&](std::string_view bytes) {
    for (const char ch : bytes) add(byte_id_[static_cast<unsigned char>(ch)]);
  };
  if (kind_ == Kind::kLlama2) {
    for (size_t at = 0; at < word.size();) {
      const CodePoint c = code_point_at(word, at);
      const bool valid = c.bytes > 1 || static_cast<unsigned char>(word[at]) < 0x80;
      const auto it = valid ? char_id_.find(c.c) : char_id_.end();
      if (it != char_id_.end())
        add(it->second);
      else
        add_bytes(word.substr(at, c.bytes));
      at += c.bytes;
    }
  } else {
    add_bytes(word);
  }
  s.back().next = -1;
  const int n = static_cast<int>(s.size());
  if (n == 1) {
    out.push_back(s[0].id);
    return;
  }
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

int32_t HfBpe::AddedTokens::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, c] : nodes_[static_cast<size_t>(node)].next)
    if (b == byte) return c;
  return -1;
}

void HfBpe::AddedTokens::add(std::string_view content, int32_t id) {
  int32_t node = 0;
  for (const char ch : content) {
    const auto byte = static_cast<unsigned char>(ch);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[static_cast<size_t>(node)].next.emplace_back(byte, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  nodes_[static_cast<size_t>(node)].id = id;
  starts_[static_cast<unsigned char>(content[0])] = true;
}

std::pair<size_t, int32_t> HfBpe::AddedTokens::longest_at(std::string_view text, size_t at) const {
  std::pair<size_t, int32_t> found{0, -1};
  int32_t node = 0;
  for (size_t k = at; k < text.size(); ++k) {
    node = child(node, static_cast<unsigned char>(text[k]));
    if (node < 0) break;
    if (const int32_t id = nodes_[static_cast<size_t>(node)].id; id >= 0) found = {k + 1 - at, id};
  }
  return found;
}

template <typename Fn>
void HfBpe::AddedTokens::split(std::string_view text, std::vector<int32_t>& out,
                               Fn&& text_fn) const {
  size_t from = 0;  // the text not handed on yet
  for (size_t at = 0; at < text.size();) {
    const auto [bytes, id] =
        may_start(text[at]) ? longest_at(text, at) : std::pair<size_t, int32_t>{};
    if (bytes == 0) {
      ++at;
      continue;
    }
    text_fn(text.substr(from, at - from), from);
    out.push_back(id);
    at += bytes;
    from = at;
  }
  text_fn(text.substr(from), from);
}

// Words: byte-level BPE cuts the text by its pattern. Llama 2's kind has no pre-tokenizer (the
// text is one word); it is cut after each line end, which no merge crosses (the line end is its
// byte piece <0x0A>: no token holds one, no merge joins its piece), so that words stay short.
void HfBpe::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  for (size_t at = 0; at < text.size();) {
    size_t end = 0;
    if (kind_ == Kind::kLlama2) {
      const size_t nl = text.find('\n', at);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    } else {
      end = kind_ == Kind::kLlama3 ? llama3_word_end(text, at) : gpt2_word_end(text, at);
    }
    encode_word(text.substr(at, end - at), out);
    at = end;
  }
}

void HfBpe::encode_segment(std::string_view text, bool prepend, std::vector<int32_t>& out) const {
  auto words = [&](std::string_view piece, size_t) { encode_text(piece, out); };
  if (kind_ != Kind::kLlama2) return added_[1].split(text, out, words);
  added_[1].split(normalize_llama2(text, prepend), out, words);
}

std::vector<int32_t> HfBpe::encode(std::string_view text, bool document_start) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  // The added tokens that are not normalized first; each text between them is normalized on its
  // own, and the one at a continued text's start continues the text before it.
  added_[0].split(text, out, [&](std::string_view piece, size_t offset) {
    encode_segment(piece, document_start || offset > 0, out);
  });
  return out;
}

std::string HfBpe::decode(const std::vector<int32_t>& ids) const {
  if (kind_ == Kind::kLlama2) return decode_llama2(ids);
  std::string out;
  for (int32_t id : ids) out += bytes_of_id_[static_cast<size_t>(id)];
  return lossy_utf8(out);
}

// Llama 2's decoder, as Hugging Face runs it with skip_special_tokens: special tokens dropped;
// Replace "▁" with " "; ByteFallback: a run of byte pieces becomes its text if it is UTF-8, else
// one U+FFFD a piece; Fuse; Strip one " " at the start.
std::string HfBpe::decode_llama2(const std::vector<int32_t>& ids) const {
  std::string out, run;  // run: the bytes of byte pieces not yet decoded
  auto end_run = [&] {
    if (lossy_utf8(run) == run) {
      out += run;
    } else {
      for (size_t k = 0; k < run.size(); ++k) out += "\xEF\xBF\xBD";
    }
    run.clear();
  };
  for (const int32_t id : ids) {
    const auto i = static_cast<size_t>(id);
    if (piece_byte_[i] >= 0) {
      run += static_cast<char>(piece_byte_[i]);
    } else if (!bytes_of_id_[i].empty()) {  // special tokens are empty: skipped
      end_run();
      out += bytes_of_id_[i];
    }
  }
  end_run();
  if (!out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace tandem::data::detail
