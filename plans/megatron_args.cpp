// The flags of a Megatron-LM launch line or script; see megatron_import.hpp.
// A small shell reader, not a shell: words split on blanks outside quotes, '\' line continuations,
// '#' comments, `NAME=value` assignments (also after export/local/declare) and $NAME / ${NAME} /
// ${NAME:-default} substituted where assigned before; arrays (`ARGS=( --a 1 )`) are read in place,
// so their flags count once wherever "${ARGS[@]}" expands them. Anything else ($(...), $((...)),
// variables never assigned) stays as written, and the importer refuses a value holding '$'.
#include <cctype>
#include <map>
#include <set>

#include "errors.hpp"
#include "megatron_import.hpp"

namespace stepcast {

namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

struct Word {
  std::string text;
  bool quoted = false;        // had quotes: never a separator or an assignment
  bool command_start = false; // first word of a command (after a newline, ';', '&&', '|', '(')
};

class ShellReader {
 public:
  explicit ShellReader(const std::string& text) : text_(text) {}

  std::vector<Word> words() {
    std::vector<Word> out;
    bool command_start = true;
    while (skip_blanks(command_start), i_ < text_.size()) {
      char c = text_[i_];
      if (c == '#') {  // a comment to the end of the line
        while (i_ < text_.size() && text_[i_] != '\n') ++i_;
        continue;
      }
      if (c == ';' || c == '|' || c == '&' || c == '(' || c == ')') {
        ++i_;
        out.push_back({std::string(1, c), false, false});
        command_start = true;
        continue;
      }
      Word w = word();
      w.command_start = command_start;
      command_start = false;
      if (!w.quoted && assign(w, out, command_start)) continue;
      out.push_back(w);
    }
    return out;
  }

 private:
  void skip_blanks(bool& command_start) {
    while (i_ < text_.size()) {
      if (text_[i_] == '\\' && i_ + 1 < text_.size() && (text_[i_ + 1] == '\n' || text_[i_ + 1] == '\r')) {
        i_ += text_[i_ + 1] == '\r' && i_ + 2 < text_.size() && text_[i_ + 2] == '\n' ? 3 : 2;
      } else if (text_[i_] == '\n') {
        command_start = true;
        ++i_;
      } else if (std::isspace(static_cast<unsigned char>(text_[i_]))) {
        ++i_;
      } else {
        break;
      }
    }
  }

  // NAME=value at a command's start: remembered, not a word. NAME=( starts an array, read in place.
  bool assign(const Word& w, std::vector<Word>& out, bool& command_start) {
    static const std::set<std::string> keywords = {"export", "local", "declare", "readonly"};
    bool after_keyword = !out.empty() && keywords.count(out.back().text) && out.back().command_start;
    if (!(w.command_start || after_keyword)) return false;
    size_t eq = w.text.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    for (size_t k = 0; k < eq; ++k) {
      if (!is_name_char(w.text[k]) || (k == 0 && std::isdigit(static_cast<unsigned char>(w.text[k])))) return false;
    }
    if (after_keyword) out.pop_back();
    vars_[w.text.substr(0, eq)] = w.text.substr(eq + 1);
    command_start = true;  // NAME=value cmd ...: the command follows
    return true;
  }

  Word word() {
    Word w;
    while (i_ < text_.size()) {
      char c = text_[i_];
      if (std::isspace(static_cast<unsigned char>(c)) || c == ';' || c == '|' || c == '&' || c == ')' ||
          (c == '(' && w.text.empty())) {
        break;
      }
      if (c == '(') {  // NAME=( : an array; its words follow as words
        ++i_;
        break;
      }
      if (c == '\\' && i_ + 1 < text_.size()) {
        if (text_[i_ + 1] == '\n') {
          i_ += 2;
          break;
        }
        w.text += text_[i_ + 1];
        i_ += 2;
      } else if (c == '\'') {
        w.quoted = true;
        size_t end = text_.find('\'', i_ + 1);
        if (end == std::string::npos) end = text_.size();
        w.text += text_.substr(i_ + 1, end - i_ - 1);
        i_ = std::min(end + 1, text_.size());
      } else if (c == '"') {
        w.quoted = true;
        ++i_;
        while (i_ < text_.size() && text_[i_] != '"') {
          if (text_[i_] == '\\' && i_ + 1 < text_.size() && std::string("\"\\$`").find(text_[i_ + 1]) != std::string::npos) {
            w.text += text_[i_ + 1];
            i_ += 2;
          } else if (text_[i_] == '$') {
            w.text += dollar();
          } else {
            w.text += text_[i_++];
          }
        }
        ++i_;
      } else if (c == '$') {
        w.text += dollar();
      } else {
        w.text += c;
        ++i_;
      }
    }
    return w;
  }

  // $NAME, ${NAME}, ${NAME:-default} when NAME was assigned (or has a default); else as written.
  std::string dollar() {
    size_t start = i_++;
    std::string name, fallback;
    bool has_fallback = false;
    if (i_ < text_.size() && text_[i_] == '{') {
      size_t end = text_.find('}', i_);
      if (end == std::string::npos) end = text_.size();
      std::string inner = text_.substr(i_ + 1, end - i_ - 1);
      i_ = std::min(end + 1, text_.size());
      size_t dash = inner.find(":-");
      name = inner.substr(0, dash);
      if (dash != std::string::npos) {
        has_fallback = true;
        fallback = inner.substr(dash + 2);
      }
    } else {
      while (i_ < text_.size() && is_name_char(text_[i_])) name += text_[i_++];
    }
    auto it = vars_.find(name);
    if (it != vars_.end() && name.find('[') == std::string::npos) return it->second;
    if (has_fallback) return fallback;
    return text_.substr(start, i_ - start);
  }

  const std::string& text_;
  size_t i_ = 0;
  std::map<std::string, std::string> vars_;
};

// Launchers' own flags (torchrun, python -m torch.distributed.run, srun, mpirun, deepspeed).
bool launcher_flag(const std::string& name) {
  static const std::set<std::string> names = {
      "nproc_per_node", "nproc-per-node", "nnodes", "node_rank", "node-rank", "master_addr",
      "master-addr", "master_port", "master-port", "rdzv_id", "rdzv-id", "rdzv_backend",
      "rdzv-backend", "rdzv_endpoint", "rdzv-endpoint", "rdzv_conf", "standalone", "max_restarts",
      "max-restarts", "nodes", "ntasks-per-node", "ntasks", "gpus-per-node", "cpus-per-task",
      "num_gpus", "num_nodes", "hostfile", "np", "bind-to", "map-by", "no-python", "log_dir",
      "log-dir", "redirects", "tee", "role", "run_path", "run-path", "module", "monitor_interval"};
  return names.count(name) > 0;
}

bool takes_no_value(const Word& w) {
  const std::string& t = w.text;
  // An array's expansion ("${ARGS[@]}"): its flags were read where it was assigned.
  if (t == "$@" || t == "$*" || t.find("[@]}") != std::string::npos || t.find("[*]}") != std::string::npos) return true;
  if (w.quoted) return false;
  if (t == ";" || t == "|" || t == "&" || t == "(" || t == ")" || t.empty()) return true;
  if (t.size() > 3 && t.compare(t.size() - 3, 3, ".py") == 0) return true;
  if (t[0] == '-') return !(t.size() > 1 && (std::isdigit(static_cast<unsigned char>(t[1])) || t[1] == '.'));
  return false;
}

}  // namespace

std::vector<MegatronFlag> read_megatron_flags(const std::string& text, const std::string& source) {
  std::vector<Word> words = ShellReader(text).words();
  std::vector<MegatronFlag> flags;
  for (size_t k = 0; k < words.size(); ++k) {
    const Word& w = words[k];
    if (w.quoted || w.text.rfind("--", 0) != 0 || w.text.size() < 3) continue;
    MegatronFlag flag;
    flag.name = w.text.substr(2);
    bool has_value = false;
    if (size_t eq = flag.name.find('='); eq != std::string::npos) {
      flag.value = flag.name.substr(eq + 1);
      flag.name = flag.name.substr(0, eq);
      has_value = true;
    } else if (k + 1 < words.size() && !takes_no_value(words[k + 1])) {
      flag.value = words[++k].text;
      has_value = true;
    }
    flag.launcher = launcher_flag(flag.name);
    if (has_value && flag.value.empty() && !flag.launcher) {
      throw InputError(source + ": flag '--" + printable_excerpt(flag.name) +
                       "' has an empty value; valid: --NAME VALUE or --NAME=VALUE");
    }
    flags.push_back(flag);
  }
  return flags;
}

}  // namespace stepcast
