// SHA-256 against the FIPS 180-4 examples, and the same hash whatever the pieces it is fed in or
// however the hash in progress is moved.
#include "tandem/core/sha256.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace tandem {
namespace {

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PiecesGiveTheSameDigest) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>(i * 37);
  for (size_t piece : {1u, 7u, 63u, 64u, 65u, 200u}) {
    Sha256 h;
    for (size_t at = 0; at < text.size(); at += piece)
      h.update(std::string_view(text).substr(at, piece));
    EXPECT_EQ(h.hex(), sha256_hex(text)) << "pieces of " << piece;
  }
}

// A hash in progress moves with its state; assigning a new one starts afresh (as a checkpoint
// writer does between tensors).
TEST(Sha256, MovesKeepTheStateAndAssignmentRestarts) {
  Sha256 a;
  a.update("ab");
  a.update(nullptr, 0);
  Sha256 b = std::move(a);
  b.update("c");
  EXPECT_EQ(b.hex(), sha256_hex("abc"));
  b = Sha256();
  b.update("abc");
  EXPECT_EQ(b.hex(), sha256_hex("abc"));
}

}  // namespace
}  // namespace tandem
