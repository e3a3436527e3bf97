// The ranks' agreement vocabulary over any communicator: strings carried in 16-bit tensors
// (collectives move whole elements) with their lengths first in f32 (exact below 2^24).
#include "tandem/comm/agree.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::comm {
namespace {

constexpr size_t kMaxBytes = size_t{1} << 24;
constexpr int kGatherTag = 30001;

Tensor text_tensor(const std::string& s, size_t bytes) {
  Tensor t = Tensor::zeros(DType::BF16, Shape{static_cast<int64_t>((bytes + 1) / 2)});
  std::memcpy(t.data(), s.data(), std::min(s.size(), bytes));
  return t;
}

void check_length(size_t n) {
  TANDEM_CHECK(n < kMaxBytes, "a string of {} bytes is too long to exchange between ranks", n);
}

float all_reduce_one(Communicator& comm, float v, ReduceOp op) {
  comm.all_reduce(Tensor::view_of(&v, DType::F32, Shape{1}), op);
  return v;
}

}  // namespace

std::string broadcast_string(Communicator& comm, const std::string& s) {
  if (comm.size() == 1) return s;
  if (comm.rank() == 0) check_length(s.size());
  float len = comm.rank() == 0 ? static_cast<float>(s.size()) : 0.0f;
  comm.broadcast(Tensor::view_of(&len, DType::F32, Shape{1}), 0);
  const size_t n = static_cast<size_t>(len);
  if (n == 0) return {};
  Tensor buf = text_tensor(comm.rank() == 0 ? s : std::string(), n);
  comm.broadcast(buf, 0);
  return std::string(static_cast<const char*>(buf.data()), n);
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  if (n == 1) return {mine};
  check_length(mine.size());
  float my_len = static_cast<float>(mine.size());
  std::vector<float> lens(static_cast<size_t>(n));
  comm.all_gather(Tensor::view_of(&my_len, DType::F32, Shape{1}),
                  Tensor::view_of(lens.data(), DType::F32, Shape{n}));
  const size_t longest = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
  const int64_t elems = static_cast<int64_t>((longest + 1) / 2);
  if (elems == 0) return std::vector<std::string>(static_cast<size_t>(n));
  Tensor all = Tensor::zeros(DType::BF16, Shape{elems * n});
  comm.all_gather(text_tensor(mine, longest), all);
  std::vector<std::string> out;
  const char* base = static_cast<const char*>(all.data());
  for (int r = 0; r < n; ++r)
    out.emplace_back(base + static_cast<size_t>(r) * elems * 2,
                     static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

// Point to point, so that rank 0 holds one string at a time beside its own, however long the
// others' are.
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine) {
  if (comm.rank() != 0) {
    check_length(mine.size());
    float len = static_cast<float>(mine.size());
    comm.send(Tensor::view_of(&len, DType::F32, Shape{1}), 0, kGatherTag);
    if (!mine.empty()) comm.send(text_tensor(mine, mine.size()), 0, kGatherTag);
    return {};
  }
  std::vector<std::string> out = {mine};
  for (int r = 1; r < comm.size(); ++r) {
    float len = 0;
    comm.recv(Tensor::view_of(&len, DType::F32, Shape{1}), r, kGatherTag);
    const size_t n = static_cast<size_t>(len);
    if (n == 0) {
      out.emplace_back();
      continue;
    }
    Tensor buf = text_tensor({}, n);
    comm.recv(buf, r, kGatherTag);
    out.emplace_back(static_cast<const char*>(buf.data()), n);
  }
  return out;
}

bool all_true(Communicator& comm, bool mine) {
  return all_reduce_one(comm, mine ? 1.0f : 0.0f, ReduceOp::Min) > 0.5f;
}

int all_min(Communicator& comm, int mine) {
  return static_cast<int>(all_reduce_one(comm, static_cast<float>(mine), ReduceOp::Min));
}

int all_max(Communicator& comm, int mine) {
  return static_cast<int>(all_reduce_one(comm, static_cast<float>(mine), ReduceOp::Max));
}

std::string decide_on_root(Communicator& comm, const std::function<std::string()>& decide) {
  std::string text;
  if (comm.rank() == 0) {
    try {
      text = "ok\n" + decide();
    } catch (const UserError& e) {
      if (comm.size() == 1) throw;
      text = std::string("error\n") + e.what();
    }
  }
  text = broadcast_string(comm, text);
  const size_t line = text.find('\n');
  if (text.substr(0, line) != "ok") throw CollectiveError(text.substr(line + 1));
  return text.substr(line + 1);
}

}  // namespace tandem::comm
