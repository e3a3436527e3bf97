// The loaders under random damage: valid safetensors files and checkpoints' meta.json, mutated
// thousands of times (bytes flipped or overwritten, truncated, extended with random bytes, ranges
// spliced in, cut out or duplicated), seeded so that every run tries the same files. Each mutant
// must either load, and then be what was written (a file with checksums) or at least well formed
// (a file without them, whose data no reader can check), or be refused with a UserError: never
// another exception, a crash or a hang. The unit label puts it under the asan preset in CI.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/io/checkpoint.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;

// Deterministic across standard libraries: the engine is specified, and no distribution is used.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  std::string random_bytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  // One to three mutations of `file`; `what` says which, for the failure message.
  std::string mutate(std::string file, std::string* what) {
    const size_t count = 1 + below(3);
    for (size_t k = 0; k < count; ++k) file = mutate_once(std::move(file), what);
    return file;
  }

 private:
  std::string mutate_once(std::string f, std::string* what) {
    // Characters that JSON gives meaning to, so that header mutations get past the parser.
    static const std::string kSpecial = "\"{}[],:0123456789 \t-.eE\\u\xff";
    const size_t at = below(f.size());
    switch (below(8)) {
      case 0:  // flip bits of one byte
        if (f.empty()) break;
        f[at] = static_cast<char>(f[at] ^ (1 + below(255)));
        *what += fmt::format(" flip@{}", at);
        break;
      case 1:  // overwrite one byte with a meaningful character
        if (f.empty()) break;
        f[at] = kSpecial[below(kSpecial.size())];
        *what += fmt::format(" set@{}", at);
        break;
      case 2:  // the header length field
        if (f.size() < 8) break;
        f[below(8)] = static_cast<char>(rng_());
        *what += " length";
        break;
      case 3:  // truncate
        f.resize(at);
        *what += fmt::format(" truncate@{}", at);
        break;
      case 4: {  // extend with random bytes
        const size_t n = 1 + below(64);
        f += random_bytes(n);
        *what += fmt::format(" extend+{}", n);
        break;
      }
      case 5: {  // copy a range of the file over another place
        if (f.empty()) break;
        const size_t from = below(f.size()), n = 1 + below(std::min<size_t>(32, f.size() - from));
        const size_t to = below(f.size() - n + 1);
        f.replace(to, n, f.substr(from, n));
        *what += fmt::format(" copy[{},+{}]@{}", from, n, to);
        break;
      }
      case 6: {  // cut a range out
        if (f.empty()) break;
        const size_t n = 1 + below(std::min<size_t>(16, f.size() - at));
        f.erase(at, n);
        *what += fmt::format(" cut[{},+{}]", at, n);
        break;
      }
      default: {  // insert a range of the file elsewhere
        if (f.empty()) break;
        const size_t from = below(f.size()), n = 1 + below(std::min<size_t>(16, f.size() - from));
        f.insert(at, f.substr(from, n));
        *what += fmt::format(" insert[{},+{}]@{}", from, n, at);
        break;
      }
    }
    return f;
  }

  std::mt19937_64 rng_;
};

std::vector<NamedTensor> sample_tensors() {
  auto filled = [](DType t, Shape s, float base) {
    Tensor x = Tensor::empty(t, std::move(s));
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, base + static_cast<float>(i) * 0.5f);
    return x;
  };
  return {{"h.0.attn.c_attn.weight", filled(DType::F32, Shape{2, 3}, 1.0f)},
          {"h.1.attn.c_attn.weight", filled(DType::F32, Shape{2, 3}, -1.0f)},
          {"ln_f.bias", filled(DType::BF16, Shape{4}, 0.25f)},
          {"h.0.mlp.c_fc.weight", filled(DType::F16, Shape{3}, 2.0f)},
          {"empty", filled(DType::F32, Shape{0}, 0.0f)}};
}

bool same_file(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i].tensor, &y = b.tensors[i].tensor;
    if (a.tensors[i].name != b.tensors[i].name || x.dtype() != y.dtype() ||
        x.shape() != y.shape() || std::memcmp(x.data(), y.data(), x.nbytes()) != 0)
      return false;
  }
  return true;
}

// Every tensor's storage has the size its dtype and shape say.
bool well_formed(const SafetensorsFile& f) {
  for (const NamedTensor& t : f.tensors)
    if (t.tensor.nbytes() != static_cast<size_t>(t.tensor.numel()) * dtype_size(t.tensor.dtype()))
      return false;
  return true;
}

// Replaces a file's contents by a new file: truncating and rewriting it in place makes ext4 flush
// it on close (its auto_da_alloc), which would take this test from about a second to ten.
void rewrite(const std::string& path, const std::string& bytes) {
  std::filesystem::remove(path);
  testing::write_bytes(path, bytes);
}

enum class Outcome { Loaded, Refused };

// Runs `load`; a UserError is a refusal, anything else a test failure naming the mutation.
template <typename F>
Outcome try_load(F&& load, const std::string& what) {
  try {
    load();
    return Outcome::Loaded;
  } catch (const UserError&) {
    return Outcome::Refused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "mutation" << what << " raised " << typeid(e).name() << ": " << e.what();
  }
  return Outcome::Refused;
}

void mutate_safetensors(Checksums checksums, uint64_t seed, int iterations) {
  ScratchDir dir;
  const std::string path = dir.path("m.safetensors");
  const std::string good = serialize_safetensors(sample_tensors(), {{"format", "pt"}}, checksums);
  const SafetensorsFile want = parse_safetensors(good, "m");
  Mutator m(seed);
  int loaded = 0, refused = 0;
  for (int i = 0; i < iterations; ++i) {
    std::string what;
    const std::string bad = m.mutate(good, &what);
    SafetensorsFile got;
    // Most through memory; every eighth through a file (the pread path).
    const bool on_disk = i % 8 == 0;
    if (on_disk) rewrite(path, bad);
    const Outcome o = try_load(
        [&] { got = on_disk ? load_safetensors(path) : parse_safetensors(bad, "m"); }, what);
    if (o == Outcome::Refused) {
      ++refused;
      continue;
    }
    ++loaded;
    if (checksums == Checksums::Record) {
      EXPECT_TRUE(same_file(got, want)) << "mutation" << what << " loaded something else";
    } else {
      EXPECT_TRUE(well_formed(got)) << "mutation" << what;
    }
  }
  // The mutations must mostly be refused, else they test little.
  EXPECT_GT(refused, iterations * 9 / 10) << loaded << " loaded";
}

TEST(LoaderMutation, SafetensorsWithChecksumsLoadIdenticallyOrAreRefused) {
  mutate_safetensors(Checksums::Record, 0x5eed0001, 5000);
}

TEST(LoaderMutation, SafetensorsWithoutChecksumsLoadWellFormedOrAreRefused) {
  mutate_safetensors(Checksums::None, 0x5eed0002, 2000);
}

// meta.json carries no checksum (a person may edit it): a mutant either loads, with every field
// valid and the tensors untouched, or is refused.
TEST(LoaderMutation, CheckpointMetaLoadsValidOrIsRefused) {
  ScratchDir dir;
  const std::string ck = dir.path("ck");
  Checkpoint c;
  c.meta.model_config = {{"d_model", 8}, {"layers", 2}, {"heads", 2}};
  c.meta.step = 1234;
  c.meta.data_source = "synthetic";
  c.meta.data_fingerprint = "00ff";
  c.meta.rng_seed = 42;
  c.meta.optimizer = "adamw";
  c.meta.optimizer_hparams = {{"lr", 3e-4}, {"beta1", 0.9}};
  c.weights = sample_tensors();
  c.optimizer = {{"m.ln_f.bias", Tensor::zeros(DType::F32, Shape{4})}};
  save_checkpoint(ck, c);
  const std::string meta = testing::read_bytes(ck + "/meta.json");
  const std::string weights = testing::read_bytes(ck + "/weights.safetensors");
  const SafetensorsFile want_weights = {"", parse_safetensors(weights, "w").tensors, {}};
  Mutator m(0x5eed0003);
  int refused = 0;
  const int iterations = 2000;
  for (int i = 0; i < iterations; ++i) {
    std::string what;
    // Mostly meta.json; every fourth mutant is of the weights, through the checkpoint reader.
    const bool of_weights = i % 4 == 3;
    rewrite(ck + "/meta.json", of_weights ? meta : m.mutate(meta, &what));
    rewrite(ck + "/weights.safetensors", of_weights ? m.mutate(weights, &what) : weights);
    Checkpoint got;
    if (try_load([&] { got = load_checkpoint(ck); }, what) == Outcome::Refused) {
      ++refused;
      continue;
    }
    // Whatever loaded is a valid RunMeta (it survives its own JSON) and the tensors as written.
    EXPECT_EQ(run_meta_from_json(run_meta_to_json(got.meta), "again"), got.meta) << what;
    EXPECT_TRUE(same_file({"", got.weights, {}}, want_weights)) << "mutation" << what;
    if (of_weights) {
      EXPECT_EQ(got.meta, c.meta) << what;
    }
  }
  EXPECT_GT(refused, iterations / 2);
}

}  // namespace
}  // namespace tandem::io
