// How far a program being lowered is, for a reader on another thread that follows it: the
// program's hash (program_json.hpp) is written role by role while the later roles are still
// being lowered, instead of after the whole program (a 1T-parameter plan's 64 roles take
// seconds to lower and as long again to hash). The lowering (lower.hpp's lower_program_into)
// publishes the header (every field but the roles' ops, and the final role count) and then each
// role as it completes; a reader waits for what it reads next. A lowering that throws fails the
// progress, and the waiting reader returns false.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace stepcast {

class ProgramProgress {
 public:
  void header_ready() { update([&] { header_ = true; }); }
  void roles_done(size_t count) { update([&] { roles_ = count; }); }
  void fail() { update([&] { failed_ = true; }); }

  // Waits until the header and roles [0, count) are complete; false if the lowering failed.
  bool wait_for(size_t count) const {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return failed_ || (header_ && roles_ >= count); });
    return !failed_;
  }

 private:
  template <class F>
  void update(F change) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      change();
    }
    changed_.notify_all();
  }
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool header_ = false, failed_ = false;
  size_t roles_ = 0;
};

}  // namespace stepcast
