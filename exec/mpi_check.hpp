// Every MPI call of stepcast is checked. with_mpi sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (the
// communicators made from it inherit it), so a failing call returns its error instead of
// aborting inside MPI without naming anything; STEPCAST_MPI(call) then prints the rank, the call
// and MPI's error string on one line and aborts the job (exit 3: a failure of the machinery).
#pragma once

namespace stepcast {

void check_mpi(int code, const char* call);

}  // namespace stepcast

#define STEPCAST_MPI(call) ::stepcast::check_mpi((call), #call)
