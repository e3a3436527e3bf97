// tandem's cache folder (compiled kernels, the autotuner's records, out-of-core profiles) and the
// rules every file in it follows. A shared object found there is loaded and run, so the folder is
// private to the user running tandem: never a shared folder such as /tmp; folders are created 0700
// and files 0600 whatever the umask; a folder or file that another user owns, or that group or
// others can write, is refused with a UserError naming it; files are written under a temporary
// name drawn at random and created exclusively in their own folder, then renamed into place, so no
// link planted at a predictable path is ever followed.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// $TANDEM_CACHE_DIR, else $HOME/.cache/tandem, else <the home folder the password database gives
// this user>/.cache/tandem; without any, a UserError naming TANDEM_CACHE_DIR.
std::string default_cache_dir();

// Creates <root>/<sub> (and any missing folder above it, each 0700), then checks root and
// root/sub are private: folders owned by this user that group and others cannot write.
std::filesystem::path make_private_dir(const std::string& root, const std::string& sub);

// Whether <root>/<sub> exists (nothing to read when not); the folders that exist are checked as
// make_private_dir checks them.
bool private_dir_exists(const std::string& root, const std::string& sub);

// Checks an open file: a regular file owned by this user that group and others cannot write;
// else a UserError naming `path`.
void check_private_file(int fd, const std::string& path);

// The contents of `path`, opened without following a symbolic link and checked as above; nullopt
// when it does not exist.
std::optional<std::string> read_private_file(const std::string& path);

// Writes `contents` to a temporary file made exclusively under a random name beside `path`, sets
// its mode to `mode` (whatever the umask), fsyncs it and renames it over `path`
// (ReplacementFile, core/file_io.h: the one crash-safe writer).
void write_private_file(const std::string& path, std::string_view contents, mode_t mode = 0600);

}  // namespace tandem
