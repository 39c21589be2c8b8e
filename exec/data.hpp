// Training data for the executor and the tests: the token streams a step's microbatches read, and
// the sample → (dp rank, microbatch) mapping that makes every parallel plan feed the same samples
// to the same slots of the global batch. Two sources: the byte-level corpus shipped in
// data/corpus/ (vocab 256, token = byte value) and a deterministic pseudo-random stream for the
// large-vocabulary shapes stepcast has no tokenizer for. No shuffling, no tokenizer, no I/O beyond
// reading the corpus file once. Token ids are int32 (as Megatron's); layouts are [b][s] unless a
// name says sequence-major ([s][b], the order activations use).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stepcast {

// The corpus shipped with the repository, relative to the source tree (see data/README.md).
inline constexpr const char* kCorpusRelativePath = "data/corpus/shakespeare.txt";

// A deterministic token stream, addressed by global sample index: the same index always yields
// the same sample, whichever rank, microbatch or plan asks for it.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int32_t vocab_size() const = 0;
  // Sample `global_sample_index` (>= 0): tokens[t] is position t of the sample, t in
  // [0, seq_length), and targets[t] is position t + 1 (the next token). Both arrays hold
  // seq_length ids in [0, vocab_size()).
  virtual void fill(int64_t global_sample_index, int64_t seq_length, int32_t* tokens,
                    int32_t* targets) const = 0;
};

// Byte-level tokenizer over a file: vocab 256, token = byte value. Sample k reads the bytes
// [o, o + seq_length] with o = (k·seq_length) mod (size_bytes − seq_length − 1): consecutive,
// non-overlapping windows from the start of the file, wrapping around to the start once they
// would run past its end. The window start never exceeds size_bytes − seq_length − 2, so the
// target of the last position always exists.
class ByteCorpus final : public TokenSource {
 public:
  // Reads the whole file. Throws InputError naming `path` when it cannot be read, holds fewer
  // than max_seq_length + 2 bytes or 2 GiB or more. fill() accepts seq_length in
  // [1, max_seq_length] (InputError otherwise).
  ByteCorpus(const std::string& path, int64_t max_seq_length);

  int32_t vocab_size() const override { return 256; }
  void fill(int64_t global_sample_index, int64_t seq_length, int32_t* tokens,
            int32_t* targets) const override;

  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return static_cast<int64_t>(bytes_.size()); }
  // o(k) above, exposed for tests and for reporting which text a step saw.
  int64_t window_offset(int64_t global_sample_index, int64_t seq_length) const;

 private:
  std::string path_;
  int64_t max_seq_length_;
  std::vector<uint8_t> bytes_;
};

// A pseudo-random stream for vocabularies without a tokenizer (GPT-2's 50257, Llama 3's 128256):
// the token at global position p is splitmix64_at(seed, p) mod vocab_size, and sample k covers
// positions [k·seq_length, k·seq_length + seq_length] (tokens the first seq_length, targets the
// last seq_length), so sample k's last target is sample k+1's first token. Uniform over the
// vocabulary; there is nothing to learn beyond that, but the loss starts at ln(vocab_size).
class SyntheticTokens final : public TokenSource {
 public:
  // Throws InputError for vocab_size < 1.
  SyntheticTokens(int32_t vocab_size, uint64_t seed);

  int32_t vocab_size() const override { return vocab_size_; }
  void fill(int64_t global_sample_index, int64_t seq_length, int32_t* tokens,
            int32_t* targets) const override;
  // The token at global stream position p.
  int32_t token_at(uint64_t position) const;

 private:
  int32_t vocab_size_;
  uint64_t seed_;
};

// The (position + 1)-th output of a SplitMix64 generator seeded with `seed` (Steele, Lea and
// Flood 2014): a stateless hash, so any position is computed without the ones before it.
uint64_t splitmix64_at(uint64_t seed, uint64_t position);

// The rule the executor uses: a model whose vocabulary is exactly 256 is byte-level and trains on
// the corpus at corpus_path (seed unused); any other vocabulary gets SyntheticTokens(vocab, seed)
// and corpus_path is not read. seq_length is the longest sequence that will be asked for (the
// corpus must hold seq_length + 2 bytes). Throws InputError from ByteCorpus, and
// InputError for model_vocab_size outside [1, 2^31 − 1].
std::unique_ptr<TokenSource> make_token_source(int64_t model_vocab_size, int64_t seq_length,
                                               const std::string& corpus_path, uint64_t seed);

// Tokens of microbatch `microbatch` of dp rank `dp_rank` in step `step`, following
// plans/schedule.hpp (sample_slot / global_sample_index): sample s of the step (0 <= s <
// global_batch_size) has global index step·global_batch_size + s, and microbatch j of dp rank d
// holds the step's samples (j·dp_size + d)·micro_batch_size + [0, micro_batch_size). The index
// arithmetic is written out in data.cpp, not a call into schedule.cpp; tests/exec/test_data.cpp checks
// the two agree. Row b of tokens/targets ([micro_batch_size][seq_length]) is that sample, and
// sample_index_out[b] (may be null) receives its index s within the step.
// Unequal replicas (`microbatches_per_replica` not empty, plans/replica_microbatches.hpp): slot
// microbatch_slot(...) instead of j·dp_size + d, which it equals for equal replicas.
// Throws InputError unless step >= 0, sizes >= 1, global_batch_size is a multiple of
// micro_batch_size·dp_size (unequal replicas: their microbatches · micro_batch_size), 0 <= dp_rank
// < dp_size and 0 <= microbatch < num_microbatches (= global_batch_size / (micro_batch_size·dp_size);
// unequal replicas: the replica's own).
void fill_microbatch(const TokenSource& source, int64_t step, int64_t global_batch_size,
                     int64_t micro_batch_size, int64_t dp_size, int64_t dp_rank,
                     int64_t microbatch, int64_t seq_length, int32_t* tokens /*[b][s]*/,
                     int32_t* targets /*[b][s]*/, int64_t* sample_index_out /*[b]*/,
                     const std::vector<int64_t>& microbatches_per_replica = {});

// batch_major [b][s] → sequence_major [s][b] (activations are laid out [s, b, h], so token row
// t = s_index·b + b_index). The two buffers must not overlap.
void to_sequence_major(const int32_t* batch_major, int64_t micro_batch_size, int64_t seq_length,
                       int32_t* sequence_major);

}  // namespace stepcast
