// with_mpi of mpi_main.hpp.
#include "mpi_main.hpp"

#include <mpi.h>

#include <iostream>

#include "errors.hpp"

namespace stepcast::cli {

int with_mpi(const std::string& command, int argc, char** argv,
             const std::function<int(int rank, int size)>& body) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = 0;
  try {
    code = body(rank, size);
  } catch (const InputError& e) {
    std::cerr << "stepcast " << command << ": rank " << rank << ": error: " << e.what() << "\n";
    code = kInputErrorExitCode;
  } catch (const std::exception& e) {
    std::cerr << "stepcast " << command << ": rank " << rank << ": internal error: " << e.what()
              << "\n";
    code = 3;
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace stepcast::cli
