// Builds the message of an internal error: where it happened and what to do about it.
#include "tandem/core/error.h"

namespace tandem {

void internal_error(const std::string& what, std::source_location where) {
  throw InternalError(
      fmt::format("tandem internal error at {}:{}: {} (this is a bug in tandem; "
                  "please report it with the command that triggered it)",
                  where.file_name(), where.line(), what));
}

}  // namespace tandem
