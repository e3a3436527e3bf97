// The Recipe value: its name (CoCoNeT's notation) and the parser that reads a name back.
#include "tandem/schedule/recipe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "tandem/core/abbreviated.h"
#include "tandem/core/error.h"

namespace tandem::schedule {
namespace {

constexpr std::string_view kGrammar =
    "a schedule name is one part per collective joined by '|', each part one of AR-C, AR-fused(C), "
    "fused(AR-C), "
    "RS-AG-C, RS-AG-fused(C), fused(RS-AG)-C, RS-C-AG, RS-fused(C)-AG, fused(RS-C-AG), "
    "RS-C-P2P-AG, "
    "RS-fused(C)-P2P-AG, fused(RS-C)-P2P-AG, optionally overlapped as ol(MM,part), ol(part,P2P), "
    "ol(MM,part,P2P), ol(MM,RS-C-P2P)-AG or with a block count ol[8](...), then optionally "
    "+slice(INPUT,...); "
    "a program without collectives is C or fused(C)";

// The part's core: the collective and its consumers. `c` is "C" or "fused(C)". Without the
// trailing "-AG" when `open_ag` (an overlap that closes before the gather).
std::string core(Move move, bool fuse, const std::string& c, bool open_ag) {
  std::string s;
  switch (move) {
    case Move::None:
      s = fuse ? "fused(AR-C)" : "AR-" + c;
      break;
    case Move::Split:
      s = fuse ? "fused(RS-AG)-C" : "RS-AG-" + c;
      break;
    case Move::Reorder:
      s = fuse ? "fused(RS-C-AG)" : "RS-" + c + "-AG";
      break;
    case Move::ReorderTransfers:
      s = (fuse ? "fused(RS-C)-P2P" : "RS-" + c + "-P2P") + (open_ag ? "" : "-AG");
      break;
  }
  return s;
}

std::string part_str(const CollectiveRecipe& r, bool loops) {
  const std::string c = loops ? "fused(C)" : "C";
  const std::string ol = r.blocks == kDefaultBlocks ? "ol" : fmt::format("ol[{}]", r.blocks);
  const std::string mm = r.overlap_matmul ? "MM," : "";
  if (r.move == Move::ReorderTransfers && r.overlap_send)
    return fmt::format("{}({}{})-AG", ol, mm,
                       core(r.move, r.fuse, c, true));  // the send is in the core
  const std::string k = core(r.move, r.fuse, c, false);
  if (r.overlap_send) return fmt::format("{}({}{},P2P)", ol, mm, k);
  if (r.overlap_matmul) return fmt::format("{}(MM,{})", ol, k);
  return k;
}

// What a core says: its move, whether it fuses, and what it says of loop fusion (nullopt: a part
// fused into its collective, which implies it).
struct Core {
  Move move;
  bool fuse;
  std::optional<bool> loops;
};

std::optional<Core> read_core(std::string_view text, bool open_ag) {
  for (Move m : kMoves)
    for (int v = 0; v < 3; ++v) {  // C, fused(C), fused into the collective
      if (open_ag && m != Move::ReorderTransfers) continue;
      const bool fuse = v == 2;
      if (core(m, fuse, v == 1 ? "fused(C)" : "C", open_ag) == text)
        return Core{m, fuse, fuse ? std::nullopt : std::optional<bool>(v == 1)};
    }
  return std::nullopt;
}

// Names and their parts are shown abbreviated: a name 18 000 overlaps deep is not a message.
[[noreturn]] void bad(std::string_view name, const std::string& what) {
  user_error("schedule '{}': {}; {}", abbreviated(name), what, kGrammar);
}

std::string shown(std::string_view part) { return abbreviated(part, 60); }

struct Part {
  CollectiveRecipe recipe;
  std::optional<bool> loops;
};

Part read_part(std::string_view name, std::string_view text) {
  Part out;
  if (text.empty()) bad(name, "an empty part (two '|' in a row, or one at an end)");
  if (text.substr(0, 2) != "ol") {
    auto c = read_core(text, false);
    if (!c) bad(name, fmt::format("'{}' is not a schedule part", shown(text)));
    out.recipe.move = c->move;
    out.recipe.fuse = c->fuse;
    out.loops = c->loops;
    return out;
  }
  std::string_view rest = text.substr(2);
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    const std::string_view digits = rest.substr(1, close == std::string_view::npos ? 0 : close - 1);
    const bool number = !digits.empty() && digits.size() <= 6 && digits.front() != '0' &&
                        std::all_of(digits.begin(), digits.end(), [](char ch) {
                          return std::isdigit(static_cast<unsigned char>(ch));
                        });
    if (close == std::string_view::npos || !number || std::stoi(std::string(digits)) < 1)
      bad(name,
          fmt::format(
              "in '{}', an overlap's block count is written ol[BLOCKS] with BLOCKS a whole number "
              "from 1 to 999999 without leading zeros",
              shown(text)));
    out.recipe.blocks = std::stoi(std::string(digits));
    if (out.recipe.blocks == kDefaultBlocks)
      bad(name, fmt::format("in '{}', {} blocks is the default: write ol(...) without [{}]",
                            shown(text), kDefaultBlocks, kDefaultBlocks));
    rest = rest.substr(close + 1);
  }
  bool open_ag = false;
  if (rest.size() >= 4 && rest.substr(rest.size() - 4) == ")-AG") {
    open_ag = true;
    rest = rest.substr(0, rest.size() - 3);
  }
  if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')')
    bad(name, fmt::format("'{}' is not an overlap: write ol(...) around a part", shown(text)));
  std::string_view inner = rest.substr(1, rest.size() - 2);
  if (inner.substr(0, 3) == "MM,") {
    out.recipe.overlap_matmul = true;
    inner = inner.substr(3);
  }
  if (!open_ag && inner.size() >= 4 && inner.substr(inner.size() - 4) == ",P2P") {
    out.recipe.overlap_send = true;
    inner = inner.substr(0, inner.size() - 4);
  }
  if (open_ag) out.recipe.overlap_send = true;
  if (!out.recipe.overlapped())
    bad(name, fmt::format("'{}' overlaps nothing: an overlap names MM (the matmul producing the "
                          "collective's input), "
                          "P2P (the send its result reaches), or both",
                          shown(text)));
  auto c = read_core(inner, open_ag);
  if (!c) {
    if (open_ag)
      bad(name,
          fmt::format(
              "in '{}', ol(...)-AG closes the overlap before the gather, so it holds a part that "
              "sends its slices (RS-C-P2P, RS-fused(C)-P2P or fused(RS-C)-P2P), not '{}'",
              shown(text), shown(inner)));
    bad(name, fmt::format("in '{}', '{}' is not a schedule part", shown(text), shown(inner)));
  }
  if (!open_ag && out.recipe.overlap_send && c->move == Move::ReorderTransfers)
    bad(name,
        fmt::format("in '{}', a part that sends its slices overlaps with its send as ol({}{})-AG",
                    shown(text), out.recipe.overlap_matmul ? "MM," : "",
                    core(c->move, c->fuse, c->loops.value_or(false) ? "fused(C)" : "C", true)));
  out.recipe.move = c->move;
  out.recipe.fuse = c->fuse;
  out.loops = c->loops;
  return out;
}

std::vector<std::string> read_slice(std::string_view name, std::string_view text) {
  // text is what follows "+slice(" up to the end of the name
  if (text.empty() || text.back() != ')') bad(name, "'+slice(' must end the name with ')'");
  text.remove_suffix(1);
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string_view input =
        text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    const bool word = !input.empty() && std::all_of(input.begin(), input.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
    });
    if (!word)
      bad(name,
          fmt::format(
              "'+slice({})' must list input names (letters, digits, '_' and '.') separated by ','",
              shown(text)));
    if (std::find(out.begin(), out.end(), input) != out.end())
      bad(name, fmt::format("'+slice({})' lists '{}' twice", shown(text), shown(input)));
    out.emplace_back(input);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::string_view move_name(Move m) {
  switch (m) {
    case Move::None:
      return "none";
    case Move::Split:
      return "split";
    case Move::Reorder:
      return "reorder";
    case Move::ReorderTransfers:
      return "reorder+p2p";
  }
  return "?";
}

bool CollectiveRecipe::operator==(const CollectiveRecipe& o) const {
  return move == o.move && fuse == o.fuse && overlap_matmul == o.overlap_matmul &&
         overlap_send == o.overlap_send && (!overlapped() || blocks == o.blocks);
}

bool Recipe::fused_loops() const {
  return loops || std::any_of(collectives.begin(), collectives.end(),
                              [](const CollectiveRecipe& c) { return c.fuse; });
}

bool Recipe::operator==(const Recipe& o) const {
  return collectives == o.collectives && fused_loops() == o.fused_loops() && slice == o.slice;
}

std::string Recipe::str() const {
  std::string out;
  if (collectives.empty()) {
    out = fused_loops() ? "fused(C)" : "C";
  } else {
    std::vector<std::string> parts;
    for (const CollectiveRecipe& c : collectives) parts.push_back(part_str(c, fused_loops()));
    out = fmt::format("{}", fmt::join(parts, "|"));
  }
  if (!slice.empty()) out += fmt::format("+slice({})", fmt::join(slice, ","));
  return out;
}

Recipe Recipe::parse(std::string_view name) {
  Recipe r;
  std::string_view body = name;
  const size_t plus = name.find('+');
  if (plus != std::string_view::npos) {
    const std::string_view tail = name.substr(plus);
    if (tail.substr(0, 7) != "+slice(")
      bad(name,
          fmt::format("'{}' follows the parts; the only suffix is +slice(INPUT,...)", shown(tail)));
    r.slice = read_slice(name, tail.substr(7));
    body = name.substr(0, plus);
  }
  if (body == "C" || body == "fused(C)") {
    r.loops = body != "C";
    return r;
  }
  if (body.empty()) bad(name, "the name is empty");
  std::vector<Part> parts;
  size_t at = 0;
  while (true) {
    const size_t bar = body.find('|', at);
    parts.push_back(read_part(
        name, body.substr(at, bar == std::string_view::npos ? std::string_view::npos : bar - at)));
    if (bar == std::string_view::npos) break;
    at = bar + 1;
  }
  // Loop fusion is program-wide: the parts that say must agree, and a part fused into its
  // collective implies it.
  const bool loops =
      std::any_of(parts.begin(), parts.end(), [](const Part& p) { return p.loops.value_or(true); });
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].loops == false && loops)
      bad(name, fmt::format("part {} leaves its computations unfused (C) while another part fuses "
                            "loops; loop fusion "
                            "is program-wide, so write {}",
                            i + 1, part_str(parts[i].recipe, true)));
  r.loops = loops;
  for (const Part& p : parts) r.collectives.push_back(p.recipe);
  TANDEM_CHECK(r.str() == name, "schedule '{}' parses to a recipe named '{}'", name, r.str());
  return r;
}

}  // namespace tandem::schedule
