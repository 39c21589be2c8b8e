// Reading data/published.json; see published_figures.hpp. Every figure is range-checked here so
// the runner and the writers can divide by it.
#include "published_figures.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "errors.hpp"

namespace stepcast::cli {

namespace {

const char* const kNameValid = "letters, digits, '.', '_' and '-' (it names a file)";

// Row names name files under OUT_DIR/inputs; topology and profile names name shipped files.
std::string read_name(ObjectReader& reader, const std::string& key) {
  std::string name = reader.get_string(key);
  bool safe = !name.empty() && name != "." && name != ".." &&
              std::all_of(name.begin(), name.end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
              });
  if (!safe) reader.fail(key, "not usable as a file name", kNameValid);
  return name;
}

// A table: {source, ..., rows: [...]}; the rows array, checked non-empty.
const Json& read_rows(ObjectReader& table, const Json& object, const std::string& what) {
  table.accept("rows");
  const std::string valid = "a non-empty list of " + what;
  if (!table.has("rows")) table.fail("rows", "missing required key", valid);
  const Json& rows = object.at("rows");
  if (!rows.is_array() || rows.empty()) table.fail("rows", "must be a non-empty list", valid);
  return rows;
}

MegatronRow read_megatron_row(ObjectReader& r, const MegatronRow& common) {
  MegatronRow row = common;
  row.name = read_name(r, "name");
  row.params_billion = r.get_number("params_billion", 0, true);
  row.heads = r.get_int("num_attention_heads", 1);
  row.hidden = r.get_int("hidden_size", 1);
  row.layers = r.get_int("num_layers", 1);
  row.tp = r.get_int("tp_size", 1);
  row.pp = r.get_int("pp_size", 1);
  row.gpus = r.get_int("gpus", 1);
  row.batch = r.get_int("global_batch_size", 1);
  row.published_tflops_per_gpu = r.get_number("tflops_per_gpu", 0, true);
  row.micro_batch = r.get_int("micro_batch_size", 1);
  row.layers_per_virtual_stage = r.get_int_or("layers_per_virtual_stage", 1, 0);
  row.ddp_impl = r.get_string("ddp_impl");
  r.finish();
  if (row.gpus % (row.tp * row.pp) != 0) {
    r.fail("gpus", "not a multiple of tp_size · pp_size = " + std::to_string(row.tp * row.pp) +
                       " (dp = gpus / (tp_size · pp_size))",
           "a multiple of " + std::to_string(row.tp * row.pp));
  }
  if (row.ddp_impl != "torch" && row.ddp_impl != "local") {
    r.fail("ddp_impl", "not a Megatron-LM --DDP-impl", "\"torch\" or \"local\"");
  }
  int64_t samples_per_replica = row.batch / row.dp();
  if (samples_per_replica % row.micro_batch != 0) {
    r.fail("micro_batch_size", "does not divide global_batch_size / dp = " +
                                   std::to_string(samples_per_replica) + " samples per replica",
           "a divisor of " + std::to_string(samples_per_replica));
  }
  if (row.layers_per_virtual_stage > 0 &&
      (row.pp == 1 || (row.layers / row.pp) % row.layers_per_virtual_stage != 0)) {
    r.fail("layers_per_virtual_stage",
           row.pp == 1 ? "set on a row without a pipeline (pp_size 1)"
                       : "does not divide the " + std::to_string(row.layers / row.pp) + " layers of a stage",
           "absent, or a divisor of num_layers / pp_size on a pipelined row");
  }
  return row;
}

NcclRow read_nccl_row(ObjectReader& r) {
  NcclRow row;
  row.name = read_name(r, "name");
  row.system = r.get_string("system");
  row.source = r.get_string("source");
  row.topology = read_name(r, "topology");
  row.profile = read_name(r, "profile");
  row.nodes = r.get_int("nodes", 1);
  // Absent: the topology's.
  row.devices_per_node = r.get_optional_int("devices_per_node", 1).value_or(0);
  row.nics_per_node = r.get_optional_int("nics_per_node", 1).value_or(0);
  row.bytes = r.get_number("bytes", 0, true);
  row.bytes_note = r.get_string("bytes_note");
  row.published_busbw_bytes_per_s = r.get_number("busbw_bytes_per_s", 0, true);
  // Absent: the row is a prediction and counts in the mean.
  row.excluded = r.get_string_or("excluded", "");
  r.finish();
  return row;
}

}  // namespace

PublishedFigures parse_published_figures(const Json& json, const std::string& file) {
  ObjectReader top(json, file);
  PublishedFigures figures;
  figures.file = file;
  const std::string version = std::to_string(kPublishedFiguresFormatVersion);
  if (top.get_int("format_version", 0) != kPublishedFiguresFormatVersion) {
    top.fail("format_version", "not a version this stepcast reads", version);
  }
  top.accept("notes");

  ObjectReader table = top.get_object("megatron_sc21_table1");
  const Json& table_json = json.at("megatron_sc21_table1");
  figures.megatron_source = table.get_string("source");
  figures.megatron_launch_source = table.get_string("launch_source");
  MegatronRow common;
  common.vocab_size = table.get_int("vocab_size", 1);
  common.seq_length = table.get_int("seq_length", 1);
  common.gpus_per_node = table.get_int("gpus_per_node", 1);
  const Json& megatron_rows = read_rows(table, table_json, "Table 1 rows");
  table.finish();
  for (size_t i = 0; i < megatron_rows.size(); ++i) {
    ObjectReader r(megatron_rows[i], file, "megatron_sc21_table1.rows[" + std::to_string(i) + "].");
    figures.megatron.push_back(read_megatron_row(r, common));
  }

  ObjectReader nccl = top.get_object("nccl_tests_all_reduce");
  const Json& nccl_json = json.at("nccl_tests_all_reduce");
  figures.nccl_source = nccl.get_string("source");
  const Json& nccl_rows = read_rows(nccl, nccl_json, "nccl-tests rows");
  nccl.finish();
  for (size_t i = 0; i < nccl_rows.size(); ++i) {
    ObjectReader r(nccl_rows[i], file, "nccl_tests_all_reduce.rows[" + std::to_string(i) + "].");
    figures.nccl.push_back(read_nccl_row(r));
  }
  top.finish();

  // Rows are selected by name (--rows): one name, one row, across both tables.
  std::set<std::string> names;
  auto check_unique = [&](const std::string& name, const std::string& key) {
    if (!names.insert(name).second) {
      throw_input_error(file, key, "\"" + name + "\"", "duplicate: another row has this name",
                        "a name unique across both tables");
    }
  };
  for (size_t i = 0; i < figures.megatron.size(); ++i) {
    check_unique(figures.megatron[i].name, "megatron_sc21_table1.rows[" + std::to_string(i) + "].name");
  }
  for (size_t i = 0; i < figures.nccl.size(); ++i) {
    check_unique(figures.nccl[i].name, "nccl_tests_all_reduce.rows[" + std::to_string(i) + "].name");
  }
  return figures;
}

PublishedFigures load_published_figures(const std::string& path) {
  return parse_published_figures(load_json_file(path), path);
}

}  // namespace stepcast::cli
