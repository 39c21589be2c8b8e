// stepcast_sha256_rate: the SHA-256 throughput programs and checkpoints are hashed at (common/
// sha256.hpp, OpenSSL's libcrypto), over 1 GiB hashed in 4 MiB chunks as a checkpoint file is.
// Not a test: it prints figures (bench/hash.sh). Issue 18 asks for >= 1 GB/s on this machine.
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#include "sha256.hpp"

int main() {
  const size_t chunk = size_t(4) << 20, total = size_t(1) << 30;
  std::string block(chunk, '\0');
  for (size_t i = 0; i < chunk; ++i) block[i] = char((i * 2654435761u) >> 13);
  double best = 0;
  std::string digest;
  for (int round = 0; round < 3; ++round) {
    auto start = std::chrono::steady_clock::now();
    stepcast::Sha256 hash;
    for (size_t done = 0; done < total; done += chunk) hash.update(std::string_view(block));
    digest = hash.hex_digest();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, double(total) / s);
  }
  std::printf("sha256: %.2f GB/s over 1 GiB in 4 MiB chunks (best of 3), digest %.16s...\n", best / 1e9,
              digest.c_str());
  return 0;
}
