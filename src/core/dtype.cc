// Names of element types, for printing and for parsing flags.
#include "tandem/core/dtype.h"

#include "tandem/core/error.h"

namespace tandem {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  user_error("unknown dtype '{}': expected one of f32, bf16, f16", name);
}

}  // namespace tandem
