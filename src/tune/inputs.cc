// The autotuner's inputs (hashed from name, rank and index) and its check of a schedule's results
// against the reference interpreter's.
#include "tandem/tune/inputs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "tandem/core/error.h"

namespace tandem::tune {
namespace {

uint64_t name_seed(const std::string& name, int index) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
}

// A 32-bit integer hash (lowbias32): only 32-bit multiplies and shifts, so that the fill loops
// vectorise; refilling a 64 Mi input then takes tens of milliseconds, not a second.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline float value_at(uint32_t seed, uint32_t i) {
  return 0.25f + static_cast<float>(mix32(i * 0x9E3779B1u + seed) >> 8) * 0x1p-24f;
}

// Fills `count` elements of `t` from flat offset `dst`, with the whole value's elements from
// global flat index `src` on.
void fill_run(const Tensor& t, int64_t dst, uint64_t seed, int64_t src, int64_t count) {
  // Indices past 2^32 fold their high half into the seed.
  int64_t done = 0;
  while (done < count) {
    const int64_t g = src + done;
    const uint64_t hi = static_cast<uint64_t>(g) >> 32;
    const uint32_t lo = static_cast<uint32_t>(g);
    const int64_t n =
        std::min<int64_t>(count - done, static_cast<int64_t>((uint64_t{1} << 32) - lo));
    const uint32_t s = static_cast<uint32_t>(seed ^ (seed >> 32) ^ (hi * 0x85ebca6bu));
    const int64_t at = dst + done;
    switch (t.dtype()) {
      case DType::F32: {
        float* p = t.data_as<float>() + at;
        for (int64_t k = 0; k < n; ++k) p[k] = value_at(s, lo + static_cast<uint32_t>(k));
        break;
      }
      case DType::BF16: {
        uint16_t* p = t.data_as<uint16_t>() + at;
        for (int64_t k = 0; k < n; ++k)
          p[k] = f32_to_bf16(value_at(s, lo + static_cast<uint32_t>(k)));
        break;
      }
      case DType::F16: {
        uint16_t* p = t.data_as<uint16_t>() + at;
        for (int64_t k = 0; k < n; ++k)
          p[k] = f32_to_f16(value_at(s, lo + static_cast<uint32_t>(k)));
        break;
      }
    }
    done += n;
  }
}

// The seed index of an input: Local and Partial inputs differ by rank, the others do not.
int seed_index(const dsl::Stage& s, const exec::Placement& place) {
  const dsl::Layout& l = s.type.layout;
  return l.is_local() || l.is_partial() ? place.index : 0;
}

// Fills this rank's piece of input `s` (global shape `global`).
void fill_stage(const Tensor& t, const dsl::Stage& s, const Shape& global,
                const exec::Placement& place) {
  const uint64_t seed = name_seed(s.name, seed_index(s, place));
  const dsl::Layout& l = s.type.layout;
  if (!l.is_sliced()) {
    fill_run(t, 0, seed, 0, t.numel());
    return;
  }
  // Sliced(d): rows [off, off + cnt) of dim d, for every index of the dims before d.
  const exec::Around a = exec::around(global, l.dim);
  const int64_t off = dsl::part_offset(a.rows, place.group_size, place.index);
  const int64_t cnt = dsl::part_count(a.rows, place.group_size, place.index);
  for (int64_t o = 0; o < a.outer; ++o)
    fill_run(t, o * cnt * a.inner, seed, (o * a.rows + off) * a.inner, cnt * a.inner);
}

double tolerance(DType t) {
  switch (t) {
    case DType::F32:
      return 2e-4;
    case DType::BF16:
      return 0x1p-7;
    case DType::F16:
      return 0x1p-9;
  }
  return 2e-4;
}

// The layout `name` has in `program`: its input's if it is an input, else its output's.
std::optional<dsl::Layout> layout_of(const dsl::Program& program, const std::string& name) {
  for (int id : program.inputs())
    if (program.stage(id).name == name) return program.stage(id).type.layout;
  for (const dsl::Output& o : program.outputs())
    if (o.name == name) return program.stage(o.stage).type.layout;
  return std::nullopt;
}

}  // namespace

float input_value(const std::string& name, int index, int64_t i) {
  Tensor t = Tensor::empty(DType::F32, Shape{1});
  fill_run(t, 0, name_seed(name, index), i, 1);
  return t.get(0);
}

exec::ScalarMap standard_scalars(const dsl::Program& program, int p, const exec::ScalarMap& given) {
  std::vector<std::string> names;
  for (int id : program.scalars()) names.push_back(program.stage(id).name);
  for (const auto& [name, v] : given)
    if (std::find(names.begin(), names.end(), name) == names.end())
      user_error("program '{}' has no scalar '{}' (its scalars: {})", program.name(), name,
                 fmt::join(names, ", "));
  const exec::ScalarMap known = {{"lr", 1e-3},           {"beta1", 0.9},         {"beta2", 0.999},
                                 {"eps", 1e-8},          {"step", 1.0},          {"seed", 1234},
                                 {"weight_decay", 0.01}, {"grad_scale", 1.0 / p}};
  exec::ScalarMap out;
  for (int id : program.scalars()) {
    const std::string& name = program.stage(id).name;
    if (auto it = given.find(name); it != given.end())
      out[name] = it->second;
    else if (auto k = known.find(name); k != known.end())
      out[name] = k->second;
    else
      out[name] = exec::keys_dropout(program, id) ? 1234.0 : 0.5;
  }
  return out;
}

void fill_input(const Tensor& t, const dsl::Program& program, int id, const Shape& global,
                const exec::Placement& place) {
  const dsl::Stage& s = program.stage(id);
  TANDEM_CHECK(s.op == dsl::Op::Input, "stage {} of '{}' is not an input", s.name, program.name());
  const Shape want = dsl::local_shape(global, s.type.layout, place.group_size, place.index);
  TANDEM_CHECK(t.dtype() == s.type.dtype && t.shape() == want,
               "input '{}' is {}, its piece is {}{}", s.name, t.str(), dtype_name(s.type.dtype),
               want.str());
  fill_stage(t, s, global, place);
}

exec::RunArgs make_args(const dsl::Program& program, const exec::Placement& place,
                        const dsl::SymbolMap& symbols, const exec::ScalarMap& scalars) {
  exec::RunArgs args;
  args.symbols = symbols;
  args.scalars = scalars;
  const std::vector<Shape> global = program.resolve_shapes(symbols);
  for (int id : program.inputs()) {
    const dsl::Stage& s = program.stage(id);
    if (!place.holds(s)) continue;
    const Shape& g = global[static_cast<size_t>(id)];
    Tensor t = Tensor::empty(s.type.dtype,
                             dsl::local_shape(g, s.type.layout, place.group_size, place.index));
    fill_stage(t, s, g, place);
    args.inputs[s.name] = t;
  }
  return args;
}

dsl::SymbolMap shrink_sizes(const dsl::Program& program, const dsl::SymbolMap& sizes, int64_t limit,
                            int64_t modulus) {
  auto largest = [&](const dsl::SymbolMap& sym) {
    int64_t most = 0;
    for (const Shape& s : program.resolve_shapes(sym)) most = std::max(most, s.numel());
    return most;
  };
  if (limit <= 0 || largest(sizes) <= limit) return sizes;
  const int64_t m = std::max<int64_t>(modulus, 1);
  int64_t top = 1;
  for (const auto& [name, e] : sizes) top = std::max(top, e);
  dsl::SymbolMap out = sizes;
  for (int64_t d = 2; d <= top; d = d < 16 ? d + 1 : d + d / 4) {
    for (const auto& [name, e] : sizes) {
      const int64_t r = e % m;
      out[name] = e <= 2 * m ? e : std::max((e / d) / m * m + r, m + r);
    }
    if (largest(out) <= limit) break;
  }
  return out;
}

Expected reference_results(const dsl::Program& program, comm::Communicator& comm,
                           const dsl::SymbolMap& symbols, const exec::ScalarMap& scalars) {
  const exec::Placement place = exec::placement(program, comm);
  exec::RunArgs args = make_args(program, place, symbols, scalars);
  Expected e;
  e.global = program.resolve_shapes(symbols);
  e.values = exec::run_reference(program, comm, args);
  for (int id : program.inputs()) {
    const dsl::Stage& s = program.stage(id);
    if (program.updater(id) >= 0 && place.holds(s)) e.values[s.name] = args.inputs.at(s.name);
  }
  return e;
}

Check compare_results(const dsl::Program& scheduled, const exec::Placement& place,
                      const Expected& want, const exec::TensorMap& got) {
  Check c;
  auto fail = [&](std::string msg) {
    if (c.ok) c.message = std::move(msg);
    c.ok = false;
  };
  for (const auto& [name, w_whole] : want.values) {
    auto it = got.find(name);
    if (it == got.end()) {
      fail(fmt::format("'{}' is missing from the schedule's results", name));
      continue;
    }
    const Tensor& g = it->second;
    Tensor w = w_whole;
    if (g.numel() != w.numel()) {
      // The schedule stores it sliced (as_slice): compare with this rank's part.
      const auto lo = layout_of(scheduled, name);
      if (lo && lo->is_sliced() && w.shape().rank() > lo->dim)
        w = exec::piece_of(w_whole, *lo, place.group_size, place.index);
      if (g.numel() != w.numel()) {
        fail(fmt::format("'{}' is {} in the schedule's results, {} in the reference's", name,
                         g.str(), w.str()));
        continue;
      }
    }
    // Both as f32 (exact for every dtype), so the loops below need no dtype switch.
    const Tensor gf = g.dtype() == DType::F32 ? g : g.to(DType::F32);
    const Tensor wf = w.dtype() == DType::F32 ? w : w.to(DType::F32);
    const float* gp = gf.data_as<float>();
    const float* wp = wf.data_as<float>();
    double scale = 0;
    for (int64_t i = 0; i < w.numel(); ++i)
      scale = std::max(scale, std::fabs(static_cast<double>(wp[i])));
    const double tol = tolerance(g.dtype());
    int64_t bad = 0;
    std::string first;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double gv = gp[i], wv = wp[i];
      const double bound = std::fabs(wv) + scale;
      const double diff = std::fabs(gv - wv);
      const bool nan_mismatch = std::isnan(gv) != std::isnan(wv);
      if (!std::isnan(diff) && bound > 0) c.max_error = std::max(c.max_error, diff / bound);
      if (nan_mismatch || diff > tol * bound) {
        if (bad < 3) first += fmt::format(" [{}] got {} want {};", i, gv, wv);
        ++bad;
      }
    }
    if (bad > 0)
      fail(
          fmt::format("'{}' differs from the reference in {} of {} elements (tolerance {:g} "
                      "relative to |want| + "
                      "max |want| = {:g}):{}",
                      name, bad, w.numel(), tol, scale, first));
  }
  return c;
}

}  // namespace tandem::tune
