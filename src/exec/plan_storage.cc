// One rank's storage for a lowered plan (see plan_storage.h).
#include "plan_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::exec {

using dsl::Op;
using dsl::Stage;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

PlanStorage::PlanStorage(const schedule::Plan& plan, comm::Communicator& world,
                         const dsl::SymbolMap& symbols, const RunnerOptions& options)
    : plan_(plan),
      groups_(plan.program, world),
      alloc_(comm::buffer_allocator(world,
                                    options.alloc != nullptr ? *options.alloc : host_allocator())),
      shapes_(plan.program.resolve_shapes(symbols)),
      segments_(options.segments) {
  program().check_segments(symbols, segments_);
  const size_t n = program().stages().size();
  roots_.assign(n, -1);
  for (size_t id = 0; id < n; ++id) {
    int r = static_cast<int>(id);
    for (size_t hops = 0; value(r).alias >= 0; ++hops) {
      TANDEM_CHECK(hops <= n, "alias cycle at stage {}", id);
      r = value(r).alias;
    }
    roots_[id] = r;
  }
  for (const std::string& name : options.bound) {
    const int id = schedule::bind_target(plan_, name);
    if (placement().holds(program().stage(id))) unbound_.emplace_back(id, name);
  }
  allocate();
}

Shape PlanStorage::local(int id) const {
  const Placement& pl = placement();
  return dsl::local_shape(shape(id), program().stage(id).type.layout, pl.group_size, pl.index);
}

// A Block value's buffer: this rank's part of every block of its pipeline, one after the other:
// for a row-sliced value, the sum of its part of each block's rows; otherwise every row, as a
// Slice.
Shape PlanStorage::block_shape(int id) const {
  const Shape& g = shape(id);
  const dsl::Layout l = program().stage(id).type.layout;
  if (l.dim != 0 || g.rank() == 0) return local(id);
  const Placement& pl = placement();
  for (const Step& s : plan_.steps) {
    if (s.kind != StepKind::Pipeline) continue;
    const auto& v = s.pipeline.values;
    if (std::find(v.begin(), v.end(), id) == v.end()) continue;
    const int64_t rows = shape(v[0])[0];
    int64_t mine = 0;
    for (int b = 0; b < s.pipeline.blocks; ++b)
      mine += dsl::part_count(dsl::part_count(rows, s.pipeline.blocks, b), pl.group_size, pl.index);
    const int64_t inner = g[0] == 0 ? 0 : g.numel() / g[0];
    return Shape{mine * inner};
  }
  internal_error(fmt::format("block value {} outside every pipeline", program().display_name(id)));
}

void PlanStorage::allocate() {
  const size_t n = program().stages().size();
  buffers_.assign(n, Tensor());
  data_.assign(n, nullptr);
  bytes_.assign(n, 0);
  seeds_.assign(n, 0);
  scalar_set_.assign(n, 0);
  const Placement& pl = placement();
  for (size_t id = 0; id < n; ++id) {
    const int i = static_cast<int>(id);
    const schedule::Value& v = value(i);
    const Stage& st = program().stage(i);
    if (v.alias >= 0 || v.storage == Storage::None || !pl.holds(st)) continue;
    const Shape shape = v.storage == Storage::Block
                            ? block_shape(i)
                            : schedule::stored_shape(plan_, i, shapes_, pl.group_size, pl.index);
    if (std::any_of(unbound_.begin(), unbound_.end(),
                    [&](const auto& u) { return u.first == i; })) {
      buffers_[id] = Tensor::view_of(nullptr, st.type.dtype, shape);  // its shape, until bind()
      continue;
    }
    buffers_[id] = Tensor::zeros(st.type.dtype, shape, alloc_);
    bytes_[id] = buffers_[id].nbytes();
    if (st.op == Op::Const) buffers_[id].fill(static_cast<float>(st.attrs.value));
  }
  for (size_t id = 0; id < n; ++id) data_[id] = buffers_[static_cast<size_t>(roots_[id])].data();
}

Tensor PlanStorage::view(int id) const {
  const int r = root(id);
  const Tensor& b = buffers_[static_cast<size_t>(r)];
  TANDEM_CHECK(b.defined(), "value {} has no buffer on this rank", program().display_name(id));
  const Storage mine = value(id).storage, owner = value(r).storage;
  if (mine == owner) return b.reshape(local(id));
  TANDEM_CHECK(mine == Storage::Slice && owner == Storage::Full, "view of {} in {}",
               program().display_name(id), program().display_name(r));
  // This rank's part of the whole buffer: contiguous when sliced along the leading dims only.
  const int d = program().stage(id).type.layout.dim;
  const Around a = around(shape(id), d);
  TANDEM_CHECK(a.outer == 1, "a slice along dim {} of {} is not contiguous", d, shape(id).str());
  const Placement& pl = placement();
  const int64_t off = dsl::part_offset(a.rows, pl.group_size, pl.index);
  const Shape l = local(id);
  return b.reshape(Shape{b.numel()}).flat_slice(off * a.inner, l.numel()).reshape(l);
}

uint64_t PlanStorage::seed(int id) const {
  const Stage& s = program().stage(id);
  if (s.op == Op::Const) return static_cast<uint64_t>(s.attrs.value);
  return seeds_[static_cast<size_t>(id)];
}

// ------------------------------------------------------------------------------- interface

int PlanStorage::find_named(std::string_view name, Op op, const char* what) const {
  for (const Stage& s : program().stages())
    if (s.name == name && (op == Op::Const || s.op == op)) return s.id;
  user_error("plan '{}': program '{}' has no {} named '{}'", plan_.name, program().name(), what,
             name);
}

// Output `name`'s value, else the stage of that name.
int PlanStorage::output_or_value(std::string_view name) const {
  for (const dsl::Output& o : program().outputs())
    if (o.name == name) return o.stage;
  return find_named(name, Op::Const, "value");
}

void PlanStorage::check_mine(int id, std::string_view name) const {
  if (!placement().holds(program().stage(id)))
    user_error("plan '{}': '{}' belongs to group {}, and this rank is in group {}", plan_.name,
               name, program().stage(id).type.group, placement().group);
}

Tensor PlanStorage::input(std::string_view name) const {
  const int id = find_named(name, Op::Input, "input");
  check_mine(id, name);
  return view(id);
}

void PlanStorage::load(std::string_view name, const Tensor& value) {
  const int id = find_named(name, Op::Input, "input");
  check_mine(id, name);
  const Tensor dst = view(id);
  const Stage& s = program().stage(id);
  if (value.dtype() != dst.dtype())
    user_error("plan '{}': input '{}' is {}, given {}", plan_.name, name, dtype_name(dst.dtype()),
               value.str());
  if (value.shape() == dst.shape()) {
    if (value.nbytes() > 0) std::memcpy(dst.data(), value.data(), value.nbytes());
    return;
  }
  if (s.type.layout.is_sliced() && value.shape() == shape(id)) {
    const Tensor part = piece_of(value, s.type.layout, placement().group_size, placement().index);
    if (part.nbytes() > 0) std::memcpy(dst.data(), part.data(), part.nbytes());
    return;
  }
  user_error("plan '{}': input '{}' is stored as {} on this rank (global {} {}); given {}",
             plan_.name, name, dst.str(), shape(id).str(), s.type.layout.str(), value.str());
}

// The input's (or output's) buffer becomes the caller's memory, for every value that lives in it.
void PlanStorage::bind(std::string_view name, const Tensor& memory) {
  const int id = schedule::bind_target(plan_, name);
  check_mine(id, name);
  const size_t i = static_cast<size_t>(id);
  const Storage st = value(id).storage;
  TANDEM_CHECK(root(id) == id && (st == Storage::Full || st == Storage::Slice),
               "plan '{}': '{}' owns no buffer of its own", plan_.name, name);
  const Tensor& stored = buffers_[i];
  buffers_[i] = checked_binding(program().name(), name, stored.shape(), stored.dtype(), memory);
  for (size_t k = 0; k < roots_.size(); ++k)
    if (roots_[k] == id) data_[k] = buffers_[i].data();
  std::erase_if(unbound_, [&](const auto& u) { return u.first == id; });
}

void PlanStorage::set_scalar(std::string_view name, double value) {
  const int id = find_named(name, Op::Scalar, "scalar");
  const size_t i = static_cast<size_t>(id);
  const bool integral = value >= 0.0 && value < 9007199254740992.0 && std::floor(value) == value;
  if (keys_dropout(program(), id))
    seeds_[i] = dropout_seed(fmt::format("plan '{}'", plan_.name), name, value);
  else
    seeds_[i] = integral ? static_cast<uint64_t>(value) : 0;
  scalar_set_[i] = 1;
  if (data_[i] != nullptr)
    store_from_f32(data_[i], program().stage(id).type.dtype, 0, static_cast<float>(value));
}

Tensor PlanStorage::output(std::string_view name) const {
  for (const dsl::Output& o : program().outputs())
    if (o.name == name) {
      check_mine(o.stage, name);
      return view(o.stage);
    }
  user_error("plan '{}': program '{}' has no output '{}'", plan_.name, program().name(), name);
}

Piece PlanStorage::piece(std::string_view name) const {
  const int id = output_or_value(name);
  const Stage& s = program().stage(id);
  const Shape& g = shape(id);
  Piece pc;
  if (s.type.layout.is_sliced() && value(id).storage == Storage::Slice) {
    pc.dim = s.type.layout.dim;
    pc.offset = dsl::part_offset(g[pc.dim], placement().group_size, placement().index);
    pc.count = dsl::part_count(g[pc.dim], placement().group_size, placement().index);
  } else {
    pc.count = g.rank() > 0 ? g[0] : 1;
  }
  return pc;
}

size_t PlanStorage::allocated_bytes(std::string_view name) const {
  return bytes_[static_cast<size_t>(output_or_value(name))];
}

void PlanStorage::check_ready() const {
  if (!unbound_.empty())
    user_error("plan '{}': '{}' is to be bound, and is not; call bind first", plan_.name,
               unbound_.front().second);
  for (int id : program().scalars())
    if (placement().holds(program().stage(id)) && !scalar_set_[static_cast<size_t>(id)])
      user_error("plan '{}': scalar '{}' is not bound; call set_scalar first", plan_.name,
                 program().display_name(id));
}

}  // namespace tandem::exec
