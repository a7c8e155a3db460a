// The store's and the direct transport's cryptography (util/crypto.h) against published test
// vectors: FIPS 180-2's SHA-256 examples and RFC 4231's HMAC-SHA-256 cases.
#include "util/crypto.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

std::string hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

TEST(Crypto, Sha256MatchesTheStandardsExamples) {
  using tutti::detail::sha256;
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Crypto, HmacSha256MatchesRfc4231) {
  using tutti::detail::hmac_sha256;
  // Test case 1: a 20-byte key of 0x0b.
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block, hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

// The edges of the key's block (values from Python's hmac module): an empty key, a key of exactly
// one block (used as it is), one byte past it (hashed first). Each key twice: the second use is
// the key kept keyed.
TEST(Crypto, HmacSha256AtTheKeysBlockEdges) {
  using tutti::detail::hmac_sha256;
  std::string block;
  for (int i = 0; i < 65; ++i) block.push_back(static_cast<char>(i));
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(hex(hmac_sha256("", "")),
              "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
    EXPECT_EQ(hex(hmac_sha256(block.substr(0, 64), "a key of exactly one block")),
              "4160934932697efcd68b6416b5ef5d5f636b1117cf3e740649df906895cd9186");
    EXPECT_EQ(hex(hmac_sha256(block, "a key one byte past the block")),
              "49d8a8029b0ac782654a976e6f3c942956281b2742b67b1598db62590da3807e");
  }
}

// Keys used before are kept keyed (a few of them): a key's second use, and keys past those kept,
// give the same MACs as the first. The expected values are RFC 4231's; the other keys' MACs
// come out different from theirs and from each other.
TEST(Crypto, HmacSha256IsTheSameForKeysSeenBeforeAndPastThoseKept) {
  using tutti::detail::hmac_sha256;
  const std::string case1 = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
  const std::string case2 = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  const std::string case6 = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54";
  std::set<std::string> others;
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 12; ++k) {
      others.insert(hex(hmac_sha256("key " + std::to_string(k), "Hi There")));
    }
    EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")), case1) << round;
    EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")), case2) << round;
    EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                              "Test Using Larger Than Block-Size Key - Hash Key First")),
              case6)
        << round;
  }
  EXPECT_EQ(others.size(), 12u);  // the second round's MACs were the first's
  EXPECT_EQ(others.count(case1), 0u);
}

TEST(Crypto, SameSecretComparesEveryByteAndTheLength) {
  using tutti::detail::same_secret;
  EXPECT_TRUE(same_secret("", ""));
  EXPECT_TRUE(same_secret(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(same_secret(std::string("a\0b", 3), std::string("a\0c", 3)));
  EXPECT_FALSE(same_secret("proof", "proof!"));
  EXPECT_FALSE(same_secret("", "x"));
  const std::string a(32, 'p');
  for (size_t i = 0; i < a.size(); ++i) {
    std::string b = a;
    b[i] ^= 1;
    EXPECT_FALSE(same_secret(a, b)) << "a difference at byte " << i;
  }
}

TEST(Crypto, RandomBytesHaveTheLengthAskedAndDoNotRepeat) {
  using tutti::detail::random_bytes;
  EXPECT_EQ(random_bytes(0).size(), 0u);
  EXPECT_EQ(random_bytes(1000).size(), 1000u);
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(random_bytes(16));
  EXPECT_EQ(seen.size(), 100u);  // 128-bit values: a repeat would mean no randomness
  // Every byte value shows up in 64 KiB (a fixed or narrow source would not).
  std::set<unsigned char> values;
  for (unsigned char c : random_bytes(65536)) values.insert(c);
  EXPECT_EQ(values.size(), 256u);
}
