// Interned buffer names (buffer_name.hpp) and shapes (op_shape.hpp), and the small vectors of an
// op's fields (small_vector.hpp): a handle is its text's (dims'), whatever thread interned it.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "buffer_name.hpp"
#include "op_shape.hpp"
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

TEST_CASE("op shapes: one handle per list of dims and the dims back") {
  OpShape a = {2048, 1, 12288}, b = std::vector<int64_t>{2048, 1, 12288}, c = {2048, 12288, 1};
  CHECK(a == b);
  CHECK(!(a == c));
  CHECK(a.size() == 3);
  CHECK(a[0] == 2048);
  CHECK(a.back() == 12288);
  CHECK(a.to_vector() == std::vector<int64_t>{2048, 1, 12288});
  CHECK(a == std::vector<int64_t>{2048, 1, 12288});
  CHECK(!(a == std::vector<int64_t>{2048, 1}));
  int64_t elements = 1;
  for (int64_t d : a) elements *= d;
  CHECK(elements == 2048 * 12288);
  OpShape none, empty = std::vector<int64_t>{};
  CHECK(none.empty());
  CHECK(none.size() == 0);
  CHECK(none == empty);
  CHECK(!(none == OpShape{0}));  // a dim of 0 is a shape, not none
  // Longer shapes and many distinct ones (more than one storage chunk of 4,096).
  OpShape five = {1, 2, 3, 4, 5};
  CHECK(five.to_vector() == std::vector<int64_t>{1, 2, 3, 4, 5});
  const uint32_t before = interned_shapes();
  for (int64_t i = 0; i < 5000; ++i) REQUIRE(OpShape{i, -7, 3}.to_vector() == std::vector<int64_t>{i, -7, 3});
  CHECK(interned_shapes() >= before + 5000 - 1);
  CHECK(OpShape{4999, -7, 3} == OpShape(std::vector<int64_t>{4999, -7, 3}));
}

TEST_CASE("op shapes: threads interning the same dims get the same handles") {
  constexpr int kThreads = 4, kShapes = 5000;
  std::vector<std::vector<OpShape>> shapes(kThreads, std::vector<OpShape>(kShapes));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kShapes; ++i) {
        const int n = (t % 2 == 0) ? i : kShapes - 1 - i;  // two orders
        shapes[size_t(t)][size_t(n)] = OpShape{int64_t(n), 11, int64_t(t % 2)};
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < kShapes; ++i) {
    for (int t = 2; t < kThreads; t += 2) REQUIRE(shapes[size_t(t)][size_t(i)] == shapes[0][size_t(i)]);
    for (int t = 3; t < kThreads; t += 2) REQUIRE(shapes[size_t(t)][size_t(i)] == shapes[1][size_t(i)]);
    REQUIRE(!(shapes[0][size_t(i)] == shapes[1][size_t(i)]));
    REQUIRE(shapes[1][size_t(i)].to_vector() == std::vector<int64_t>{i, 11, 1});
  }
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

TEST_CASE("small vectors: as small as their values, whatever they held") {
  // The heap block's address is kept in the inline bytes: an op's three vectors take 52 bytes.
  STATIC_REQUIRE(sizeof(SmallVector<int32_t, 4>) == 20);
  STATIC_REQUIRE(sizeof(SmallVector<BufferName, 4>) == 20);
  STATIC_REQUIRE(sizeof(SmallVector<BufferName, 2>) == 12);
  STATIC_REQUIRE(alignof(SmallVector<int32_t, 4>) == 4);
  SmallVector<int32_t, 4> v;
  std::vector<int32_t> same;
  for (int32_t i = 0; i < 1000; ++i) {  // many growths on the heap
    v.push_back(i);
    same.push_back(i);
  }
  CHECK(v == same);
  CHECK(v.capacity() >= 1000);
  // Shrunk below N it stays on the heap, and grows again from there.
  v.erase(v.begin() + 2, v.end());
  v.pop_back();
  CHECK(v == std::vector<int32_t>{0});
  for (int32_t i = 1; i < 10; ++i) v.push_back(-i);
  CHECK(v == std::vector<int32_t>{0, -1, -2, -3, -4, -5, -6, -7, -8, -9});
  v.clear();
  CHECK(v.empty());
  v.insert(v.begin(), 5);
  CHECK(v == std::vector<int32_t>{5});
  // Copies and moves of a heap vector; the moved-from one is empty and usable.
  SmallVector<int32_t, 4> big(same.begin(), same.end());
  SmallVector<int32_t, 4> copy = big;
  SmallVector<int32_t, 4> moved = std::move(big);
  CHECK(copy == same);
  CHECK(moved == same);
  CHECK(big.empty());
  big.push_back(3);
  CHECK(big == std::vector<int32_t>{3});
  copy = moved;
  moved = SmallVector<int32_t, 4>{1, 2};
  CHECK(copy == same);
  CHECK(moved == std::vector<int32_t>{1, 2});
  moved.reserve(64);
  CHECK(moved.capacity() >= 64);
  CHECK(moved == std::vector<int32_t>{1, 2});
  CHECK_THROWS_AS(moved.at(2), std::out_of_range);
}
