// `stepcast compare PREDICTION MEASUREMENT`: loads a prediction.json and a measurement.json of one
// StepProgram, joins them (reports/compare.hpp), prints the summary and writes compare.json and
// compare.md.
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "compare.hpp"
#include "errors.hpp"
#include "inputs.hpp"
#include "program_json.hpp"

namespace stepcast::cli {

namespace {
const char* const kUsage =
    "usage: stepcast compare PREDICTION MEASUREMENT [--program FILE] [--out DIR]";
}  // namespace

int run_compare(int argc, char** argv) {
  po::options_description options("stepcast compare options");
  options.add_options()(
      "program", po::value<std::string>(),
      "the pair's program.json (`stepcast lower`); default: lowered again from the prediction's "
      "resolved inputs")("out", po::value<std::string>(),
                         "write DIR/compare.json and DIR/compare.md")("help,h", "show this help");
  po::options_description files;
  files.add_options()("prediction", po::value<std::string>(), "prediction.json")(
      "measurement", po::value<std::string>(), "measurement.json");
  po::options_description all;
  all.add(options).add(files);
  po::positional_options_description positional;
  positional.add("prediction", 1).add("measurement", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    if (vm.count("help")) {
      std::cout << kUsage
                << "\n"
                   "Joins a prediction (prediction.json of `stepcast simulate`) and a measurement\n"
                   "(measurement.json of `stepcast run`) of the same program on (rank, id):\n"
                   "step-time and breakdown error, memory error by class, per-op-kind and\n"
                   "per-collective error, and the ops that contribute most to the gap.\n\n"
                << options << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string("command line: ") + e.what() + " (" + kUsage + ")");
  }
  if (!vm.count("measurement")) {
    throw InputError(std::string("command line: compare takes two files, a prediction and a "
                                 "measurement (") +
                     kUsage + ")");
  }
  claim_out_option(vm, "compare");
  std::string prediction_file = vm["prediction"].as<std::string>();
  std::string measurement_file = vm["measurement"].as<std::string>();
  StepResult prediction = step_result_from_json(load_json_file(prediction_file), prediction_file);
  StepResult measurement =
      step_result_from_json(load_json_file(measurement_file), measurement_file);
  check_comparable(prediction, measurement, prediction_file, measurement_file);
  StepProgram program = vm.count("program") ? read_program_json(vm["program"].as<std::string>())
                                            : program_from_inputs(prediction, prediction_file);
  CompareResult result = compare_results(prediction, measurement, program);

  print_compare_summary(std::cout, result);
  if (vm.count("out")) {
    std::string dir = vm["out"].as<std::string>();
    Json json = compare_to_json(result);
    json["prediction_file"] = prediction_file;
    json["measurement_file"] = measurement_file;
    write_output_file(dir, "compare.json", json.dump(2) + "\n");
    std::ostringstream markdown;
    write_compare_markdown(markdown, result);
    write_output_file(dir, "compare.md", markdown.str());
    std::cout << "wrote " << dir << "/compare.json and " << dir << "/compare.md\n";
  }
  return 0;
}

}  // namespace stepcast::cli
