// `stepcast completion bash`: the bash completion script (commands from the command table, each
// command's options read from its own --help when completing, so they never drift), and
// `stepcast completion names FOLDER`: the shipped names it offers after --model, --topology,
// --plan and --sweep. Installed as share/bash-completion/completions/stepcast.
#include <iostream>
#include <string>

#include "commands.hpp"
#include "errors.hpp"
#include "inputs.hpp"

namespace stepcast::cli {

namespace {

const char* const kScript = R"SH(# bash completion for stepcast (written by `stepcast completion bash`)
_stepcast_names() {
  COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" completion names "$1" 2>/dev/null)" -- "$cur")
             $(compgen -f -- "$cur"))
}
_stepcast() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "$_stepcast_commands --help --version" -- "$cur"))
    return
  fi
  case "$prev" in
    --model) _stepcast_names models; return ;;
    --topology) _stepcast_names topologies; return ;;
    --plan) _stepcast_names examples; return ;;
    --sweep) _stepcast_names sweeps; return ;;
  esac
  if [[ "$cur" == -* ]]; then
    local options
    options=$("${COMP_WORDS[0]}" "${COMP_WORDS[1]}" --help 2>/dev/null | grep -oE -- '--[a-z0-9][a-z0-9-]*' | sort -u)
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -o filenames -F _stepcast stepcast
)SH";

}  // namespace

int run_completion(int argc, char** argv) {
  const std::string usage =
      "usage: stepcast completion bash            the bash completion script\n"
      "       stepcast completion names FOLDER    the shipped names of models, topologies, examples or sweeps\n"
      "Load it with `source <(stepcast completion bash)`; `cmake --install` puts it in\n"
      "PREFIX/share/bash-completion/completions/stepcast, where bash-completion finds it.";
  std::string what = argc > 1 ? argv[1] : "";
  if (what == "--help" || what == "-h") {
    std::cout << usage << "\n";
    return 0;
  }
  if (what == "bash" && argc == 2) {
    std::cout << "_stepcast_commands=\"";
    const std::vector<std::string> names = command_names();
    for (size_t i = 0; i < names.size(); ++i) std::cout << (i ? " " : "") << names[i];
    std::cout << "\"\n" << kScript;
    return 0;
  }
  if (what == "names" && argc == 3) {
    const std::string folder = argv[2];
    if (folder != "models" && folder != "topologies" && folder != "examples" && folder != "sweeps") {
      throw InputError("command line: completion names '" + printable_excerpt(folder) +
                       "': valid: models, topologies, examples, sweeps");
    }
    for (const auto& name : shipped_names(folder)) std::cout << name << "\n";
    return 0;
  }
  throw InputError("command line: completion '" + printable_excerpt(what) + "': valid: bash, or names FOLDER (see --help)");
}

}  // namespace stepcast::cli
