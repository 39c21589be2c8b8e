// Interned buffer names (buffer_name.hpp) and the small vectors of an op's fields
// (small_vector.hpp): a handle is its text's, whatever thread interned it.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "buffer_name.hpp"
#include "small_vector.hpp"

using namespace stepcast;

TEST_CASE("buffer names: one handle per text and the text back") {
  BufferName a = std::string("mb3.L7.qkv"), b = "mb3.L7.qkv", c = "mb3.L7.ctx";
  CHECK(a == b);
  CHECK(a.handle() == b.handle());
  CHECK(!(a == c));
  CHECK(a.str() == "mb3.L7.qkv");
  CHECK(a == "mb3.L7.qkv");
  CHECK(a == std::string("mb3.L7.qkv"));
  CHECK(a.rfind("mb3.", 0) == 0);
  CHECK(a.substr(4) == "L7.qkv");
  CHECK(a.size() == 10);
  CHECK(("x." + a) == "x.mb3.L7.qkv");
  CHECK((a + ".y") == "mb3.L7.qkv.y");
  BufferName empty;
  CHECK(empty.empty());
  CHECK(empty.str().empty());
  CHECK(BufferName("").handle() == 0);
  // Ordered as their texts, whatever order they were interned in.
  BufferName z = "zz.first.interned", y = "aa.second.interned";
  CHECK(y < z);
  CHECK(!(z < y));
  CHECK(!(z < z));
  std::map<std::string, int> by_text{{"mb3.L7.qkv", 1}};
  CHECK(by_text.count(a) == 1);
}

TEST_CASE("buffer names: threads interning the same texts get the same handles") {
  constexpr int kThreads = 4, kNames = 20000;
  std::vector<std::vector<uint32_t>> handles(kThreads, std::vector<uint32_t>(kNames));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kNames; ++i) {
        const int n = (t % 2 == 0) ? i : kNames - 1 - i;  // two orders
        handles[size_t(t)][size_t(n)] = BufferName("threads.mb" + std::to_string(n) + ".grad").handle();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<uint32_t> distinct;
  for (int i = 0; i < kNames; ++i) {
    for (int t = 1; t < kThreads; ++t) REQUIRE(handles[size_t(t)][size_t(i)] == handles[0][size_t(i)]);
    distinct.insert(handles[0][size_t(i)]);
    BufferName name("threads.mb" + std::to_string(i) + ".grad");
    REQUIRE(name.str() == "threads.mb" + std::to_string(i) + ".grad");
  }
  CHECK(distinct.size() == size_t(kNames));
  CHECK(buffer_name_stats().names >= uint64_t(kNames));
}

TEST_CASE("small vectors: inline up to N, on the heap beyond, as std::vector") {
  SmallVector<int32_t, 2> v;
  CHECK(v.empty());
  v.push_back(1);
  v.push_back(2);
  CHECK(v.capacity() == 2);
  v.push_back(3);  // to the heap
  v.push_back(v[0]);
  CHECK(v.size() == 4);
  CHECK(v.to_vector() == std::vector<int32_t>{1, 2, 3, 1});
  SmallVector<int32_t, 2> copy = v, moved = std::move(v);
  CHECK(copy == moved);
  CHECK(v.empty());
  moved.insert(moved.begin() + 1, 9);
  CHECK(moved == std::vector<int32_t>{1, 9, 2, 3, 1});
  moved.erase(moved.begin(), moved.begin() + 2);
  CHECK(moved == std::vector<int32_t>{2, 3, 1});
  moved = {7};
  CHECK(moved.size() == 1);
  CHECK(moved.back() == 7);
  SmallVector<BufferName, 2> names = {"a.name", "b.name", "c.name"};
  CHECK(names[2] == "c.name");
}
