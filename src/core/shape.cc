// Shape construction (negative extents are a user error) and printing.
#include "tandem/core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/core/error.h"

namespace tandem {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (int64_t d : dims_)
    if (d < 0)
      user_error("shape {} has a negative extent", fmt::format("[{}]", fmt::join(dims_, ", ")));
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(dims_, ", ")); }

}  // namespace tandem
