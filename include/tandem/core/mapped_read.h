// Reads from a file mapping whose file may shrink under the process (another program truncates
// it): the read that would raise SIGBUS returns false instead of killing the process.
#pragma once

#include <cstddef>

namespace tandem {

// Runs `read(context)`, which reads only the bytes [begin, begin + bytes) of a file mapping; true
// when it ran to its end, false when a read in that range found no file behind it (SIGBUS: the
// file was truncated after it was mapped). A SIGBUS elsewhere, or on another thread outside its
// own guarded read, takes the action it had before. `read` must not allocate or hold locks (it
// may be cut short at any byte): a loop that copies is what it is for.
bool guarded_mapped_read(const void* begin, size_t bytes, void (*read)(void*), void* context);

}  // namespace tandem
