// Shape: the extents of a contiguous row-major tensor.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tandem {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_.at(static_cast<size_t>(i)); }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const;
  std::string str() const;  // "[4, 1024]"; "[]" for a scalar

  bool operator==(const Shape&) const = default;

 private:
  std::vector<int64_t> dims_;
};

}  // namespace tandem
