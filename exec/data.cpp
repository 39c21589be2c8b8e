// Token sources and the microbatch sample mapping; see data.hpp for the layouts and formulas.
#include "data.hpp"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "errors.hpp"
#include "replica_microbatches.hpp"

namespace stepcast {

namespace {

void check_seq_length(int64_t seq_length, int64_t max_seq_length) {
  if (seq_length < 1 || seq_length > max_seq_length) {
    throw InputError("seq_length " + std::to_string(seq_length) +
                                "; valid: 1.." + std::to_string(max_seq_length));
  }
}

}  // namespace

// ---- ByteCorpus --------------------------------------------------------------------------------

ByteCorpus::ByteCorpus(const std::string& path, int64_t max_seq_length)
    : path_(path), max_seq_length_(max_seq_length) {
  if (max_seq_length < 1) {
    throw InputError("ByteCorpus " + path + ": max_seq_length " +
                                std::to_string(max_seq_length) + "; valid: >= 1");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path + ": corpus file cannot be read (missing or not readable); valid: a "
                            "byte-level text file of at least seq_length + 2 = " +
                     std::to_string(max_seq_length + 2) + " bytes");
  }
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(path + ": corpus file could not be read to the end");
  if (size_bytes() < max_seq_length + 2) {
    throw InputError(path + ": corpus holds " + std::to_string(size_bytes()) +
                     " bytes; seq_length " + std::to_string(max_seq_length) +
                     " needs at least seq_length + 2 = " + std::to_string(max_seq_length + 2));
  }
  if (size_bytes() >= (int64_t{1} << 31)) {
    throw InputError(path + ": corpus holds " + std::to_string(size_bytes()) +
                     " bytes; valid: under 2 GiB");
  }
}

int64_t ByteCorpus::window_offset(int64_t global_sample_index, int64_t seq_length) const {
  check_seq_length(seq_length, max_seq_length_);
  STEPCAST_CHECK(global_sample_index >= 0, "negative global sample index");
  const int64_t modulus = size_bytes() - seq_length - 1;  // >= 1 since size >= max_seq + 2
  // (k·s) mod m without forming k·s: both factors are reduced first and are < m < 2^31 for any
  // corpus under 2 GiB, so their product fits in 64 bits.
  STEPCAST_CHECK(modulus < (int64_t{1} << 31), "corpus too large for the offset arithmetic");
  return (global_sample_index % modulus) * (seq_length % modulus) % modulus;
}

void ByteCorpus::fill(int64_t global_sample_index, int64_t seq_length, int32_t* tokens,
                      int32_t* targets) const {
  const int64_t offset = window_offset(global_sample_index, seq_length);
  const uint8_t* window = bytes_.data() + offset;  // seq_length + 1 bytes
  for (int64_t t = 0; t < seq_length; ++t) {
    tokens[t] = window[t];
    targets[t] = window[t + 1];
  }
}

// ---- SyntheticTokens ---------------------------------------------------------------------------

uint64_t splitmix64_at(uint64_t seed, uint64_t position) {
  uint64_t z = seed + (position + 1) * 0x9E3779B97F4A7C15ull;  // the generator's state
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SyntheticTokens::SyntheticTokens(int32_t vocab_size, uint64_t seed)
    : vocab_size_(vocab_size), seed_(seed) {
  if (vocab_size < 1) {
    throw InputError("SyntheticTokens: vocab_size " + std::to_string(vocab_size) +
                                "; valid: >= 1");
  }
}

int32_t SyntheticTokens::token_at(uint64_t position) const {
  // Modulo bias is below V / 2^64, far under anything a loss curve can show.
  return static_cast<int32_t>(splitmix64_at(seed_, position) % static_cast<uint64_t>(vocab_size_));
}

void SyntheticTokens::fill(int64_t global_sample_index, int64_t seq_length, int32_t* tokens,
                           int32_t* targets) const {
  STEPCAST_CHECK(global_sample_index >= 0, "negative global sample index");
  if (seq_length < 1) {
    throw InputError("seq_length " + std::to_string(seq_length) + "; valid: >= 1");
  }
  // Positions wrap modulo 2^64 for absurd indices, which keeps the stream well defined.
  const uint64_t start =
      static_cast<uint64_t>(global_sample_index) * static_cast<uint64_t>(seq_length);
  int32_t current = token_at(start);
  for (int64_t t = 0; t < seq_length; ++t) {
    const int32_t next = token_at(start + static_cast<uint64_t>(t) + 1);
    tokens[t] = current;
    targets[t] = next;
    current = next;
  }
}

// ---- Choosing a source -------------------------------------------------------------------------

std::unique_ptr<TokenSource> make_token_source(int64_t model_vocab_size, int64_t seq_length,
                                               const std::string& corpus_path, uint64_t seed) {
  if (model_vocab_size < 1 || model_vocab_size > INT32_MAX) {
    throw InputError("make_token_source: vocab_size " +
                                std::to_string(model_vocab_size) + "; valid: 1..2^31-1");
  }
  if (model_vocab_size == 256) return std::make_unique<ByteCorpus>(corpus_path, seq_length);
  return std::make_unique<SyntheticTokens>(static_cast<int32_t>(model_vocab_size), seed);
}

// ---- Microbatches ------------------------------------------------------------------------------

void fill_microbatch(const TokenSource& source, int64_t step, int64_t global_batch_size,
                     int64_t micro_batch_size, int64_t dp_size, int64_t dp_rank,
                     int64_t microbatch, int64_t seq_length, int32_t* tokens, int32_t* targets,
                     int64_t* sample_index_out, const std::vector<int64_t>& microbatches_per_replica) {
  auto where = [&] {  // built only on the error paths
    std::string unequal;
    for (int64_t m : microbatches_per_replica) unequal += (unequal.empty() ? "" : ",") + std::to_string(m);
    return "fill_microbatch: step " + std::to_string(step) + ", global_batch_size " +
           std::to_string(global_batch_size) + ", micro_batch_size " +
           std::to_string(micro_batch_size) + ", dp_size " + std::to_string(dp_size) +
           ", dp_rank " + std::to_string(dp_rank) + ", microbatch " + std::to_string(microbatch) +
           ", seq_length " + std::to_string(seq_length) +
           (unequal.empty() ? "" : ", microbatches_per_replica " + unequal);
  };
  if (step < 0 || global_batch_size < 1 || micro_batch_size < 1 || dp_size < 1 ||
      seq_length < 1) {
    throw InputError(where() + ": step must be >= 0 and sizes >= 1");
  }
  int64_t num_microbatches = 0;
  if (microbatches_per_replica.empty()) {
    if (global_batch_size % (micro_batch_size * dp_size) != 0) {
      throw InputError(
          where() + ": global_batch_size must be a multiple of micro_batch_size * dp_size");
    }
    num_microbatches = global_batch_size / (micro_batch_size * dp_size);
  } else {
    int64_t total = 0;
    for (int64_t m : microbatches_per_replica) total += m < 1 ? -global_batch_size : m;
    if (int64_t(microbatches_per_replica.size()) != dp_size || total * micro_batch_size != global_batch_size) {
      throw InputError(where() + ": microbatches_per_replica must hold dp_size counts >= 1 whose samples make "
                                 "global_batch_size");
    }
    if (dp_rank >= 0 && dp_rank < dp_size) num_microbatches = microbatches_per_replica[size_t(dp_rank)];
  }
  if (dp_rank < 0 || dp_rank >= dp_size || microbatch < 0 || microbatch >= num_microbatches) {
    throw InputError(where() + ": valid dp_rank 0.." + std::to_string(dp_size - 1) +
                                ", microbatch 0.." + std::to_string(num_microbatches - 1));
  }
  // plans/schedule.hpp's mapping (replica_microbatches.hpp's with unequal replicas): slot s holds
  // the step's samples s·b + [0, b); with equal replicas slot j·dp_size + d.
  const int64_t first_sample =
      microbatch_slot(microbatches_per_replica, dp_size, dp_rank, microbatch) * micro_batch_size;
  for (int64_t b = 0; b < micro_batch_size; ++b) {
    const int64_t sample = first_sample + b;
    source.fill(step * global_batch_size + sample, seq_length, tokens + b * seq_length,
                targets + b * seq_length);
    if (sample_index_out) sample_index_out[b] = sample;
  }
}

void to_sequence_major(const int32_t* batch_major, int64_t micro_batch_size, int64_t seq_length,
                       int32_t* sequence_major) {
  for (int64_t b = 0; b < micro_batch_size; ++b) {
    for (int64_t s = 0; s < seq_length; ++s) {
      sequence_major[s * micro_batch_size + b] = batch_major[b * seq_length + s];
    }
  }
}

}  // namespace stepcast
