// How the ranks of a group come to one decision: the one vocabulary every choice a run makes
// together goes through (a flag's `auto`, a stop, the settings the ranks compare). Each call is a
// collective: every rank of `comm` calls it, in the same order.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::comm {

// Rank 0's string on every rank of `comm` (a schedule's name, a tuning record). The bytes travel
// in a 16-bit tensor (collectives move whole elements), the length first in an f32, so strings
// must be shorter than 2^24 bytes.
std::string broadcast_string(Communicator& comm, const std::string& s);

// Every rank's string, in rank order.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

// Every rank's string on rank 0, in rank order; the other ranks get an empty vector.
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine);

// Whether `mine` is true on every rank.
bool all_true(Communicator& comm, bool mine);

// The least and the largest of the ranks' values (exact for |v| < 2^24).
int all_min(Communicator& comm, int mine);
int all_max(Communicator& comm, int mine);

// Rank 0 decides, every rank takes its decision: `decide` runs on rank 0 alone and its result
// travels as text. A UserError it throws stops every rank with rank 0's message (a
// CollectiveError: rank 0 alone reports it). For a choice that needs measuring, or that ranks
// measuring on their own could make differently.
std::string decide_on_root(Communicator& comm, const std::function<std::string()>& decide);

}  // namespace tandem::comm
