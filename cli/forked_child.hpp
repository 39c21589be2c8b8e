// One answer line computed in a forked child process: simulate's reference simulations (the
// dp_size = 1 plan for scaling efficiency, the uniform topology for the straggler cost) run beside
// the parent's own simulation, since a process holds one SimGrid engine. The child shares the
// parent's parsed inputs, so it reads no file and writes none.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

namespace stepcast::cli {

class ForkedChild {
 public:
  // Forks; the child runs `work` and answers its line on a pipe. Call before this process creates
  // its SimGrid engine or starts a thread. `what` names the child in messages.
  ForkedChild(const std::function<std::string()>& work, std::string what);
  ~ForkedChild();  // stops and reaps a child not waited for
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  // Waits for the child: its line "ok VALUE" gives VALUE; "input MESSAGE" throws InputError
  // (bad input the child found: the command exits 2), "error MESSAGE", or no line,
  // std::runtime_error naming `what`.
  double value();
  // The same, VALUE as the child wrote it (one line of text: a JSON object, say).
  std::string text();

 private:
  std::string what_;
  pid_t pid_ = -1;
  int from_child_ = -1;  // the read end of the child's pipe
};

// Lowers the calling thread's scheduling priority (nice + 5; best effort): for work beside the
// command's own (a reference child, the program's hash) that is needed only at its end, so that
// on a machine of few cores it waits for a core rather than slowing the simulation it runs beside.
void run_behind_main_work();

}  // namespace stepcast::cli
