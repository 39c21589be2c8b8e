// Number formatting shared by the validate report writers (Markdown, HTML, progress lines):
// seconds with a unit chosen by magnitude, signed percentages, "n/a" for missing figures; the
// memory classes the writers list.
#pragma once

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace stepcast::validate_format {

inline std::string seconds(std::optional<double> s) {
  if (!s) return "n/a";
  char buf[32];
  double a = std::abs(*s);
  if (a != 0 && a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f µs", *s * 1e6);
  else if (a < 1)
    std::snprintf(buf, sizeof buf, "%.3f ms", *s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", *s);
  return buf;
}

inline std::string percent(std::optional<double> v, bool sign = true) {
  if (!v) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, sign ? "%+.1f%%" : "%.1f%%", *v * 100);
  return buf;
}

// The memory classes of a validate row: the row keys of the predicted bytes and their names.
inline constexpr const char* kClassKeys[] = {"memory_weights_bytes",   "memory_grads_bytes",
                                             "memory_optimizer_bytes", "memory_activations_bytes",
                                             "memory_workspace_bytes", "memory_comm_bytes",
                                             "memory_placement_bytes"};
inline constexpr const char* kClassNames[] = {"weights",   "grads", "optimizer", "activations",
                                              "workspace", "comm",  "placement"};

inline std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace stepcast::validate_format
