// The rewriter and graph queries the schedule passes share.
#include "rewrite.h"

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::schedule::detail {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

Rewriter::Rewriter(const Program& in)
    : in_(in), out_(in.name(), in.groups()), map_(in.stages().size(), -1) {}

std::string Rewriter::fresh(std::string name) const {
  if (name.empty() || !out_.find(name)) return name;
  for (int i = 2;; ++i) {
    std::string candidate = fmt::format("{}.{}", name, i);
    if (!out_.find(candidate)) return candidate;
  }
}

int Rewriter::add(Op op, std::vector<int> args, dsl::Attrs attrs, std::string name) {
  return out_.add(op, std::move(args), std::move(attrs), fresh(std::move(name)));
}

int Rewriter::copy(const Stage& s) {
  std::vector<int> args;
  args.reserve(s.args.size());
  for (int a : s.args) args.push_back(get(a));
  return copy_with(s, std::move(args));
}

int Rewriter::copy_with(const Stage& s, std::vector<int> args) {
  const int id = add(s.op, std::move(args), s.attrs, s.name);
  return id;
}

int Rewriter::get(int old_id) const {
  TANDEM_CHECK(old_id >= 0 && old_id < static_cast<int>(map_.size()) &&
                   map_[static_cast<size_t>(old_id)] >= 0,
               "stage {} of '{}' has no counterpart in the rewrite", in_.display_name(old_id),
               in_.name());
  return map_[static_cast<size_t>(old_id)];
}

std::pair<Program, std::vector<int>> Rewriter::finish() { return finish({}); }

std::pair<Program, std::vector<int>> Rewriter::finish(const std::vector<int>& override_stage) {
  for (size_t i = 0; i < in_.outputs().size(); ++i) {
    const dsl::Output& o = in_.outputs()[i];
    const int target =
        i < override_stage.size() && override_stage[i] >= 0 ? override_stage[i] : get(o.stage);
    out_.add_output(target, o.name);
  }
  out_.validate();
  return {std::move(out_), std::move(map_)};
}

std::vector<char> descendants(const Program& p, int from) {
  std::vector<char> d(p.stages().size(), 0);
  for (const Stage& s : p.stages()) {
    if (s.id <= from) continue;
    for (int a : s.args)
      if (a == from || d[static_cast<size_t>(a)]) {
        d[static_cast<size_t>(s.id)] = 1;
        break;
      }
  }
  return d;
}

std::vector<char> ancestors(const Program& p, const std::vector<int>& of) {
  std::vector<char> a(p.stages().size(), 0);
  for (int id : of) a[static_cast<size_t>(id)] = 1;
  for (int id = static_cast<int>(p.stages().size()) - 1; id >= 0; --id)
    if (a[static_cast<size_t>(id)])
      for (int arg : p.stage(id).args) a[static_cast<size_t>(arg)] = 1;
  return a;
}

std::vector<std::vector<int>> all_users(const Program& p) {
  std::vector<std::vector<int>> u(p.stages().size());
  for (const Stage& s : p.stages())
    for (int a : s.args) {
      auto& list = u[static_cast<size_t>(a)];
      if (list.empty() || list.back() != s.id) list.push_back(s.id);
    }
  return u;
}

std::vector<char> live_stages(const Program& p) {
  std::vector<int> roots;
  for (const dsl::Output& o : p.outputs()) roots.push_back(o.stage);
  for (const Stage& s : p.stages())
    if (s.op == Op::Update || s.op == Op::Send || s.op == Op::Recv || s.op == Op::Input ||
        s.op == Op::Scalar)
      roots.push_back(s.id);
  return ancestors(p, roots);
}

std::pair<Program, std::vector<int>> remove_dead(const Program& p) {
  const std::vector<char> live = live_stages(p);
  Rewriter rw(p);
  for (const Stage& s : p.stages())
    if (live[static_cast<size_t>(s.id)]) rw.set(s.id, rw.copy(s));
  return rw.finish();
}

bool is_elementwise_tensor(const Stage& s) {
  return (dsl::op_kind(s.op) == OpKind::Elementwise || s.op == Op::Update) &&
         s.type.shape.rank() > 0;
}

bool is_scalar_code(const Stage& s) {
  return dsl::op_kind(s.op) == OpKind::Elementwise && s.type.shape.rank() == 0;
}

bool is_accumulator(const Stage& s) {
  return s.op == Op::Norm || (s.op == Op::Reduce && s.attrs.dim == dsl::kAllDims);
}

std::string name_list(const Program& p, const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += i + 1 == ids.size() ? " and " : ", ";
    out += p.display_name(ids[i]);
  }
  return out;
}

}  // namespace tandem::schedule::detail
