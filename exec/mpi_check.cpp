// check_mpi of mpi_check.hpp.
#include "mpi_check.hpp"

#include <mpi.h>

#include <string>

#include "errors.hpp"

namespace stepcast {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(code, text, &length);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // unchecked: already on the way out
  std::string what(call);
  what = what.substr(0, what.find('('));
  write_stderr_line("stepcast: rank " + std::to_string(rank) + ": " + what +
                    " failed: " + std::string(text, size_t(length)) + "\n");
  MPI_Abort(MPI_COMM_WORLD, 3);
}

}  // namespace stepcast
