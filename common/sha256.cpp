// SHA-256 through OpenSSL's EVP digest interface; checked against FIPS 180-4's test vectors in
// tests/plans/test_program_json.cpp.
#include "sha256.hpp"

#include <openssl/evp.h>

#include "errors.hpp"

namespace stepcast {

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  context_->md = EVP_MD_CTX_new();
  STEPCAST_CHECK(context_->md != nullptr, "OpenSSL: EVP_MD_CTX_new failed");
  STEPCAST_CHECK(EVP_DigestInit_ex(context_->md, EVP_sha256(), nullptr) == 1, "OpenSSL: SHA-256 init failed");
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_->md); }

void Sha256::update(std::string_view bytes) {
  if (bytes.empty()) return;
  STEPCAST_CHECK(EVP_DigestUpdate(context_->md, bytes.data(), bytes.size()) == 1, "OpenSSL: SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  STEPCAST_CHECK(EVP_DigestFinal_ex(context_->md, digest, &length) == 1 && length == 32,
                 "OpenSSL: SHA-256 final failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned int i = 0; i < length; ++i) {
    out.push_back(hex[digest[i] >> 4]);
    out.push_back(hex[digest[i] & 15]);
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 hash;
  hash.update(bytes);
  return hash.hex_digest();
}

}  // namespace stepcast
