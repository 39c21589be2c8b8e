// Running a command inside MPI (`run`, `profile`): errors on any rank reach the user once, from
// the rank that hit them, and every rank ends with the worst exit code.
#pragma once

#include <functional>
#include <string>

namespace stepcast::cli {

int with_mpi(const std::string& command, int argc, char** argv,
             const std::function<int(int rank, int size)>& body);

}  // namespace stepcast::cli
