// Standard tools' outputs as profile inputs (`stepcast profile import`): nccl-tests logs
// (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, sendrecv_perf) and a
// GEMM sweep CSV, read strictly and merged into a device profile's measured tables.
//
// nccl-tests: the collective comes from the log (its "# Collective test starting: X_perf" line or
// the X_perf command it echoes) or from the caller (KIND:FILE); the two must agree, and so must
// the table (all_gather, reduce_scatter and alltoall rows count size / type / ranks elements,
// all_reduce and sendrecv size / type). Ranks and nodes come from the "#  Rank  r ... on HOST
// device" lines; the out-of-place time of each row is kept. A log without its table, with a cut
// row, or without nccl-tests' closing "Avg bus bandwidth" line is refused as truncated.
//
// GEMM CSV: a header naming m, n, k, layout (forward, dgrad, wgrad, or NN, NT, TN in cuBLAS's
// column-major terms: forward = TN, dgrad = NN, wgrad = NT), dtype, and seconds or tflops;
// optional count and source columns.
#pragma once

#include <string>
#include <vector>

#include "profile.hpp"

namespace stepcast {

struct NcclTestsLog {
  std::string file;
  std::string collective;  // all_reduce, all_gather, reduce_scatter, all_to_all, sendrecv
  int64_t ranks = 0;
  int64_t nodes = 0;
  std::string nccl_version;  // "2.19.3", from the log's header; empty when it says none
  // NCCL's "N coll channels" (NCCL_DEBUG=INFO): the CTAs, one an SM, its collective kernels
  // launch; 0 when the log does not say (the most any rank printed).
  int64_t coll_channels = 0;
  std::vector<CollectivePoint> points;  // sendrecv: as collectives of kind "sendrecv"
  int run = 0;  // in a file of several runs, which (1, 2, …); 0 where the file holds one
};

// `expected`: the collective the caller names (KIND of KIND:FILE), or empty to take the log's.
NcclTestsLog parse_nccl_tests_log(const std::string& text, const std::string& file,
                                  const std::string& expected = "");
// A file of one or more runs, one after another (as scripts that run every *_perf binary write
// them: each run's lines from its version, "# Collective test starting" or "# nThread" line, or
// its echoed command, after the previous run's "Avg bus bandwidth"); each run as
// parse_nccl_tests_log reads it. Two runs of one collective on one span are refused.
std::vector<NcclTestsLog> parse_nccl_tests_logs(const std::string& text, const std::string& file,
                                                const std::string& expected = "");

struct GemmCsv {
  std::string file;
  Dtype dtype = Dtype::bf16;
  std::vector<GemmPoint> points;  // sorted as profiles keep them
  bool grid = false;              // every variant's (m, n, k) a full grid: interpolate it
};
GemmCsv parse_gemm_csv(const std::string& text, const std::string& file);

// `base` with the imported tables: a log replaces the base's table of the same collective, group
// size and nodes; the GEMM points replace the base's GEMM points (a table, or evidence to fit
// with `profile fit`). Each import is a source named after its file. Refuses (InputError) tables
// of another dtype than the base's measured ones. A collective log's coll_channels set the
// base's overlap CTAs (inside a node for a one-node log, across nodes otherwise; the most of
// the logs of a span) where the base gives the device's SMs (overlap.sms); `unused` gets a line
// for each log whose channels could not be used.
DeviceProfile merge_imports(DeviceProfile base, const std::vector<NcclTestsLog>& logs,
                            const GemmCsv* gemm, std::vector<std::string>* unused);

}  // namespace stepcast
