// The stepcast executable.
#include "commands.hpp"

int main(int argc, char** argv) { return stepcast::cli::stepcast_main(argc, argv); }
