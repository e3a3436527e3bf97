// `tandem tokenize`: corpus files gathered, the tokenizer trained or loaded, the text cut into
// chunks at line ends (the cuts depend on the text only), chunks encoded by a pool of threads and
// appended in order to the training and validation shards, the folder put in place at the end.
#include "tandem/data/tokenize.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/stop_signal.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/console.h"
#include "tandem/io/token_shards.h"

namespace tandem::data {
namespace fs = std::filesystem;
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;  // text a worker encodes at once
constexpr size_t kSniffBytes = 8192;             // read to tell text from binary files
constexpr size_t kLineSearchBytes = size_t{1} << 20;
constexpr int kMaxThreads = 1024;  // encoding threads (the tokenizer trains on at most 128)

bool hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() > 1 && n[0] == '.' && n != "..";
}

// The offset of the first byte that is not part of valid UTF-8 text (a NUL counts as binary), or
// npos. A sequence cut by the end of `s` is invalid: chunks end at character boundaries. Valid
// is the Unicode standard's well-formed UTF-8 (its table 3-7): no overlong forms (C0, C1, E0 80,
// F0 80), no surrogates (ED A0 to ED BF) and nothing past U+10FFFF (F4 90 and above, F5 to FF).
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c == 0) return i;
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int extra = (c >= 0xC2 && c <= 0xDF)   ? 1
                      : (c >= 0xE0 && c <= 0xEF) ? 2
                      : (c >= 0xF0 && c <= 0xF4) ? 3
                                                 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= n) return i;
    // The second byte's range narrows after E0 (overlong), ED (surrogates), F0 (overlong) and F4
    // (past U+10FFFF); after any other lead it is 80 to BF.
    const unsigned char second = p[i + 1];
    const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (second < lo || second > hi) return i;
    for (int k = 2; k <= extra; ++k)
      if ((p[i + static_cast<size_t>(k)] & 0xC0) != 0x80) return i;
    i += static_cast<size_t>(extra) + 1;
  }
  return std::string_view::npos;
}

// Where a chunk of `s` (the text read from a chunk's start, with more of the file after it) ends:
// after its last newline, else at its end but before a last character the end cuts.
size_t cut_before(std::string_view s) {
  const size_t nl = s.rfind('\n');
  if (nl != std::string_view::npos) return nl + 1;
  size_t lead = s.size();  // back over continuation bytes to the last character's first byte
  while (lead > 0 && (static_cast<unsigned char>(s[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead == 0) return s.size();  // no first byte: the UTF-8 check refuses it
  const auto c = static_cast<unsigned char>(s[--lead]);
  const size_t bytes = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  return lead + bytes <= s.size() || lead == 0 ? s.size() : lead;
}

std::string read_range(const std::string& path, uint64_t offset, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("cannot read text file '{}'", path);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string s(bytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(bytes));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

struct CorpusFile {
  std::string path;
  uint64_t bytes;
};

// Text to encode: a piece of one file, in one split.
struct Chunk {
  size_t file;
  uint64_t offset;
  std::string text;
  bool validation;
  bool ends_file;  // the document's end: an end-of-text token follows its tokens (and a
                   // chunk at offset 0, its start, begins with the tokenizer's bos, if any)
  std::vector<int32_t> ids;
  std::string error;
};

// Reads the corpus in order as chunks: files in order, each cut at the split point
// (file split_file, offset split_offset) into training and validation text.
class ChunkReader {
 public:
  ChunkReader(const std::vector<CorpusFile>& files, size_t split_file, uint64_t split_offset)
      : files_(files), split_file_(split_file), split_offset_(split_offset) {}

  bool next(Chunk& c) {
    while (file_ < files_.size() && pos_ >= files_[file_].bytes) {
      ++file_;
      pos_ = 0;
    }
    if (file_ == files_.size()) return false;
    const CorpusFile& f = files_[file_];
    const bool validation = file_ > split_file_ || (file_ == split_file_ && pos_ >= split_offset_);
    const uint64_t end = file_ == split_file_ && !validation ? split_offset_ : f.bytes;
    const uint64_t want = std::min<uint64_t>(end - pos_, kChunkBytes);
    std::string text = read_range(f.path, pos_, static_cast<size_t>(want));
    if (text.size() != want) user_error("text file '{}' changed while it was read", f.path);
    if (pos_ + want < end) text.resize(cut_before(text));
    c = Chunk{file_, pos_, std::move(text), validation, false, {}, {}};
    pos_ += c.text.size();
    c.ends_file = pos_ == f.bytes;
    return true;
  }

 private:
  const std::vector<CorpusFile>& files_;
  size_t split_file_;
  uint64_t split_offset_;
  size_t file_ = 0;
  uint64_t pos_ = 0;
};

// The shards of one split, a new file every `shard_tokens` tokens.
class ShardSeries {
 public:
  ShardSeries(std::string prefix, const std::string& temp_dir, const std::string& out_dir,
              int vocab, io::Sha256Digest digest, int64_t shard_tokens)
      : prefix_(std::move(prefix)),
        temp_(temp_dir),
        out_(out_dir),
        vocab_(vocab),
        digest_(digest),
        per_shard_(static_cast<uint64_t>(shard_tokens)) {}

  void append(const std::vector<int32_t>& ids) {
    for (size_t at = 0; at < ids.size();) {
      if (!writer_) open();
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(ids.size() - at, per_shard_ - writer_->tokens()));
      writer_->append(ids.data() + at, take);
      at += take;
      total_ += take;
      if (writer_->tokens() == per_shard_) close();
    }
  }
  // Closes the last shard; returns the split's entry in shards.json.
  nlohmann::json finish(uint64_t text_bytes) {
    if (writer_) close();
    return {{"tokens", total_}, {"text_bytes", text_bytes}, {"shards", shards_}};
  }
  uint64_t tokens() const { return total_; }
  int shards() const { return static_cast<int>(shards_.size()); }

 private:
  void open() {
    name_ = fmt::format("{}-{:06}.bin", prefix_, shards_.size());
    writer_ = std::make_unique<io::ShardWriter>((fs::path(temp_) / name_).string(),
                                                (fs::path(out_) / name_).string(), vocab_, digest_);
  }
  void close() {
    const uint64_t n = writer_->tokens();
    const std::string sha = writer_->finish();
    shards_.push_back({{"file", name_}, {"tokens", n}, {"sha256", sha}});
    writer_.reset();
  }

  std::string prefix_, temp_, out_;
  int vocab_;
  io::Sha256Digest digest_;
  uint64_t per_shard_;
  std::unique_ptr<io::ShardWriter> writer_;
  std::string name_;
  nlohmann::json shards_ = nlohmann::json::array();
  uint64_t total_ = 0;
};

// The output folder is written as DIR.tmp-<pid>-<random> beside it (a name drawn at random and made
// exclusively: nothing planted beside DIR is written into), claimed while this process writes it
// (io::FolderClaim), and renamed at the end; destroyed before then (an error, a stop), the
// temporary folder is removed and DIR never appears half written. The leftovers of runs that did
// not end so (a kill) are removed once DIR is in place.
class OutputFolder {
 public:
  explicit OutputFolder(const std::string& dir) : dir_(fs::path(dir).lexically_normal()) {
    if (dir_.filename().empty()) dir_ = dir_.parent_path();
    std::error_code ec;
    if (is_symlink(dir_.string())) refuse_symlink(dir, "output folder ");
    if (fs::exists(dir_, ec)) {
      if (!fs::is_directory(dir_, ec))
        user_error("output folder '{}' is a file; give a new or empty folder", dir);
      if (!fs::is_empty(dir_, ec))
        user_error("output folder '{}' is not empty; give a new or empty folder", dir);
    }
    const fs::path parent = dir_.parent_path().empty() ? fs::path(".") : dir_.parent_path();
    fs::create_directories(parent, ec);
    if (ec) user_error("cannot create output folder '{}': {}", dir, ec.message());
    std::string temp;
    if (create_unique_folder(parent.string(),
                             fmt::format("{}.tmp-{}-", dir_.filename().string(), ::getpid()), 0755,
                             temp) != 0)
      user_error("cannot write output folder '{}': {}", dir, std::strerror(errno));
    temp_ = temp;
    claim_.claim(temp);
  }
  ~OutputFolder() {
    std::error_code ec;
    if (!done_) fs::remove_all(temp_, ec);
  }
  std::string temp() const { return temp_.string(); }
  std::string path() const { return dir_.string(); }
  void commit() {
    io::fsync_folder(temp_.string());
    std::error_code ec;
    if (is_symlink(dir_.string())) refuse_symlink(dir_.string(), "output folder ");
    if (fs::exists(dir_, ec)) fs::remove(dir_, ec);  // empty, checked above
    fs::rename(temp_, dir_, ec);
    if (ec) user_error("cannot write output folder '{}': {}", dir_.string(), ec.message());
    const std::string parent = dir_.parent_path().empty() ? "." : dir_.parent_path().string();
    io::fsync_folder(parent);
    done_ = true;
    io::remove_leftovers(parent, dir_.filename().string());
  }

 private:
  fs::path dir_, temp_;
  io::FolderClaim claim_;
  bool done_ = false;
};

// The split point: `fraction` of the text from the end, moved back to the start of its line.
std::pair<size_t, uint64_t> split_point(const std::vector<CorpusFile>& files, uint64_t total,
                                        double fraction) {
  const uint64_t val = static_cast<uint64_t>(static_cast<double>(total) * fraction);
  if (val == 0) return {files.size(), 0};  // everything trains
  uint64_t at = total - val;
  size_t f = 0;
  while (at >= files[f].bytes) at -= files[f++].bytes;
  const uint64_t from = at > kLineSearchBytes ? at - kLineSearchBytes : 0;
  // [from, at], the byte at `at` included (it exists: at < the file's size).
  const std::string around = read_range(files[f].path, from, static_cast<size_t>(at - from) + 1);
  const size_t nl = at > from ? around.rfind('\n', at - from - 1) : std::string::npos;
  if (nl != std::string::npos) return {f, from + nl + 1};
  if (from == 0) return {f, 0};    // the line starts with the file
  size_t cut = around.size() - 1;  // a very long line: cut it at a character boundary
  while (cut > 0 && (static_cast<unsigned char>(around[cut]) & 0xC0) == 0x80) --cut;
  return {f, from + cut};
}

class TokenizeProgress {
 public:
  TokenizeProgress(std::ostream& out, bool terminal, bool enabled, uint64_t total)
      : out_(out), terminal_(terminal), enabled_(enabled), total_(total) {}
  void update(uint64_t bytes, uint64_t tokens, bool last) {
    // Elsewhere than on a terminal the summary line that follows says it all.
    if (!enabled_ || (last && !terminal_)) return;
    const double t = seconds();
    if (!last && t - last_ < (terminal_ ? 0.25 : 10.0)) return;
    last_ = t;
    const double rate = t > 0 ? static_cast<double>(bytes) / t : 0;
    const double left = rate > 0 ? static_cast<double>(total_ - bytes) / rate : -1;
    const std::string line = fmt::format(
        "tokenize: {:3.0f}% {:.1f}/{:.1f} MB of text, {:.2f} MB/s, {} tokens, {} left",
        total_ ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 100.0,
        static_cast<double>(bytes) / 1e6, static_cast<double>(total_) / 1e6, rate / 1e6, tokens,
        io::format_duration(left));
    out_ << (terminal_ ? "\r" : "") << line << (terminal_ && !last ? "" : "\n") << std::flush;
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::ostream& out_;
  bool terminal_, enabled_;
  uint64_t total_;
  double last_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Encodes `chunks` on `threads` threads; a chunk that is not text carries its error.
void encode_all(std::vector<Chunk>& chunks, const std::vector<CorpusFile>& files,
                const Tokenizer& tok, int threads) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < chunks.size();) {
      Chunk& c = chunks[i];
      const size_t bad = first_invalid_utf8(c.text);
      if (bad != std::string_view::npos) {
        c.error =
            fmt::format("text file '{}' is not UTF-8 text: byte {} (0x{:02x}) is {}",
                        files[c.file].path, c.offset + bad, static_cast<unsigned char>(c.text[bad]),
                        c.text[bad] == '\0' ? "a NUL (a binary file?)" : "not valid UTF-8");
        continue;
      }
      // A chunk after a file's first starts after a line end inside the document.
      c.ids = tok.encode(
          c.text, c.offset == 0 ? Tokenizer::Start::kDocument : Tokenizer::Start::kAfterLineEnd);
      if (c.offset == 0 && tok.bos_id() >= 0) c.ids.insert(c.ids.begin(), tok.bos_id());
      if (c.ends_file && tok.eos_id() >= 0) c.ids.push_back(tok.eos_id());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace

std::vector<std::string> corpus_files(const std::vector<std::string>& inputs) {
  if (inputs.empty()) user_error("tandem tokenize needs text: a file, several, or a folder");
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      user_error("cannot read input '{}': {}", in, ec.message());  // a loop of links, say
    if (!fs::exists(st)) user_error("input '{}' does not exist", in);
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      fs::recursive_directory_iterator it(in, fs::directory_options::follow_directory_symlink, ec),
          end;
      if (ec) user_error("cannot read input folder '{}': {}", in, ec.message());
      for (; it != end; it.increment(ec)) {
        if (ec) user_error("cannot read input folder '{}': {}", in, ec.message());
        // What an entry is, asked without exceptions: a link to itself or a loop of links
        // is named with the folder, not left to the library's text.
        // (A link to nothing is no file, as before.)
        const bool folder = it->is_directory(ec);
        const bool file = !ec && it->is_regular_file(ec);
        if (ec == std::errc::no_such_file_or_directory) ec.clear();
        if (ec)
          user_error("cannot read '{}' in input folder '{}': {}", it->path().string(), in,
                     ec.message());
        if (hidden(it->path())) {
          if (folder) it.disable_recursion_pending();
          continue;
        }
        if (file) found.push_back(it->path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) user_error("input folder '{}' holds no files", in);
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(st)) {
      files.push_back(in);
    } else {
      user_error("input '{}' is neither a file nor a folder", in);
    }
  }
  uint64_t total = 0;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) user_error("cannot read text file '{}'", f);
    std::string head(kSniffBytes, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    if (const size_t nul = head.find('\0'); nul != std::string::npos)
      user_error("text file '{}' is binary (a NUL byte at offset {}); tokenize reads UTF-8 text", f,
                 nul);
    std::error_code size_ec;
    total += fs::file_size(f, size_ec);
  }
  if (total == 0)
    user_error("the corpus ({} file{}) holds no text", files.size(), files.size() == 1 ? "" : "s");
  return files;
}

TokenizeSummary tokenize(const TokenizeConfig& cfg) {
  if (!(cfg.validation_fraction >= 0 && cfg.validation_fraction < 1))
    user_error("--val-fraction {} must be in [0, 1)", cfg.validation_fraction);
  if (cfg.shard_tokens < 1) user_error("--shard-tokens {} must be at least 1", cfg.shard_tokens);
  if (cfg.threads < 0 || cfg.threads > kMaxThreads)
    user_error("--threads {} must be 0 (every core) or from 1 to {}", cfg.threads, kMaxThreads);
  if (cfg.output_dir.empty()) user_error("tandem tokenize needs an output folder (--out DIR)");
  std::ostream& out = cfg.out != nullptr ? *cfg.out : std::cout;
  const int threads = cfg.threads > 0
                          ? cfg.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::vector<CorpusFile> files;
  uint64_t total = 0;
  for (std::string& f : corpus_files(cfg.inputs)) {
    const uint64_t n = fs::file_size(f);
    total += n;
    files.push_back({std::move(f), n});
  }
  // SIGTERM or SIGINT: the run stops at the next batch of chunks (after the tokenizer's training,
  // which cannot be cut short) and removes what it wrote; a second signal ends it at once.
  const StopSignals signals("tandem tokenize", "the text being encoded, writing nothing");
  OutputFolder folder(cfg.output_dir);

  std::vector<std::string> paths;
  for (const CorpusFile& f : files) paths.push_back(f.path);
  if (cfg.progress && cfg.tokenizer.empty())
    out << fmt::format("tokenize: training a BPE tokenizer of {} tokens on {} file{} ...\n",
                       cfg.vocab_size, files.size(), files.size() == 1 ? "" : "s")
        << std::flush;
  const Tokenizer tok = cfg.tokenizer.empty() ? Tokenizer::train(paths, cfg.vocab_size, threads)
                                              : Tokenizer::load(cfg.tokenizer);
  const int vocab = tok.vocab_size();
  const io::Sha256Digest digest = io::digest_from_hex(tok.sha256(), "tokenizer");

  const auto [split_file, split_offset] = split_point(files, total, cfg.validation_fraction);
  uint64_t val_bytes = 0;
  for (size_t f = 0; f < files.size(); ++f)
    if (f > split_file)
      val_bytes += files[f].bytes;
    else if (f == split_file)
      val_bytes += files[f].bytes - split_offset;
  if (cfg.validation_fraction > 0 && val_bytes == 0)
    user_error("--val-fraction {} of {} bytes of text leaves no validation text",
               cfg.validation_fraction, total);

  ShardSeries train("train", folder.temp(), folder.path(), vocab, digest, cfg.shard_tokens);
  ShardSeries val("val", folder.temp(), folder.path(), vocab, digest, cfg.shard_tokens);
  ChunkReader reader(files, split_file, split_offset);
  TokenizeProgress progress(out, cfg.out == nullptr && io::is_terminal(stdout), cfg.progress,
                            total);
  uint64_t done = 0;
  TokenizeSummary stopped;  // the temporary folder is removed with `folder`
  for (;;) {
    if ((stopped.stopped_by = StopSignals::received()) != 0) return stopped;
    std::vector<Chunk> batch;
    Chunk c;
    while (batch.size() < static_cast<size_t>(4 * threads) && reader.next(c))
      batch.push_back(std::move(c));
    if (batch.empty()) break;
    encode_all(batch, files, tok, threads);
    for (Chunk& b : batch) {
      if (!b.error.empty()) user_error("{}", b.error);
      (b.validation ? val : train).append(b.ids);
      done += b.text.size();
    }
    progress.update(done, train.tokens() + val.tokens(), false);
  }
  progress.update(done, train.tokens() + val.tokens(), true);
  if ((stopped.stopped_by = StopSignals::received()) != 0) return stopped;

  const nlohmann::json index = {{"format", "tandem token shards"},
                                {"version", kShardsFormatVersion},
                                {"vocab_size", vocab},
                                {"dtype", io::token_bytes_for(vocab) == 2 ? "uint16" : "uint32"},
                                {"eos_id", tok.eos_id()},
                                {"bos_id", tok.bos_id()},
                                {"tokenizer", std::string(tok.file_name())},
                                {"tokenizer_sha256", tok.sha256()},
                                {"tokenizer_source", tok.source()},
                                {"inputs", {{"files", files.size()}, {"text_bytes", total}}},
                                {"train", train.finish(total - val_bytes)},
                                {"validation", val.finish(val_bytes)}};
  io::write_file_atomic((fs::path(folder.temp()) / tok.file_name()).string(), tok.model_bytes());
  io::write_file_atomic((fs::path(folder.temp()) / kShardsJson).string(), index.dump(2) + "\n");
  folder.commit();

  TokenizeSummary s{vocab,        files.size(),   total,       train.tokens(),
                    val.tokens(), train.shards(), val.shards()};
  out << fmt::format(
      "tandem tokenize: {} file{}, {:.2f} MB of text -> {} training tokens in {} shard{}, {} "
      "validation tokens in {} shard{} (vocabulary {}, {}), {:.2f} MB/s on {} thread{}; wrote "
      "{}\n",
      s.files, s.files == 1 ? "" : "s", static_cast<double>(total) / 1e6, s.train_tokens,
      s.train_shards, s.train_shards == 1 ? "" : "s", s.validation_tokens, s.validation_shards,
      s.validation_shards == 1 ? "" : "s", vocab, index["dtype"].get<std::string>(),
      static_cast<double>(total) / 1e6 / std::max(1e-9, progress.seconds()), threads,
      threads == 1 ? "" : "s", folder.path());
  return s;
}

}  // namespace tandem::data
