// The reference interpreter op by op, on 1 to 4 in-process ranks with uneven slices: each result
// is gathered whole and compared with a straightforward computation written here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>

#include "exec/workload_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::testing {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary reads best unqualified
using exec::RunArgs;
using exec::ScalarMap;
using exec::TensorMap;

// A whole tensor with element i = f(i).
Tensor make(DType t, Shape s, const std::function<double(int64_t)>& f) {
  Tensor x = Tensor::empty(t, std::move(s));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<float>(f(i)));
  return x;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
  return v;
}

// Runs `program` on `ranks` threads, giving each rank its piece of `wholes` (by the inputs'
// declared layouts), and returns rank 0's outputs (and checks every rank agrees on Replicated
// ones).
TensorMap run_on(int ranks, const Program& program, const TensorMap& wholes,
                 const ScalarMap& scalars = {}, const SymbolMap& symbols = {}) {
  std::vector<TensorMap> outs(static_cast<size_t>(ranks));
  comm::run_ranks(ranks, [&](comm::Communicator& c) {
    RunArgs args;
    args.scalars = scalars;
    args.symbols = symbols;
    for (int id : program.inputs()) {
      const Stage& s = program.stage(id);
      args.inputs[s.name] =
          exec::piece_of(wholes.at(s.name).clone(), s.type.layout, c.size(), c.rank());
    }
    outs[static_cast<size_t>(c.rank())] = exec::run_reference(program, c, args);
  });
  for (const auto& [name, t] : outs[0])
    for (int r = 1; r < ranks; ++r)
      EXPECT_TRUE(close(fmt::format("{} on rank {} vs rank 0", name, r),
                        outs[static_cast<size_t>(r)].at(name), values(t), 0, 0));
  return outs[0];
}

constexpr int kRanks[] = {1, 2, 3, 4};

TEST(Pieces, SliceAndPutRowsRoundTrip) {
  const Tensor whole = make(DType::F32, Shape{3, 5, 2}, [](int64_t i) { return i; });
  for (int d = 0; d < 3; ++d)
    for (int p = 1; p <= 4; ++p) {
      Tensor back = Tensor::zeros(DType::F32, whole.shape());
      for (int r = 0; r < p; ++r) {
        const Tensor piece = exec::piece_of(whole, Sliced(d), p, r);
        EXPECT_EQ(piece.shape(), local_shape(whole.shape(), Sliced(d), p, r));
        exec::put_rows(back, piece, d, part_offset(whole.shape()[d], p, r));
      }
      EXPECT_TRUE(close(fmt::format("dim {} p {}", d, p), back, values(whole), 0, 0));
    }
}

// Every unary and binary op on a Sliced operand with a Replicated partner, against <cmath>.
TEST(Elementwise, EveryOpAgainstCmath) {
  struct Case {
    const char* name;
    std::function<Expr(Expr, Expr)> build;
    std::function<double(double, double)> want;
  };
  const std::vector<Case> cases = {
      {"neg", [](Expr a, Expr) { return -a; }, [](double a, double) { return -a; }},
      {"abs", [](Expr a, Expr) { return abs(a); }, [](double a, double) { return std::fabs(a); }},
      {"sqrt", [](Expr a, Expr) { return sqrt(abs(a)); },
       [](double a, double) { return std::sqrt(std::fabs(a)); }},
      {"rsqrt", [](Expr, Expr b) { return rsqrt(b); },
       [](double, double b) { return 1 / std::sqrt(b); }},
      {"exp", [](Expr a, Expr) { return exp(a); }, [](double a, double) { return std::exp(a); }},
      {"log", [](Expr, Expr b) { return log(b); }, [](double, double b) { return std::log(b); }},
      {"tanh", [](Expr a, Expr) { return tanh(a); }, [](double a, double) { return std::tanh(a); }},
      {"gelu", [](Expr a, Expr) { return gelu(a); },
       [](double a, double) {
         return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
       }},
      {"relu", [](Expr a, Expr) { return relu(a); },
       [](double a, double) { return a > 0 ? a : 0; }},
      {"add", [](Expr a, Expr b) { return a + b; }, [](double a, double b) { return a + b; }},
      {"sub", [](Expr a, Expr b) { return b - a; }, [](double a, double b) { return b - a; }},
      {"mul", [](Expr a, Expr b) { return a * b; }, [](double a, double b) { return a * b; }},
      {"div", [](Expr a, Expr b) { return a / b; }, [](double a, double b) { return a / b; }},
      {"pow", [](Expr a, Expr b) { return pow(b, a); },
       [](double a, double b) { return std::pow(b, a); }},
      {"pow3", [](Expr a, Expr) { return pow(a, 3.0); },
       [](double a, double) { return a * a * a; }},
      {"max", [](Expr a, Expr b) { return max(a, b); },
       [](double a, double b) { return std::max(a, b); }},
      {"min", [](Expr a, Expr b) { return min(a, 0.5); },
       [](double a, double) { return std::min(a, 0.5); }},
      {"lt", [](Expr a, Expr b) { return a < b; },
       [](double a, double b) { return a < b ? 1.0 : 0.0; }},
      {"le", [](Expr a, Expr b) { return a <= 0.25; },
       [](double a, double) { return a <= 0.25 ? 1.0 : 0.0; }},
      {"gt", [](Expr a, Expr b) { return a > b; },
       [](double a, double b) { return a > b ? 1.0 : 0.0; }},
      {"ge", [](Expr a, Expr b) { return a >= b; },
       [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
      {"eq", [](Expr a, Expr b) { return eq(a, a); }, [](double, double) { return 1.0; }},
      {"ne", [](Expr a, Expr b) { return ne(a, b); },
       [](double a, double b) { return a != b ? 1.0 : 0.0; }},
      {"select", [](Expr a, Expr b) { return select(a > 0, a, b); },
       [](double a, double b) { return a > 0 ? a : b; }},
  };
  // a in [-1.5, 1.5] (multiples of 1/8: 0.25 appears), b in [0.5, 2].
  auto a_at = [](int64_t i) { return static_cast<double>(i % 25 - 12) / 8.0; };
  auto b_at = [](int64_t i) { return 0.5 + static_cast<double>(i % 7) / 4.0; };
  for (const Case& c : cases) {
    Program p(c.name);
    const Expr a = p.input(F32, {6, 7}, Sliced(1), "a");
    const Expr b = p.input(F32, {6, 7}, Replicated, "b");
    const Expr y = c.build(a, b);  // Sliced(1), or Replicated for the ops of b alone
    p.output(y.type().layout.is_sliced() ? AllGather(y) : y, "y");
    std::vector<double> want(42);
    for (int64_t i = 0; i < 42; ++i) want[static_cast<size_t>(i)] = c.want(a_at(i), b_at(i));
    for (int ranks : kRanks) {
      const TensorMap out = run_on(
          ranks, p, {{"a", make(F32, Shape{6, 7}, a_at)}, {"b", make(F32, Shape{6, 7}, b_at)}});
      // One f32 operation (a few for gelu) against double: a few ulps.
      EXPECT_TRUE(
          close(fmt::format("{} on {} ranks", c.name, ranks), out.at("y"), want, 1e-6, 1e-7));
    }
  }
}

TEST(Elementwise, BroadcastBiasOverSlicedRowsAndColumns) {
  for (int dim : {0, 1}) {
    Program p("bias");
    const Expr x = p.input(F32, {5, 7}, Sliced(dim), "x");
    const Expr bias = p.input(F32, {7}, Replicated, "bias");
    const Expr k = p.scalar("k");
    p.output(AllGather(x * k + bias), "y");
    std::vector<double> want(35);
    for (int64_t i = 0; i < 35; ++i)
      want[static_cast<size_t>(i)] = static_cast<double>(i) * 0.5 + (i % 7) * 10.0;
    for (int ranks : kRanks) {
      const TensorMap out =
          run_on(ranks, p,
                 {{"x", make(F32, Shape{5, 7}, [](int64_t i) { return i; })},
                  {"bias", make(F32, Shape{7}, [](int64_t i) { return 10.0 * i; })}},
                 {{"k", 0.5}});
      EXPECT_TRUE(close(fmt::format("x*k + bias, Sliced({}), {} ranks", dim, ranks), out.at("y"),
                        want, 0, 0));
    }
  }
}

TEST(Elementwise, CastRoundsToNearestEven) {
  Program p("cast");
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x");
  p.output(AllGather(cast(x, BF16)), "b");
  p.output(AllGather(cast(x, F16)), "h");
  const Tensor whole = make(F32, Shape{9}, [](int64_t i) { return 1.0 + i * 0x1p-9 + 1e-5 * i; });
  std::vector<double> bf(9), hf(9);
  for (int64_t i = 0; i < 9; ++i) {
    bf[static_cast<size_t>(i)] = bf16_to_f32(f32_to_bf16(whole.get(i)));
    hf[static_cast<size_t>(i)] = f16_to_f32(f32_to_f16(whole.get(i)));
  }
  for (int ranks : kRanks) {
    const TensorMap out = run_on(ranks, p, {{"x", whole}}, {}, {{"N", 9}});
    EXPECT_EQ(out.at("b").dtype(), BF16);
    EXPECT_TRUE(close("bf16", out.at("b"), bf, 0, 0));
    EXPECT_TRUE(close("f16", out.at("h"), hf, 0, 0));
  }
}

// The same mask whatever the rank count or slicing: keyed by the element's index in the whole.
TEST(Dropout, SameMaskOnEveryRankCountAndSlicing) {
  const int64_t rows = 7, cols = 9;
  const uint64_t seed = 42;
  std::vector<double> want(static_cast<size_t>(rows * cols));
  int64_t kept = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), 0.3f);
    kept += keep;
    want[static_cast<size_t>(i)] =
        keep ? (i + 1) * static_cast<double>(static_cast<float>(1 / 0.7)) : 0.0;
  }
  EXPECT_GT(kept, rows * cols / 2);
  EXPECT_LT(kept, rows * cols);
  for (int dim : {0, 1}) {
    Program p("drop");
    const Expr x = p.input(F32, {rows, cols}, Sliced(dim), "x");
    p.output(AllGather(dropout(x, 0.3, p.scalar("seed"))), "y");
    for (int ranks : kRanks) {
      const TensorMap out =
          run_on(ranks, p, {{"x", make(F32, Shape{rows, cols}, [](int64_t i) { return i + 1; })}},
                 {{"seed", static_cast<double>(seed)}});
      EXPECT_TRUE(close(fmt::format("dropout Sliced({}) {} ranks", dim, ranks), out.at("y"), want,
                        1e-7, 0));
    }
  }
}

// Sum, max and min over each dim of a Sliced tensor (the sliced one needs the cross-rank step),
// over all dims, and the norm.
TEST(Reductions, OverEveryDimOfASlicedTensor) {
  const int64_t A = 3, B = 5, C = 4;
  auto at = [](int64_t i) {
    return static_cast<double>((i * 7) % 19) - 9.0;
  };  // integers: exact sums
  const Tensor whole = make(F32, Shape{A, B, C}, at);
  auto want_dim = [&](ReduceOp op, int dim) {
    const int64_t ext[3] = {A, B, C};
    std::vector<double> out;
    for (int64_t i = 0; i < A; ++i)
      for (int64_t j = 0; j < B; ++j)
        for (int64_t k = 0; k < C; ++k) {
          const int64_t idx[3] = {i, j, k};
          if (idx[dim] != 0) continue;
          double acc = op == Sum ? 0 : (op == Max ? -1e30 : 1e30);
          for (int64_t t = 0; t < ext[dim]; ++t) {
            int64_t q[3] = {i, j, k};
            q[dim] = t;
            const double v = at((q[0] * B + q[1]) * C + q[2]);
            acc = op == Sum ? acc + v : (op == Max ? std::max(acc, v) : std::min(acc, v));
          }
          out.push_back(acc);
        }
    return out;
  };
  double total = 0, sq = 0;
  for (int64_t i = 0; i < A * B * C; ++i) total += at(i), sq += at(i) * at(i);
  for (int sliced : {0, 1, 2}) {
    Program p("reduce");
    const Expr x = p.input(F32, {A, B, C}, Sliced(sliced), "x");
    for (ReduceOp op : {Sum, Max, Min})
      for (int dim = 0; dim < 3; ++dim) {
        Expr r = reduce(op, x, dim);
        if (r.type().layout.is_sliced()) r = AllGather(r);
        p.output(r, fmt::format("{}{}", reduce_op_name(op), dim));
      }
    p.output(reduce(Sum, x), "all");
    p.output(norm(x), "norm");
    for (int ranks : kRanks) {
      const TensorMap out = run_on(ranks, p, {{"x", whole}});
      const std::string where = fmt::format("Sliced({}), {} ranks", sliced, ranks);
      for (ReduceOp op : {Sum, Max, Min})
        for (int dim = 0; dim < 3; ++dim) {
          const std::string name = fmt::format("{}{}", reduce_op_name(op), dim);
          EXPECT_TRUE(close(name + " " + where, out.at(name), want_dim(op, dim), 0, 0));
        }
      EXPECT_TRUE(close("all " + where, out.at("all"), {total}, 0, 0));
      EXPECT_TRUE(close("norm " + where, out.at("norm"), {std::sqrt(sq)}, 1e-6, 0));
    }
  }
}

// Every matmul layout rule, run: the result brought whole (AllReduce for Partial, AllGather for
// Sliced) equals the plain product.
TEST(Matmul, EveryLayoutRuleComputesTheProduct) {
  struct Case {
    Layout a, b;
    Shape sa, sb;
  };
  const std::vector<Case> cases = {
      {Replicated, Replicated, {4, 5}, {5, 3}},     {Sliced(1), Sliced(0), {4, 7}, {7, 3}},
      {Sliced(1), Replicated, {4, 7}, {7, 3}},      {Replicated, Sliced(0), {4, 7}, {7, 3}},
      {Sliced(0), Replicated, {5, 3}, {3, 2}},      {Replicated, Sliced(1), {2, 3}, {3, 5}},
      {Sliced(0), Sliced(0), {3, 2, 4}, {3, 4, 2}}, {Sliced(0), Replicated, {3, 2, 4}, {4, 2}},
      {Sliced(1), Replicated, {2, 5, 3}, {3, 2}},   {Replicated, Sliced(1), {2, 3}, {2, 3, 5}},
      {Replicated, Sliced(2), {2, 3}, {2, 3, 5}},   {Replicated, Sliced(0), {3, 2, 4}, {3, 4, 2}},
  };
  for (const Case& c : cases) {
    Program p("mm");
    const Expr a =
        p.input(F32, SymShape(std::vector<Dim>(c.sa.dims().begin(), c.sa.dims().end())), c.a, "a");
    const Expr b =
        p.input(F32, SymShape(std::vector<Dim>(c.sb.dims().begin(), c.sb.dims().end())), c.b, "b");
    Expr y = matmul(a, b);
    const std::string rule =
        fmt::format("{} x {} -> {}", c.a.str(), c.b.str(), y.type().layout.str());
    if (y.type().layout.is_partial())
      y = AllReduce(Sum, y);
    else if (y.type().layout.is_sliced())
      y = AllGather(y);
    p.output(y, "y");
    auto a_at = [](int64_t i) { return static_cast<double>(i % 5) - 2.0; };
    auto b_at = [](int64_t i) { return static_cast<double>(i % 3) * 0.5; };
    // The plain product, batch by batch; a 2-D operand repeats over the batch.
    const int ra = c.sa.rank(), rb = c.sb.rank();
    const int64_t m = c.sa[ra - 2], k = c.sa[ra - 1], n = c.sb[rb - 1];
    const int64_t batches = std::max(c.sa.numel() / (m * k), c.sb.numel() / (k * n));
    std::vector<double> want;
    for (int64_t t = 0; t < batches; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q)
            acc += a_at((ra > 2 ? t * m * k : 0) + i * k + q) *
                   b_at((rb > 2 ? t * k * n : 0) + q * n + j);
          want.push_back(acc);
        }
    for (int ranks : kRanks) {
      const TensorMap out =
          run_on(ranks, p, {{"a", make(F32, c.sa, a_at)}, {"b", make(F32, c.sb, b_at)}});
      EXPECT_TRUE(close(fmt::format("{} on {} ranks", rule, ranks), out.at("y"), want, 0,
                        0));  // small integers and halves: exact in f32
    }
  }
}

// ReduceScatter along each dim (the communicator's own split and the fallback), AllGather back,
// AllReduce with every op, Broadcast from every root, and scatter.
TEST(Collectives, EveryCollectiveOnUnevenShapes) {
  for (const Shape& shape : {Shape{11}, Shape{5, 3}, Shape{4, 6}, Shape{2, 5}}) {
    for (int dim = 0; dim < shape.rank(); ++dim) {
      Program p("rs");
      const Expr x = p.input(
          F32, SymShape(std::vector<Dim>(shape.dims().begin(), shape.dims().end())), Local, "x");
      p.output(AllGather(ReduceScatter(Sum, x, dim)), "sum");
      p.output(AllGather(ReduceScatter(Max, x, dim)), "max");
      p.output(AllReduce(Min, x), "min");
      p.output(AllReduce(Prod, x), "prod");
      for (int ranks : kRanks) {
        // Every rank passes the same Local x here, so sum = ranks x, max = min = x and
        // prod = x^ranks; the next test has values that differ by rank.
        const Tensor whole =
            make(F32, shape, [](int64_t i) { return static_cast<double>(i % 4) - 1.5; });
        const TensorMap out = run_on(ranks, p, {{"x", whole}});
        std::vector<double> sum, same, prod;
        for (double v : values(whole)) {
          sum.push_back(v * ranks);
          same.push_back(v);
          prod.push_back(std::pow(v, ranks));
        }
        const std::string where = fmt::format("{} dim {} on {} ranks", shape.str(), dim, ranks);
        EXPECT_TRUE(close("sum " + where, out.at("sum"), sum, 0, 0));
        EXPECT_TRUE(close("max " + where, out.at("max"), same, 0, 0));
        EXPECT_TRUE(close("min " + where, out.at("min"), same, 0, 0));
        EXPECT_TRUE(close("prod " + where, out.at("prod"), prod, 0, 0));
      }
    }
  }
}

// Local inputs that really differ by rank: each rank passes its own tensor.
TEST(Collectives, LocalValuesDifferingByRank) {
  for (int ranks : kRanks)
    for (int root = 0; root < ranks; ++root) {
      Program p("local");
      const Expr x = p.input(BF16, {5, 3}, Local, "x");
      p.output(AllGather(ReduceScatter(Sum, x, 1)), "rs1");
      p.output(AllReduce(Max, x), "max");
      p.output(Broadcast(x, root), "bcast");
      p.output(AllGather(scatter(Broadcast(x, root), 0)), "scattered");
      p.output(Shift(x), "shifted");
      auto at = [](int r, int64_t i) { return static_cast<double>((i * 3 + r * 5) % 7) - 3.0; };
      std::vector<TensorMap> outs(static_cast<size_t>(ranks));
      comm::run_ranks(ranks, [&](comm::Communicator& c) {
        RunArgs args;
        args.inputs["x"] = make(BF16, Shape{5, 3}, [&](int64_t i) { return at(c.rank(), i); });
        outs[static_cast<size_t>(c.rank())] = exec::run_reference(p, c, args);
      });
      std::vector<double> sum(15, 0), mx(15, -1e30), rootv(15);
      for (int64_t i = 0; i < 15; ++i) {
        for (int r = 0; r < ranks; ++r) {
          sum[static_cast<size_t>(i)] += at(r, i);
          mx[static_cast<size_t>(i)] = std::max(mx[static_cast<size_t>(i)], at(r, i));
        }
        rootv[static_cast<size_t>(i)] = at(root, i);
      }
      for (int r = 0; r < ranks; ++r) {
        const TensorMap& o = outs[static_cast<size_t>(r)];
        const std::string where = fmt::format("rank {} of {}, root {}", r, ranks, root);
        EXPECT_TRUE(close("rs1 " + where, o.at("rs1"), sum, 0, 0));
        EXPECT_TRUE(close("max " + where, o.at("max"), mx, 0, 0));
        EXPECT_TRUE(close("bcast " + where, o.at("bcast"), rootv, 0, 0));
        EXPECT_TRUE(close("scattered " + where, o.at("scattered"), rootv, 0, 0));
        std::vector<double> left(15);  // the previous rank's x
        for (int64_t i = 0; i < 15; ++i)
          left[static_cast<size_t>(i)] = at((r + ranks - 1) % ranks, i);
        EXPECT_TRUE(close("shifted " + where, o.at("shifted"), left, 0, 0));
      }
    }
}

TEST(Update, WritesTheCallersTensorInPlace) {
  Program p("sgd");
  const Expr w = p.input(F32, {"N"}, Sliced(0), "w");
  const Expr g = p.input(F32, {"N"}, Replicated, "g");
  const Expr lr = p.scalar("lr");
  const Expr step = lr * g;
  const Expr w1 = update(w, w - step).named("w1");
  p.output(AllGather(w1), "w_all");
  for (int ranks : kRanks) {
    std::vector<Tensor> pieces(static_cast<size_t>(ranks));
    std::vector<TensorMap> outs(static_cast<size_t>(ranks));
    const Tensor whole_w = make(F32, Shape{10}, [](int64_t i) { return i; });
    const Tensor whole_g = make(F32, Shape{10}, [](int64_t i) { return 2.0 * i; });
    comm::run_ranks(ranks, [&](comm::Communicator& c) {
      Tensor mine = exec::piece_of(whole_w, Sliced(0), c.size(), c.rank());
      pieces[static_cast<size_t>(c.rank())] = mine;
      RunArgs args;
      args.symbols = {{"N", 10}};
      args.scalars = {{"lr", 0.25}};
      args.inputs = {{"w", mine}, {"g", whole_g}};
      outs[static_cast<size_t>(c.rank())] = exec::run_reference(p, c, args);
    });
    std::vector<double> want(10);
    for (int64_t i = 0; i < 10; ++i) want[static_cast<size_t>(i)] = i - 0.5 * i;
    for (int r = 0; r < ranks; ++r) {
      const Tensor& piece = pieces[static_cast<size_t>(r)];
      const int64_t off = part_offset(10, ranks, r);
      EXPECT_TRUE(close(fmt::format("w piece of rank {} of {}", r, ranks), piece,
                        std::vector<double>(want.begin() + off, want.begin() + off + piece.numel()),
                        0, 0));
      EXPECT_TRUE(close("w_all", outs[static_cast<size_t>(r)].at("w_all"), want, 0, 0));
    }
    EXPECT_TRUE(close("g untouched", whole_g,
                      values(make(F32, Shape{10}, [](int64_t i) { return 2.0 * i; })), 0, 0));
  }
}

// Three groups: group 0 sends two values to group 1, which receives them in the opposite order
// from the one they were sent in (a blocking send would deadlock here), sends on to group 2 and
// back to group 0. Sliced values cross groups piece by piece.
TEST(Pipeline, SendRecvBetweenThreeGroups) {
  Program p("chain", 3);
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x", 0);
  const Expr s_a = Send(x * 2, 1).named("s_a");
  const Expr s_b = Send(x + 100, 1).named("s_b");
  const Expr rb = Recv(s_b).named("rb");
  const Expr ra = Recv(s_a).named("ra");
  const Expr t = (ra + rb).named("t");
  const Expr s_c = Send(t, 2).named("s_c");
  const Expr twice = (ra + ra).named("twice");
  const Expr s_back = Send(twice, 0).named("s_back");
  const Expr rc = Recv(s_c).named("rc");
  const Expr z = Recv(s_back).named("z");
  p.output(AllGather(rc - 1), "c");
  p.output(AllGather(z), "z");
  p.output(ra, "ra_piece");
  p.validate();
  for (int per_group : {1, 2}) {
    const int ranks = 3 * per_group;
    std::vector<TensorMap> outs(static_cast<size_t>(ranks));
    comm::run_ranks(ranks, [&](comm::Communicator& c) {
      RunArgs args;
      args.symbols = {{"N", 7}};
      if (c.rank() < per_group)
        args.inputs["x"] = exec::piece_of(make(F32, Shape{7}, [](int64_t i) { return i; }),
                                          Sliced(0), per_group, c.rank());
      outs[static_cast<size_t>(c.rank())] = exec::run_reference(p, c, args);
    });
    std::vector<double> z_want(7), c_want(7);
    for (int64_t i = 0; i < 7; ++i) {
      z_want[static_cast<size_t>(i)] = 4.0 * i;
      c_want[static_cast<size_t>(i)] = 3.0 * i + 99;
    }
    for (int r = 0; r < ranks; ++r) {
      const TensorMap& o = outs[static_cast<size_t>(r)];
      const int group = r / per_group, index = r % per_group;
      const std::string where = fmt::format("rank {} of {} (group {})", r, ranks, group);
      ASSERT_EQ(o.size(), 1u) << where;  // each group holds only its own outputs
      if (group == 0) {
        EXPECT_TRUE(close("z " + where, o.at("z"), z_want, 0, 0));
      } else if (group == 1) {
        const int64_t off = part_offset(7, per_group, index), n = part_count(7, per_group, index);
        std::vector<double> want;
        for (int64_t i = off; i < off + n; ++i) want.push_back(2.0 * i);
        EXPECT_TRUE(close("ra piece " + where, o.at("ra_piece"), want, 0, 0));
      } else {
        EXPECT_TRUE(close("c " + where, o.at("c"), c_want, 0, 0));
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing
