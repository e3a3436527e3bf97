// The prefix every emitted C++ translation unit starts with: the host ABI, core/formulas.h's text
// (the element formulas the interpreter is compiled from) and the CPU helpers of runtime/cpu.h
// that keep the emitted loops vectorisable.
#include <string>

#include "runtime_text.h"
#include "tandem/codegen/abi.h"
#include "tandem/codegen/cpp.h"
#include "tandem/codegen/formulas_text.h"

namespace tandem::codegen {
namespace {

// The ABI macro stringifies to one line; break it after each ';', '{' and '}' for readers.
std::string reflow(const std::string& line) {
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '}') --depth;
    if (c == ' ' && !out.empty() && out.back() == '\n') continue;
    if (!out.empty() && out.back() == '\n') out.append(static_cast<size_t>(2 * depth), ' ');
    out += c;
    if (c == '{') ++depth;
    // '}' is followed by a typedef's name; break after the ';' that ends it instead.
    if (c == ';' || c == '{') out += '\n';
  }
  return out;
}

}  // namespace

std::string abi_declarations() { return reflow(TANDEM_KERNEL_ABI_TEXT); }

const std::string& cpp_prefix() {
  static const std::string text =
      std::string(
          "// Emitted by tandem codegen/cpp. Prefix: the host ABI, tandem's exact element "
          "formulas (core/formulas.h) and the CPU helpers.\n"
          "#include <cmath>\n#include <cstdint>\n#include <cstring>\n\n"
          "extern \"C\" {\n") +
      abi_declarations() + "}\n\n// ---- core/formulas.h\n" + std::string(formulas_text()) +
      "\n// ---- codegen/runtime/cpu.h\n" + std::string(cpu_text());
  return text;
}

}  // namespace tandem::codegen
