// hetflow calibrate --measured FILE: a table of runs (a plan file, or simulate's plan options)
// with their measured seconds per iteration, fitted by sim/step_calibration.hpp; prints each
// parameter with its uncertainty, the cross-validated error and the warnings, and writes
// the calibration. Three steps: read the table and plan its runs, fit, report.
#include "tools/calibrate_measured.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "model/error.hpp"
#include "model/units.hpp"
#include "tools/plan_options.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

// One row of the table: where it is, and either a plan file or plan options.
struct Row {
  int line = 0;
  std::string plan, cluster, model, options;
  std::string step_s;
};

// Splits one CSV line; a field in double quotes may hold commas ("" is a quote).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  for (std::string& f : out) {
    const size_t a = f.find_first_not_of(" \t"), b = f.find_last_not_of(" \t");
    f = a == std::string::npos ? "" : f.substr(a, b - a + 1);
  }
  return out;
}

constexpr const char* kColumns = "plan, cluster, model, options, step_s";

std::vector<Row> read_csv(const std::string& path, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> header;
  std::vector<Row> rows;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || line.rfind('#', 0) == 0) continue;
    const std::vector<std::string> fields = csv_fields(line);
    if (header.empty()) {
      header = fields;
      for (const std::string& h : header) {
        if (h != "plan" && h != "cluster" && h != "model" && h != "options" && h != "step_s") {
          throw InputError(path, n, h, std::string("unknown column; expected columns: ") + kColumns);
        }
      }
      continue;
    }
    if (fields.size() != header.size()) {
      throw InputError(path, n, "row", "expected " + std::to_string(header.size()) + " fields as the header, found " +
                                           std::to_string(fields.size()));
    }
    Row r;
    r.line = n;
    for (size_t i = 0; i < fields.size(); ++i) {
      std::string* field = header[i] == "plan" ? &r.plan : header[i] == "cluster" ? &r.cluster : header[i] == "model" ? &r.model
                         : header[i] == "options"                                  ? &r.options
                                                                                   : &r.step_s;
      *field = fields[i];
    }
    rows.push_back(r);
  }
  return rows;
}

// runs: [{plan: p.json, step_s: 1.2}, {cluster: C, model: M, options: "--pipeline 2", step_s: 0.8}]
std::vector<Row> read_yaml(const std::string& path, const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(path, e.mark.line + 1, "yaml", e.msg);
  }
  const YAML::Node runs = root.IsMap() ? root["runs"] : YAML::Node();
  if (!runs || !runs.IsSequence()) throw InputError(path, 1, "runs", "expected a list of runs");
  std::vector<Row> rows;
  for (const YAML::Node& run : runs) {
    Row r;
    r.line = run.Mark().line + 1;
    if (!run.IsMap()) throw InputError(path, r.line, "runs", std::string("expected a mapping with ") + kColumns);
    for (const auto& kv : run) {
      const std::string key = kv.first.as<std::string>();
      if (key != "plan" && key != "cluster" && key != "model" && key != "options" && key != "step_s") {
        throw InputError(path, kv.first.Mark().line + 1, key, std::string("unknown field; expected ") + kColumns);
      }
      (key == "plan" ? r.plan : key == "cluster" ? r.cluster : key == "model" ? r.model : key == "options" ? r.options : r.step_s) =
          kv.second.as<std::string>();
    }
    rows.push_back(r);
  }
  return rows;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

sim::StepRun plan_row(const std::string& path, const Row& r, std::ostream& out, bool need_times) {
  sim::StepRun run;
  run.name = path + ":" + std::to_string(r.line);
  if (!need_times && r.step_s.empty()) {
    // A candidate not measured yet.
  } else try {
    size_t used = 0;
    run.measured_s = std::stod(r.step_s, &used);
    if (used != r.step_s.size()) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw InputError(path, r.line, "step_s", "expected the measured seconds per iteration, found '" + r.step_s + "'");
  }
  if ((need_times || !r.step_s.empty()) && (!(run.measured_s > 0) || !std::isfinite(run.measured_s))) {
    throw InputError(path, r.line, "step_s", "expected a positive number of seconds, found '" + r.step_s + "'");
  }
  if (!r.plan.empty()) {
    if (!r.cluster.empty() || !r.model.empty() || !r.options.empty()) {
      throw InputError(path, r.line, "plan", "a plan file stands alone: give either plan or cluster/model/options");
    }
    std::filesystem::path p(r.plan);
    if (p.is_relative()) p = std::filesystem::path(path).parent_path() / p;
    run.plan = read_plan_file(p.string(), "plan");
    return run;
  }
  std::vector<std::string> args = words(r.options);
  if (!r.cluster.empty()) args.insert(args.end(), {"--cluster", r.cluster});
  if (!r.model.empty()) args.insert(args.end(), {"--model", r.model});
  bool iterations = false;
  for (const std::string& a : args) iterations = iterations || a.rfind("--iterations", 0) == 0;
  if (!iterations) args.insert(args.end(), {"--iterations", "2"});  // the second timed
  try {
    po::options_description options("run options");
    po::variables_map vm;
    parse_command_options("simulate", args, options, vm, out);
    Planned planned = plan_from_options(vm);
    require_valid_or_advise(planned.plan, vm);
    run.plan = std::move(planned.plan);
  } catch (const Error& e) {
    throw InputError(path, r.line, "options", e.what());
  }
  return run;
}

std::vector<Row> read_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, 0, "file", "cannot be read (no such file?)");
  std::ostringstream text;
  text << in.rdbuf();
  const bool yaml = path.ends_with(".yaml") || path.ends_with(".yml");
  std::vector<Row> rows = yaml ? read_yaml(path, text.str()) : read_csv(path, text.str());
  if (rows.empty()) throw InputError(path, 0, "runs", "expected at least one run");
  return rows;
}

std::string csv_quoted(const std::string& field) {
  if (field.find_first_of(",\"") == std::string::npos) return field;
  std::string q = "\"";
  for (char c : field) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::vector<sim::StepRun> read_measured_runs(const std::string& path, std::ostream& out, bool need_times) {
  std::vector<sim::StepRun> runs;
  for (const Row& r : read_rows(path)) runs.push_back(plan_row(path, r, out, need_times));
  return runs;
}

void write_runs_table(const std::string& path, const std::vector<size_t>& chosen, const std::string& out_path) {
  const std::vector<Row> rows = read_rows(path);
  std::ostringstream s;
  s << "# chosen by hetflow calibrate --design from " << path << " (its lines";
  for (size_t i : chosen) s << " " << rows.at(i).line;
  s << "); fill in step_s, the measured seconds per iteration\nplan,cluster,model,options,step_s\n";
  for (size_t i : chosen) {
    const Row& r = rows.at(i);
    std::filesystem::path plan(r.plan);
    // A plan file relative to the table stays found from the new table's folder.
    if (!r.plan.empty() && plan.is_relative()) plan = std::filesystem::absolute(std::filesystem::path(path).parent_path() / plan);
    s << csv_quoted(r.plan.empty() ? "" : plan.string()) << "," << csv_quoted(r.cluster) << "," << csv_quoted(r.model) << ","
      << csv_quoted(r.options) << "," << csv_quoted(r.step_s) << "\n";
  }
  std::ofstream f(out_path);
  if (!(f << s.str())) throw InputError(out_path, 0, "--out", "cannot be written");
}

namespace {

std::string value_text(const sim::StepParameter& p, double v) {
  if (p.kind == sim::StepParameterKind::overhead) return u::human_time_s(v);
  std::ostringstream s;
  s << std::setprecision(4) << v;
  return s.str();
}

std::string percent(double fraction, int precision = 2) {
  if (!std::isfinite(fraction)) return "unbounded";
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << 100 * fraction << " %";
  return s.str();
}

std::string seconds(double s) {
  std::ostringstream o;
  o << std::setprecision(4) << s;
  return o.str();
}

}  // namespace

void print_step_fit(std::ostream& out, const sim::StepFit& fit, const std::vector<sim::StepRun>& runs, bool simulated) {
  out << "calibrated from " << runs.size() << " runs' step times (robust least squares through "
      << (simulated ? "the simulator" : "the estimate") << "; " << fit.evaluations << " evaluations)\n\n";
  out << "  " << std::left << std::setw(28) << "parameter" << std::right << std::setw(12) << "prior" << std::setw(12)
      << "fitted" << std::setw(12) << "+/-" << "\n";
  for (const sim::StepParameter& p : fit.parameters) {
    out << "  " << std::left << std::setw(28) << p.name << std::right << std::setw(12) << value_text(p, p.prior)
        << std::setw(12) << value_text(p, p.value) << std::setw(12) << percent(p.relative_error, 1)
        << (p.at_bound ? "   at bound" : "") << "\n";
  }
  if (!fit.not_fitted.empty()) {
    out << "  not determined by these runs (the prior's kept):";
    for (const std::string& n : fit.not_fitted) out << " " << n;
    out << "\n";
  }
  out << "\n  " << std::left << std::setw(30) << "run" << std::right << std::setw(12) << "measured s" << std::setw(12)
      << "fitted s" << std::setw(10) << "error";
  if (fit.folds > 0) out << std::setw(14) << "held out s" << std::setw(10) << "error";
  out << "\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    out << "  " << std::left << std::setw(30) << runs[i].name << std::right << std::setw(12) << seconds(runs[i].measured_s)
        << std::setw(12) << seconds(fit.predicted_s[i]) << std::setw(10)
        << percent(fit.predicted_s[i] / runs[i].measured_s - 1);
    if (fit.folds > 0) {
      out << std::setw(14) << seconds(fit.cv_predicted_s[i]) << std::setw(10)
          << percent(fit.cv_predicted_s[i] / runs[i].measured_s - 1);
    }
    out << "\n";
  }
  out << "\nfit: MAPE " << percent(fit.mape) << ", Spearman " << std::fixed << std::setprecision(3) << fit.spearman;
  if (fit.folds > 0) {
    out << "; " << fit.folds << "-fold cross-validated: MAPE " << percent(fit.cv_mape) << ", Spearman " << std::fixed
        << std::setprecision(3) << fit.cv_spearman;
  }
  out << "\n";
  out.unsetf(std::ios::floatfield);
  for (const std::string& w : fit.warnings) out << "warning: " << w << "\n";
}

Json step_fit_json(const sim::StepFit& fit, const std::vector<sim::StepRun>& runs) {
  Json parameters = Json::array(), rows = Json::array();
  for (const sim::StepParameter& p : fit.parameters) {
    parameters.push_back({{"name", p.name},
                          {"prior", p.prior},
                          {"value", p.value},
                          {"relative_error", std::isfinite(p.relative_error) ? Json(p.relative_error) : Json(nullptr)},
                          {"lower", p.lower},
                          {"upper", p.upper},
                          {"at_bound", p.at_bound}});
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    Json r{{"run", runs[i].name}, {"measured_s", runs[i].measured_s}, {"fitted_s", fit.predicted_s[i]},
           {"weight", fit.weights[i]}};
    if (fit.folds > 0) r["cross_validated_s"] = fit.cv_predicted_s[i];
    rows.push_back(r);
  }
  return Json{{"parameters", parameters},
              {"not_fitted", fit.not_fitted},
              {"runs", rows},
              {"mape", fit.mape},
              {"spearman", fit.spearman},
              {"folds", fit.folds},
              {"cv_mape", fit.cv_mape},
              {"cv_spearman", fit.cv_spearman},
              {"evaluations", fit.evaluations},
              {"starts", fit.starts},
              {"confounded", fit.confounded},
              {"warnings", fit.warnings}};
}

void print_step_design(std::ostream& out, const sim::StepDesign& design, const std::vector<sim::StepRun>& runs, double noise) {
  out << "of " << runs.size() << " candidate runs, the " << design.chosen.size()
      << " that determine the parameters best (greedy D-optimal at the prior; " << design.evaluations << " evaluations):\n";
  for (size_t i : design.chosen) out << "  " << runs[i].name << "\n";
  out << "\n  " << std::left << std::setw(28) << "parameter" << std::right << std::setw(12) << "prior" << std::setw(12)
      << "+/-" << "   (what these runs would leave it at, " << percent(noise, 1) << " noise a run)\n";
  for (const sim::StepParameter& p : design.parameters) {
    out << "  " << std::left << std::setw(28) << p.name << std::right << std::setw(12) << value_text(p, p.prior)
        << std::setw(12) << percent(p.relative_error, 1) << "\n";
  }
  for (const std::string& n : design.not_determined) out << "warning: no candidate's time depends on " << n << "\n";
}

Json step_design_json(const sim::StepDesign& design, const std::vector<sim::StepRun>& runs) {
  Json chosen = Json::array(), parameters = Json::array();
  for (size_t i : design.chosen) chosen.push_back({{"run", runs[i].name}, {"index", i}});
  for (const sim::StepParameter& p : design.parameters) {
    parameters.push_back({{"name", p.name}, {"prior", p.prior},
                          {"relative_error", std::isfinite(p.relative_error) ? Json(p.relative_error) : Json(nullptr)}});
  }
  return Json{{"chosen", chosen}, {"parameters", parameters}, {"not_determined", design.not_determined},
              {"evaluations", design.evaluations}};
}

}  // namespace hetflow::tools
