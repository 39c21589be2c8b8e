// A value computed in a forked child; see forked_child.hpp. The child answers on a pipe with one
// line: "ok VALUE", "input MESSAGE" or "error MESSAGE".
#include "forked_child.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "errors.hpp"

namespace stepcast::cli {

ForkedChild::ForkedChild(const std::function<std::string()>& work, std::string what)
    : what_(std::move(what)) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::cout.flush();
  std::cerr.flush();
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    close(fds[0]);
    std::string answer = work() + "\n";
    for (size_t written = 0; written < answer.size();) {
      ssize_t n = write(fds[1], answer.data() + written, answer.size() - written);
      if (n <= 0) break;
      written += size_t(n);
    }
    _exit(0);  // no destructors, no flushing of the parent's buffers
  }
  close(fds[1]);
  from_child_ = fds[0];
}

ForkedChild::~ForkedChild() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (from_child_ >= 0) close(from_child_);
}

double ForkedChild::value() { return std::stod(text()); }

std::string ForkedChild::text() {
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = read(from_child_, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) answer.append(buffer, size_t(n));
  }
  close(from_child_);
  from_child_ = -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (!answer.empty() && answer.back() == '\n') answer.pop_back();
  if (answer.rfind("ok ", 0) == 0) return answer.substr(3);
  if (answer.rfind("input ", 0) == 0) throw InputError(answer.substr(6));
  if (answer.rfind("error ", 0) == 0) throw std::runtime_error(what_ + " failed: " + answer.substr(6));
  std::ostringstream why;
  why << what_ << " failed: its process ended without an answer ("
      << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                              : "exit " + std::to_string(WEXITSTATUS(status)))
      << ")";
  throw std::runtime_error(why.str());
}

void run_behind_main_work() {
  const id_t thread = id_t(syscall(SYS_gettid));  // Linux: each thread has its own nice value
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, thread);
  if (errno == 0) setpriority(PRIO_PROCESS, thread, std::min(nice + 5, 19));
}

}  // namespace stepcast::cli
