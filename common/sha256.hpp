// SHA-256 over a byte stream, for the StepProgram's identity (program_sha256) and checkpoint
// files: OpenSSL's (libcrypto's EVP interface, which uses the CPU's SHA extensions where it has
// them: about 1.7 GB/s on this project's 2-core VM, against 140 MB/s for the hand-written FIPS
// 180-4 code it replaces). Incremental so that a large program or file is hashed while it is
// written or read, never held twice.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace stepcast {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view bytes);
  // Finishes the hash; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace stepcast
