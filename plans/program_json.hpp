// The StepProgram's JSON text and its identity. The text is canonical (fixed key order, numbers
// printed the same way every time), and program_sha256 is the SHA-256 of the text that precedes
// the "program_sha256" key: the resolved inputs, the rank grid and every role's ops. The
// generator's version and commit follow the hash and are not part of it.
// Format version 2 (StepProgram::kSchemaVersion): every op's inputs and outputs are lists of
// operands {"slot", "buffer", "dtype", "shape"}, slots named by the op's signature
// (op_signature.hpp), dtype and shape those of the buffer's alloc; version 1 (plain buffer
// names) is refused with how to regenerate it.
#pragma once

#include <ostream>
#include <string>

#include "program.hpp"
#include "program_progress.hpp"

namespace stepcast {

// Writes program.json to `out` (or only hashes it when `out` is null) and returns the hash.
// With `progress`, `program` is still being lowered on another thread (lower_program_into): each
// part is written once it is complete; InputError if the lowering failed.
std::string write_program_json(const StepProgram& program, std::ostream* out,
                               const ProgramProgress* progress = nullptr);
// Fills program.program_sha256 without writing anything.
void hash_program(StepProgram& program);
// Reads a program.json written by write_program_json; checks its hash (InputError if the file
// was altered or truncated), its version, and every operand against its slot and its alloc.
StepProgram read_program_json(const std::string& path);
// The same for text in memory; `path` only names it in messages.
StepProgram parse_program_json_text(const std::string& text, const std::string& path);

}  // namespace stepcast
