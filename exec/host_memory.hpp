// The process's memory as the kernel counts it, for the measured peak of host backends
// (executor.cpp): /proc/self/status fields, the exact anonymous bytes, the high-water reset.
#pragma once

namespace stepcast {

// A "Field:" of /proc/self/status (VmRSS:, VmHWM:, RssFile:, RssShmem:) in bytes; 0 when absent.
double resident_bytes(const char* field);
// The process's anonymous memory, exactly: smaps_rollup walks the page tables. (VmRSS and VmHWM
// in /proc/self/status come from per-CPU counters that may lag by tens of pages: on this
// machine's kernel a 4 MiB step's high-water mark varied by 0–110 KB from run to run.)
double exact_anonymous_bytes();
// VmHWM := VmRSS (Linux ≥ 4.0: "5" to clear_refs resets the resident high-water mark).
void reset_peak_resident_bytes();

}  // namespace stepcast
