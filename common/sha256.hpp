// SHA-256 (FIPS 180-4) over a byte stream, for the StepProgram's identity (program_sha256).
// Incremental so that a large program can be hashed while it is written, never held twice.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace stepcast {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  // Finishes the hash; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace stepcast
