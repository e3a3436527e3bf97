// The plan walker both source emitters are built on (codegen/cpp for the CPU JIT, codegen/cuda for
// GPUs): it walks a lowered plan's steps and prints every step whose text is the same on both
// targets (collectives, transfers, pipelines, the entry points, a matmul's GEMM), and leaves to
// the target the few it prints its own way (a loop, a reduction over a dim, an accumulator's
// finish, the conversions around a GEMM, copies). It also gives the targets what those need: how
// a loop reaches each value (Access, LoopIO), the element statements of a loop, and geometry.
// Private to src/codegen.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/codegen/abi.h"
#include "tandem/core/dtype.h"
#include "tandem/dsl/ir.h"
#include "tandem/schedule/plan.h"

namespace tandem::codegen::detail {

// ------------------------------------------------------------------------------ small pieces

std::string dt_suffix(DType t);  // "f32", "bf16", "f16"
std::string ctype(DType t);      // the C type a buffer of t holds: float or uint16_t
int dtype_code(DType t);         // the ABI's dtype code: 0 f32, 1 bf16, 2 f16
// An exact f32 literal: hexadecimal for finite values, bits otherwise.
std::string flit(float v);
// The product of xs[from, to) as C (int64_t{1} when empty).
std::string product(const std::vector<std::string>& xs, size_t from, size_t to);
// An access's index (a C expression of the name `g`) at another global index.
std::string at_index(const std::string& index, const std::string& g);
std::string identity_literal(dsl::ReduceOp op);  // the f32 start of a fold, as C
std::string combine_fn(dsl::ReduceOp op);        // the formula that folds one more value

inline constexpr int kAccSlots = TANDEM_ACC_SLOTS;  // doubles per stage in tandem_args::acc

// ------------------------------------------------------------------------------ loops

// How a loop reaches one value in memory: through which buffer and which map from the element's
// global flat index g to the buffer's index.
struct Access {
  enum Kind { Full, Bcast, Part, Chunk } kind = Full;
  int root = -1;  // the owning value (its buffer); -1 for Chunk
  DType dtype = DType::F32;
  std::string index;    // the buffer index of global flat index `g`, as C
  std::string key;      // equal keys: the same pointer
  int part_dim = -1;    // Part: the dim whose rows the buffer holds a range of
  int bcast_rank = 0;   // Bcast: the operand's rank
  std::string modulus;  // Bcast: its element count; Part (dim > 0): the dim's span
  bool read = false, write = false;
};

// What a loop is emitted inside of.
struct LoopCtx {
  const schedule::Loop* loop = nullptr;
  int rank = 0;
  std::vector<std::string> extents;  // the loop shape's dims, as C
  bool chunk = false;                // a hook of a collective
  int coll_stage = -1;               // Chunk: the collective's value (the chunk itself)
  int carry = -1;                    // Chunk: the value written over the chunk
  bool in_pipe = false;
};

// What a loop reads and writes, for every target: its pointer parameters (one per buffer map),
// the rank-0 values it reads from memory, its dropout seeds, and its stores.
struct LoopIO {
  std::set<int> regs;          // the loop's stages (values in registers)
  std::vector<Access> params;  // pointer parameters, deduplicated by key
  std::vector<int> scalars;    // rank-0 operands read from memory, by stage id
  // The factors of segment_scale stages (f32[S]), read at the run's segment: the driver cuts the
  // runs at segment bounds, so each is one value per run, passed like a scalar.
  std::vector<int> segment_scalars;
  std::map<int, std::string> seeds;  // dropout stage -> its seed expression
  std::vector<int> seed_params;      // Scalar stages passed as seeds
  std::map<int, size_t> reads;       // operand stage -> param
  std::map<int, size_t> writes;      // stored stage -> param
  std::vector<int> stores;           // the loop's stores (and a hook's carried value)
};

// The box a loop that is not a hook covers (rank > 0), per dim as C: whole dims, but this rank's
// part of the sliced dim and the block's rows in a pipeline.
struct LoopBox {
  std::vector<std::string> lo, cnt;
  std::vector<bool> whole;
};

// How one element of a loop is written: `in` indents each statement; slot(i) is the element of
// pointer parameter i (read and written); fold(id, x) folds x into accumulator `id`.
struct ElementForm {
  std::string in;
  std::function<std::string(size_t)> slot;
  std::function<std::string(int, const std::string&)> fold;
};

// ------------------------------------------------------------------------------ other steps

// The element count and collective geometry of a value, whole or (in a pipeline) one block.
struct Geometry {
  std::string numel, outer, rows, inner, first;  // first: the global flat index of element 0
};

// One matrix operand (or the result) of a matmul, as the rows x cols sub-matrix of its buffer.
struct Matrix {
  int v = -1;
  DType dtype = DType::F32;
  std::string base;   // C: pointer to element (batch 0, row lo, col lo)
  std::string ld;     // C
  std::string batch;  // C: elements between batches (0 when not batched)
};

// A matmul's three matrices and extents on this rank (a block's rows in a pipeline).
struct MatmulDims {
  Matrix A, B, C;
  std::string mn, kn, nn;  // C: this rank's m, k, n
  int qa = 0, qb = 0, qc = 0;
  std::vector<std::string> ec;  // C's dims
};

class Walker {
 public:
  explicit Walker(const schedule::Plan& plan);
  virtual ~Walker() = default;

  // The plan's functions: one per step, tandem_step_<k>, tandem_run, tandem_scratch_elems and
  // tandem_abi_version (after the target's prefix, which defines what they call).
  std::string emit_body();

 protected:
  // ---------------------------------------------------------------------------- the target

  // "cpp" or "cuda" (in messages: "codegen/cpp"), and the emitter's name ("C++", "CUDA").
  virtual std::string target_name() const = 0;
  virtual std::string target_title() const = 0;
  // A loop's functions; returns the name of the one the step calls: `int name(const
  // tandem_args*, const tandem_block*)`, or a tandem_hook_fn for a hook (ctx.chunk).
  virtual std::string emit_loop(const LoopCtx& ctx) = 0;
  // Statements leaving the partial folds of a reduction over dim `rows` of x (of dtype xd, in
  // buffer `x_root`, as [outer, rows, inner]) in a->scratch, one per (outer, inner); fn names
  // any function they need.
  virtual std::string fold_rows_text(const std::string& fn, int x_root, DType xd,
                                     dsl::ReduceOp op) = 0;
  // Statements of finish step fn leaving accumulator id's f32 value (its lanes added, or its
  // value) where the returned pointer expression points (for the all-reduce and the store).
  virtual std::pair<std::string, std::string> finish_lanes_text(const std::string& fn, int id) = 0;
  // Statements storing `count` f32 values at src (their square roots if take_sqrt) into buffer
  // `root` of dtype dt.
  virtual std::string store_text(int root, DType dt, const std::string& src,
                                 const std::string& count, bool take_sqrt) = 0;
  // In a matmul's batch loop: operand `tag` (a or b) widened from its 16-bit buffer (`src`, leading
  // dimension ld) into the packed f32 matrix p<tag> of rows x cols; C's rows x cols set to 0 (pc,
  // leading dimension ldc); and pc narrowed into C's 16-bit buffer at dst (leading dimension ld).
  virtual std::string widen_text(const std::string& tag, const std::string& src, DType dt,
                                 const std::string& rows, const std::string& cols,
                                 const std::string& ld) = 0;
  virtual std::string zero_text() = 0;
  virtual std::string narrow_text(const std::string& dst, DType dt, const std::string& ld) = 0;
  // The last statement of step function fn (after its work is issued).
  virtual std::string return_text(const std::string& fn) = 0;
  // Statements copying `elems` elements of `size` bytes from src to dst (C pointer expressions).
  virtual std::string copy_text(const std::string& elems, const std::string& dst,
                                const std::string& src, size_t size) const = 0;
  // Statements starting accumulator `id` from its op's identity (a sum: its 8 lanes at 0).
  virtual std::string acc_init_text(int id) const = 0;
  // A segment norm (reduce step); only the C++ target has one.
  virtual std::string emit_segment_norm(const schedule::Step& s);

  // ---------------------------------------------------------------------------- the plan

  [[noreturn]] void unsupported(const std::string& what) const;
  const dsl::Stage& st(int id) const { return p_.stage(id); }
  const schedule::Value& val(int id) const { return plan_.values.at(static_cast<size_t>(id)); }
  std::string name(int id) const { return p_.display_name(id); }
  // The value owning the buffer `id` lives in.
  int root(int id) const;
  // Scatter stages that were never materialised are views of their operand.
  int look_through(int id) const;
  dsl::ReduceOp acc_op(int id) const;
  std::string dim(const dsl::Dim& d) const;
  std::vector<std::string> dims(const dsl::SymShape& s) const;
  std::vector<std::string> dims(int id) const { return dims(st(id).type.shape); }
  // The statements every function starts with: P, RK and the symbols' extents S<i>.
  std::string prologue() const;
  // `static int fn(const tandem_args* a, const tandem_block* blk) {` and a new line.
  static std::string function_head(const std::string& fn);
  std::string fresh(const std::string& prefix) { return prefix + std::to_string(counter_++); }
  std::string base_ptr(int root_id) const;
  // Statements all-reducing `count` f32 values at `send` across the group, in place.
  std::string allreduce_text(const std::string& send, const std::string& count,
                             dsl::ReduceOp op) const;

  // ---------------------------------------------------------------------------- loops

  // The access to value `v` (same rank as the loop, or a broadcast suffix) from a loop.
  Access access(int v, const LoopCtx& ctx);
  // A pointer to global flat element `g` of value v's buffer, for whole-buffer calls
  // (collectives, transfers, copies): as C, typed `T*`.
  std::string pointer_at(int v, const std::string& g, bool in_pipe);
  LoopCtx loop_ctx(const schedule::Loop& loop, bool in_pipe) const;
  LoopIO loop_io(const LoopCtx& ctx);
  LoopBox loop_box(const LoopCtx& ctx) const;
  // A buffer holding only this rank's part of a dim can serve a loop only over that part.
  void check_parts(const LoopCtx& ctx, const LoopIO& io, const std::vector<bool>& whole) const;
  // The f32 expression of elementwise stage s, from its operands' expressions.
  std::string formula(const dsl::Stage& s, const std::vector<std::string>& x, const LoopCtx& ctx,
                      const std::map<int, std::string>& seeds);
  // The expression of value `id` inside the loop's element: a register, a constant, a load (m<i>)
  // or a scalar (s<id>).
  std::string value_of(const LoopIO& io, int id) const;
  // One element of the loop: its loads, its stages (each rounded to its dtype), its folds, its
  // stores.
  std::string element_text(const LoopCtx& ctx, const LoopIO& io, const ElementForm& form);

  // ---------------------------------------------------------------------------- steps

  std::vector<int> accumulated_in(const schedule::Step& s) const;
  std::string emit_top_step(const schedule::Step& s);
  // Emits the function of one step; returns its name. Inside a pipeline the function takes the
  // block; a Pipeline's function takes only the args.
  std::string emit_step(const schedule::Step& s, bool in_pipe, const schedule::Pipeline* pipe);
  Geometry geometry(int v, bool in_pipe, const schedule::Collective* c);
  std::string emit_collective(const schedule::Step& s, bool in_pipe);
  std::string emit_transfer(const schedule::Step& s, bool in_pipe, const schedule::Pipeline* pipe);
  // This rank's stored piece of value v, as one contiguous span: (pointer, element count) in C.
  // In a pipeline: the block's rows (a Full value) or the block's part (a Block value).
  std::pair<std::string, std::string> stored_piece(int v, bool in_pipe);
  // The number of blocks the send of `send_stage` goes out in (1 outside a pipeline).
  int sender_blocks(int send_stage) const;
  // The stored piece of value v as C: its dims (local extents), where index = local flat.
  std::vector<std::string> local_dims(int v);
  std::string emit_reduce(const schedule::Step& s, bool in_pipe);
  std::string emit_finish(const schedule::Step& s, bool in_pipe);
  // Sub-matrix of value v (rank q >= 2) with rows from rlo and cols from clo, in global
  // coordinates.
  Matrix matrix(int v, const std::string& rlo, const std::string& clo, bool in_pipe);
  MatmulDims matmul_dims(const schedule::Step& s, bool in_pipe);
  std::string emit_matmul(const schedule::Step& s, bool in_pipe);
  // The buffers a step reads and writes (by root), for the pipeline's dependencies.
  void footprint(const schedule::Step& s, std::set<int>& reads, std::set<int>& writes);
  std::string emit_pipeline(const schedule::Step& s);

  const schedule::Plan& plan_;
  const dsl::Program& p_;
  std::map<std::string, int> sym_index_;
  std::string fns_;                   // the functions emitted so far
  std::vector<std::string> scratch_;  // statements raising `need` to each step's scratch
  std::string scratch_block_prefix_;  // in a pipeline: the first block, for those statements
  std::set<int> acc_started_;
  std::set<int> worded_;  // the loop being emitted: dropouts whose words are drawn per tile
  std::string elem_index_ =
      "(g0 + t)";  // the global flat index of the element being computed, as C
  // Whether a pipeline issues block b + 1's steps up to its first wait before block b's rest (the
  // CUDA target: its compute stream would otherwise queue b + 1's GEMM behind b's wait).
  bool skew_pipelines_ = false;
  int counter_ = 0;
  int step_ = -1;
};

}  // namespace tandem::codegen::detail
