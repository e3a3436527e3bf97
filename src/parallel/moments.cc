// The optimizer's moments in memory (see moments.h).
#include "moments.h"

#include <cstring>

#include "tandem/core/tensor.h"

namespace tandem::parallel::detail {
namespace {

class MemoryMoments final : public Moments {
 public:
  explicit MemoryMoments(const std::vector<int64_t>& lengths) {
    for (const int64_t n : lengths) {
      m_.push_back(Tensor::zeros(DType::F32, Shape{n}));
      v_.push_back(Tensor::zeros(DType::F32, Shape{n}));
    }
  }

  View begin_update(size_t i) override {
    return {m_.at(i).data_as<float>(), v_.at(i).data_as<float>()};
  }
  void read(size_t i, float* m, float* v) override {
    std::memcpy(m, m_.at(i).data(), m_[i].nbytes());
    std::memcpy(v, v_.at(i).data(), v_[i].nbytes());
  }
  void write(size_t i, const float* m, const float* v) override {
    std::memcpy(m_.at(i).data(), m, m_[i].nbytes());
    std::memcpy(v_.at(i).data(), v, v_[i].nbytes());
  }
  uint64_t memory_bytes() const override {
    uint64_t b = 0;
    for (size_t i = 0; i < m_.size(); ++i) b += m_[i].nbytes() + v_[i].nbytes();
    return b;
  }

 private:
  std::vector<Tensor> m_, v_;
};

}  // namespace

std::unique_ptr<Moments> memory_moments(const std::vector<int64_t>& lengths) {
  return std::make_unique<MemoryMoments>(lengths);
}

}  // namespace tandem::parallel::detail
