// Training data against oracles: the shipped corpus is the text data/README.md describes, corpus
// windows are the file's bytes at the documented offsets, the synthetic stream is deterministic
// and uniform, and every (dp_size, micro_batch_size) split of a step feeds exactly the samples a
// single rank would, in the slots plans/schedule.hpp assigns them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "data.hpp"
#include "errors.hpp"
#include "schedule.hpp"
#include "test_support.hpp"

using namespace stepcast;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The 20-byte test corpus: byte i is kText[i].
const std::string kText = "0123456789abcdefghij";

std::vector<int32_t> ids(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

struct Sample {
  std::vector<int32_t> tokens, targets;
};

Sample sample_of(const TokenSource& source, int64_t index, int64_t seq) {
  Sample out{std::vector<int32_t>(seq), std::vector<int32_t>(seq)};
  source.fill(index, seq, out.tokens.data(), out.targets.data());
  return out;
}

}  // namespace

TEST_CASE("the shipped corpus is 300 KB-2 MB of printable ASCII text", "[data]") {
  const std::string path = test::source_path(kCorpusRelativePath);
  REQUIRE(std::filesystem::exists(path));
  const std::string text = read_file(path);
  CHECK(text.size() >= 300 * 1024);
  CHECK(text.size() <= 2 * 1024 * 1024);
  int64_t unprintable = 0;
  for (unsigned char c : text) unprintable += !(c == '\n' || (c >= 0x20 && c <= 0x7e));
  CHECK(unprintable == 0);
  CHECK(text.rfind("First Citizen:\nBefore we proceed any further, hear me speak.", 0) == 0);
  CHECK(text.back() == '\n');

  // A window of the real corpus is its bytes, shifted by one for the targets.
  const int64_t seq = 256;
  const ByteCorpus corpus(path, seq);
  REQUIRE(corpus.size_bytes() == static_cast<int64_t>(text.size()));
  const int64_t k = 1000;
  const Sample s = sample_of(corpus, k, seq);
  const int64_t o = (k * seq) % (corpus.size_bytes() - seq - 1);
  CHECK(s.tokens == ids(text.substr(o, seq)));
  CHECK(s.targets == ids(text.substr(o + 1, seq)));
}

TEST_CASE("ByteCorpus reads consecutive windows with targets shifted by one", "[data]") {
  const ByteCorpus corpus(test::write_temp_file("corpus20.txt", kText), 4);
  CHECK(corpus.vocab_size() == 256);
  CHECK(corpus.size_bytes() == 20);

  const Sample s0 = sample_of(corpus, 0, 4);
  CHECK(s0.tokens == ids("0123"));
  CHECK(s0.targets == ids("1234"));
  const Sample s1 = sample_of(corpus, 1, 4);
  CHECK(s1.tokens == ids("4567"));
  CHECK(s1.targets == ids("5678"));
  const Sample s3 = sample_of(corpus, 3, 4);
  CHECK(s3.tokens == ids("cdef"));
  CHECK(s3.targets == ids("defg"));

  // Shorter sequences from the same corpus use their own stride.
  const Sample short1 = sample_of(corpus, 1, 2);
  CHECK(short1.tokens == ids("23"));
  CHECK(short1.targets == ids("34"));
}

TEST_CASE("ByteCorpus windows wrap around modulo size - seq - 1", "[data]") {
  const ByteCorpus corpus(test::write_temp_file("corpus20.txt", kText), 4);
  // m = 20 - 4 - 1 = 15: offsets 0, 4, 8, 12, then 16 mod 15 = 1, 20 mod 15 = 5, ...
  const std::vector<int64_t> expected = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 0};
  for (int64_t k = 0; k < static_cast<int64_t>(expected.size()); ++k) {
    INFO("sample " << k);
    CHECK(corpus.window_offset(k, 4) == expected[k]);
    const Sample s = sample_of(corpus, k, 4);
    CHECK(s.tokens == ids(kText.substr(expected[k], 4)));
    CHECK(s.targets == ids(kText.substr(expected[k] + 1, 4)));
  }
  // The largest offset, 14, still has its last target inside the file (byte 18).
  CHECK(sample_of(corpus, 11, 4).targets == ids("fghi"));
  // Huge indices reduce without overflow: k = 15·10^15 + 4 behaves like k = 4.
  CHECK(corpus.window_offset(15'000'000'000'000'000 + 4, 4) == 1);
}

TEST_CASE("ByteCorpus names the path when the file is missing or too short", "[data]") {
  const std::string missing =
      (std::filesystem::temp_directory_path() / "stepcast-no-such-corpus.txt").string();
  std::filesystem::remove(missing);
  try {
    ByteCorpus corpus(missing, 8);
    FAIL("no exception for a missing corpus");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find(missing) != std::string::npos);
  }

  // 20 bytes hold seq 18 (needs 20) but not seq 19 (needs 21).
  const std::string short_path = test::write_temp_file("corpus20.txt", kText);
  CHECK_NOTHROW(ByteCorpus(short_path, 18));
  try {
    ByteCorpus corpus(short_path, 19);
    FAIL("no exception for a too-short corpus");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find(short_path) != std::string::npos);
    CHECK(what.find("21") != std::string::npos);
  }

  const ByteCorpus corpus(short_path, 4);
  std::vector<int32_t> buffer(8);
  CHECK_THROWS_AS(corpus.fill(0, 5, buffer.data(), buffer.data()), InputError);
}

TEST_CASE("SyntheticTokens is deterministic, in range and shifted by one", "[data]") {
  const int64_t seq = 64;
  const SyntheticTokens a(50257, 1234), b(50257, 1234), other_seed(50257, 1235);
  CHECK(a.vocab_size() == 50257);
  bool differs = false;
  for (int64_t k : {0, 1, 7, 123456789}) {
    const Sample sa = sample_of(a, k, seq), sb = sample_of(b, k, seq);
    CHECK(sa.tokens == sb.tokens);
    CHECK(sa.targets == sb.targets);
    differs |= sa.tokens != sample_of(other_seed, k, seq).tokens;
    for (int64_t t = 0; t < seq; ++t) {
      CHECK(sa.tokens[t] >= 0);
      CHECK(sa.tokens[t] < 50257);
      CHECK(sa.tokens[t] == a.token_at(k * seq + t));
      CHECK(sa.targets[t] == a.token_at(k * seq + t + 1));
    }
    // Consecutive samples continue one stream.
    CHECK(sa.targets[seq - 1] == sample_of(a, k + 1, seq).tokens[0]);
  }
  CHECK(differs);

  // The first outputs of SplitMix64 seeded with 0 (the reference implementation's values).
  CHECK(splitmix64_at(0, 0) == 0xE220A8397B1DCDAFull);
  CHECK(splitmix64_at(0, 1) == 0x6E789E6AA1B965F4ull);
  CHECK_THROWS_AS(SyntheticTokens(0, 1), InputError);
}

TEST_CASE("SyntheticTokens is roughly uniform over the vocabulary", "[data]") {
  // Chi-square over 16 symbols and 16,000 tokens: 15 degrees of freedom, mean 15, sd 5.5;
  // 50 is beyond p = 1e-5 and the stream is deterministic, so this never flakes.
  const int32_t V = 16;
  const SyntheticTokens source(V, 42);
  const int64_t n = 16000;
  std::vector<int64_t> counts(V, 0);
  for (int64_t p = 0; p < n; ++p) ++counts[source.token_at(p)];
  const double expected = static_cast<double>(n) / V;
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  CHECK(chi2 < 50);

  // Large vocabulary: the mean id is near (V - 1) / 2 and both halves are used.
  const SyntheticTokens llama(128256, 7);
  double sum = 0;
  int64_t upper_half = 0;
  for (int64_t p = 0; p < 4000; ++p) {
    const int32_t t = llama.token_at(p);
    sum += t;
    upper_half += t >= 128256 / 2;
  }
  CHECK(std::abs(sum / 4000 / ((128256 - 1) / 2.0) - 1) < 0.05);
  CHECK(upper_half > 1800);
  CHECK(upper_half < 2200);
}

TEST_CASE("make_token_source picks the corpus for vocab 256 and synthetic otherwise", "[data]") {
  const std::string path = test::write_temp_file("corpus20.txt", kText);
  const auto bytes = make_token_source(256, 4, path, 99);
  CHECK(dynamic_cast<const ByteCorpus*>(bytes.get()) != nullptr);
  CHECK(bytes->vocab_size() == 256);

  const auto gpt2 = make_token_source(50257, 4, "/nonexistent/corpus.txt", 99);
  CHECK(dynamic_cast<const SyntheticTokens*>(gpt2.get()) != nullptr);
  CHECK(gpt2->vocab_size() == 50257);
  CHECK(sample_of(*gpt2, 3, 4).tokens == sample_of(SyntheticTokens(50257, 99), 3, 4).tokens);

  CHECK_THROWS_AS(make_token_source(256, 4, "/nonexistent/corpus.txt", 99), InputError);
  CHECK_THROWS_AS(make_token_source(0, 4, path, 99), InputError);
}

TEST_CASE("fill_microbatch covers a step once and matches the single-rank batch", "[data]") {
  const std::string corpus_path = test::source_path(kCorpusRelativePath);
  const ByteCorpus corpus(corpus_path, 32);
  const SyntheticTokens synthetic(50257, 5);
  const int64_t gbs = 24, seq = 32, step = 3;

  for (const TokenSource* source : {static_cast<const TokenSource*>(&corpus),
                                    static_cast<const TokenSource*>(&synthetic)}) {
    // The oracle: one rank, one microbatch holding the whole global batch.
    std::vector<int32_t> ref_tokens(gbs * seq), ref_targets(gbs * seq);
    std::vector<int64_t> ref_index(gbs);
    fill_microbatch(*source, step, gbs, gbs, 1, 0, 0, seq, ref_tokens.data(), ref_targets.data(),
                    ref_index.data());
    for (int64_t s = 0; s < gbs; ++s) CHECK(ref_index[s] == s);

    struct Split {
      int64_t dp_size, micro_batch_size;
    };
    for (const Split split : {Split{1, 1}, Split{1, 4}, Split{2, 3}, Split{3, 2}, Split{4, 6},
                              Split{6, 1}, Split{24, 1}}) {
      INFO("dp_size " << split.dp_size << ", micro_batch_size " << split.micro_batch_size);
      const int64_t b = split.micro_batch_size;
      const int64_t m = gbs / (split.dp_size * b);
      std::vector<int> seen(gbs, 0);
      for (int64_t d = 0; d < split.dp_size; ++d) {
        for (int64_t j = 0; j < m; ++j) {
          std::vector<int32_t> tokens(b * seq), targets(b * seq);
          std::vector<int64_t> index(b);
          fill_microbatch(*source, step, gbs, b, split.dp_size, d, j, seq, tokens.data(),
                          targets.data(), index.data());
          for (int64_t r = 0; r < b; ++r) {
            const int64_t s = index[r];
            REQUIRE(s >= 0);
            REQUIRE(s < gbs);
            ++seen[s];
            // The same slot plans/schedule.hpp assigns, and the same global sample index.
            const SampleSlot slot = sample_slot(s, b, split.dp_size);
            CHECK(slot.dp_rank == d);
            CHECK(slot.microbatch == j);
            CHECK(slot.offset == r);
            CHECK(global_sample_index(step, gbs, slot, b, split.dp_size) == step * gbs + s);
            // Sample for sample, the single-rank batch's row s.
            CHECK(std::equal(tokens.begin() + r * seq, tokens.begin() + (r + 1) * seq,
                             ref_tokens.begin() + s * seq));
            CHECK(std::equal(targets.begin() + r * seq, targets.begin() + (r + 1) * seq,
                             ref_targets.begin() + s * seq));
          }
        }
      }
      CHECK(seen == std::vector<int>(gbs, 1));
    }
  }

  // Consecutive steps read different samples.
  std::vector<int32_t> t3(seq), t4(seq), unused(seq);
  fill_microbatch(synthetic, 3, gbs, 1, 1, 0, 0, seq, t3.data(), unused.data(), nullptr);
  fill_microbatch(synthetic, 4, gbs, 1, 1, 0, 0, seq, t4.data(), unused.data(), nullptr);
  CHECK(t3 != t4);
}

TEST_CASE("fill_microbatch rejects shapes that do not divide the batch", "[data]") {
  const SyntheticTokens source(100, 1);
  std::vector<int32_t> tokens(64), targets(64);
  auto fill = [&](int64_t step, int64_t gbs, int64_t b, int64_t dp, int64_t d, int64_t j) {
    fill_microbatch(source, step, gbs, b, dp, d, j, 4, tokens.data(), targets.data(), nullptr);
  };
  CHECK_NOTHROW(fill(0, 8, 2, 2, 1, 1));
  CHECK_THROWS_AS(fill(0, 8, 3, 1, 0, 0), InputError);   // 8 % 3 != 0
  CHECK_THROWS_AS(fill(0, 8, 2, 2, 2, 0), InputError);   // dp_rank == dp_size
  CHECK_THROWS_AS(fill(0, 8, 2, 2, 0, 2), InputError);   // microbatch == m
  CHECK_THROWS_AS(fill(-1, 8, 2, 2, 0, 0), InputError);  // negative step
  CHECK_THROWS_AS(fill(0, 8, 0, 2, 0, 0), InputError);   // empty microbatch
}

TEST_CASE("to_sequence_major transposes [b][s] into [s][b]", "[data]") {
  // b = 2, s = 3: rows {1 2 3} and {4 5 6} become token rows t = s·b + b_index.
  const std::vector<int32_t> batch_major = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> sequence_major(6, -1);
  to_sequence_major(batch_major.data(), 2, 3, sequence_major.data());
  CHECK(sequence_major == std::vector<int32_t>{1, 4, 2, 5, 3, 6});
}
