//===- HtmlReport.cpp - a run's metrics as one self-contained HTML page ----===//
#include "runtime/report/HtmlReport.h"

#include "runtime/schema/OutputFiles.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace hflow::report {

using nlohmann::json;

std::vector<json> readMetricsJsonl(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(path + ": cannot read (" + std::strerror(errno) + ")");
  std::vector<json> rows;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception &e) { // parse errors and number overflow (out_of_range)
      std::string what = e.what();
      if (auto p = what.find("parse error"); p != std::string::npos)
        what = what.substr(p);
      throw std::runtime_error(path + ":" + std::to_string(n) + ": not JSON: " + what);
    }
    if (!j.is_object() || !j.contains("phase") || !j["phase"].is_string() ||
        !j.contains("iteration") || !j["iteration"].is_number())
      throw std::runtime_error(path + ":" + std::to_string(n) +
                               ": not a metrics row (an object with a string \"phase\" and a "
                               "number \"iteration\", as hflow-run --metrics writes)");
    rows.push_back(std::move(j));
  }
  if (rows.empty())
    throw std::runtime_error(path + ": no metrics rows (an empty file: did the run write any "
                                    "iteration?)");
  return rows;
}

namespace {

std::string esc(const std::string &s) {
  std::string o;
  for (char c : s) {
    switch (c) {
    case '&': o += "&amp;"; break;
    case '<': o += "&lt;"; break;
    case '>': o += "&gt;"; break;
    case '"': o += "&quot;"; break;
    default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[64];
  if (v == 0)
    return "0";
  const double a = std::fabs(v);
  if (a >= 1e6 || a < 1e-3)
    std::snprintf(b, sizeof b, "%.3g", v);
  else if (a >= 100)
    std::snprintf(b, sizeof b, "%.0f", v);
  else
    std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string coord(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

/// A "nice" tick step for a range (1, 2 or 5 times a power of ten).
double niceStep(double range, int ticks) {
  if (!(range > 0))
    return 1;
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

struct Series {
  std::string key, label;
  std::vector<std::pair<double, double>> pts; // (global iteration, value)
};

struct Phase {
  std::string name;
  double start = 0, end = 0; // global iterations
};

const char *kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

/// One chart: its series share a y axis; every chart shares the x range.
std::string chart(const std::string &title, const std::string &unit,
                  const std::vector<Series> &series, double x0, double x1,
                  const std::vector<Phase> &phases, double scale) {
  const double W = 560, L = 62, R = 12, B = 34;
  // The legend under the title, wrapped into rows; the plot starts below.
  std::vector<std::pair<double, double>> legendAt; // (x, y) of each series' key
  {
    double lx = L, ly = 22;
    for (const Series &s : series) {
      const double w = 13 + 6.2 * (double)s.label.size() + 14;
      if (lx > L && lx + w > W - R)
        lx = L, ly += 13;
      legendAt.push_back({lx, ly});
      lx += w;
    }
  }
  const double T = (legendAt.empty() ? 22 : legendAt.back().second) + 12;
  const double H = T + 216 - 34 + B;
  double y0 = INFINITY, y1 = -INFINITY;
  for (const Series &s : series)
    for (auto [x, y] : s.pts) {
      y0 = std::min(y0, y * scale);
      y1 = std::max(y1, y * scale);
    }
  if (y0 == y1) {
    const double pad = y0 == 0 ? 1 : std::fabs(y0) * 0.1;
    y0 -= pad, y1 += pad;
  }
  const double ystep = niceStep(y1 - y0, 4);
  y0 = std::floor(y0 / ystep) * ystep;
  y1 = std::ceil(y1 / ystep) * ystep;
  if (x1 <= x0)
    x1 = x0 + 1;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };

  std::ostringstream o;
  o << "<figure class=\"chart\" data-keys=\"";
  for (size_t i = 0; i < series.size(); ++i)
    o << (i ? " " : "") << esc(series[i].key);
  o << "\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"" << esc(title)
    << "\">\n";
  o << "<text class=\"title\" x=\"" << L << "\" y=\"16\">" << esc(title)
    << (unit.empty() ? "" : " (" + esc(unit) + ")") << "</text>\n";
  // Grid and y ticks.
  for (double y = y0; y <= y1 + ystep * 1e-9; y += ystep) {
    o << "<line class=\"grid\" x1=\"" << coord(L) << "\" x2=\"" << coord(W - R) << "\" y1=\""
      << coord(Y(y)) << "\" y2=\"" << coord(Y(y)) << "\"/>";
    o << "<text class=\"tick\" x=\"" << coord(L - 6) << "\" y=\"" << coord(Y(y) + 4)
      << "\" text-anchor=\"end\">" << num(std::fabs(y) < ystep * 1e-9 ? 0 : y) << "</text>\n";
  }
  // x ticks.
  const double xstep = std::max(1.0, niceStep(x1 - x0, 6));
  for (double x = std::ceil(x0 / xstep) * xstep; x <= x1 + 1e-9; x += xstep)
    o << "<text class=\"tick\" x=\"" << coord(X(x)) << "\" y=\"" << coord(H - B + 16)
      << "\" text-anchor=\"middle\">" << num(x) << "</text>";
  o << "\n";
  // Phases: a dashed line where each begins after the first, and its name.
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase &p = phases[i];
    if (i > 0)
      o << "<line class=\"phase\" x1=\"" << coord(X(p.start)) << "\" x2=\"" << coord(X(p.start))
        << "\" y1=\"" << T << "\" y2=\"" << coord(H - B) << "\"/>";
    o << "<text class=\"phasename\" x=\"" << coord(X(p.start) + 3) << "\" y=\"" << coord(T + 10)
      << "\">" << esc(p.name) << "</text>\n";
  }
  o << "<rect class=\"frame\" x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R
    << "\" height=\"" << H - T - B << "\"/>\n";
  // The series, and their legend under the title.
  for (size_t i = 0; i < series.size(); ++i) {
    const Series &s = series[i];
    const char *color = kColors[i % (sizeof kColors / sizeof *kColors)];
    if (s.pts.size() >= 2) {
      o << "<polyline class=\"series\" stroke=\"" << color << "\" points=\"";
      for (auto [x, y] : s.pts)
        o << coord(X(x)) << "," << coord(Y(y * scale)) << " ";
      o << "\"/>\n";
    }
    // Sparse series (held-out evaluations) also get their points marked.
    if (s.pts.size() < 60)
      for (auto [x, y] : s.pts)
        o << "<circle class=\"point\" fill=\"" << color << "\" cx=\"" << coord(X(x))
          << "\" cy=\"" << coord(Y(y * scale)) << "\" r=\"2.5\"/>";
    const auto [lx, ly] = legendAt[i];
    o << "<rect x=\"" << coord(lx) << "\" y=\"" << coord(ly) << "\" width=\"10\" height=\"4\" fill=\""
      << color << "\"/><text class=\"legend\" x=\"" << coord(lx + 13) << "\" y=\""
      << coord(ly + 5) << "\">" << esc(s.label) << "</text>\n";
  }
  o << "<text class=\"tick\" x=\"" << coord(W - R) << "\" y=\"" << coord(H - 4)
    << "\" text-anchor=\"end\">iteration (all phases)</text>\n";
  o << "</svg></figure>\n";
  return o.str();
}

double median(std::vector<double> v) {
  if (v.empty())
    return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace

namespace {

/// One iteration axis: each phase continues where the one before ended
/// (phases in order of first appearance; "start" is iteration 0). Fills
/// each phase's offset on the axis; returns the phases.
std::vector<Phase> phaseAxis(const std::vector<json> &rows,
                             std::map<std::string, double> &offset, double &acc) {
  std::vector<Phase> phases;
  std::map<std::string, double> lastIter;
  for (const json &r : rows) {
    const std::string p = r["phase"].get<std::string>();
    const double it = r["iteration"].get<double>();
    if (!lastIter.count(p)) {
      if (p != "start")
        phases.push_back({p, 0, 0});
      lastIter[p] = it;
    }
    lastIter[p] = std::max(lastIter[p], it);
  }
  acc = 0;
  for (Phase &p : phases) {
    offset[p.name] = acc;
    p.start = acc;
    acc += lastIter[p.name];
    p.end = acc;
  }
  offset["start"] = 0;
  return phases;
}

/// Every chart the rows have data for (in `charts`), the titles of those
/// they have none for (in `absent`); returns how many were drawn.
int drawCharts(const std::vector<json> &rows, const std::vector<Phase> &phases,
               std::map<std::string, double> &offset, double acc, std::ostringstream &charts,
               std::vector<std::string> &absent) {
  auto xOf = [&](const json &r) {
    return offset[r["phase"].get<std::string>()] + r["iteration"].get<double>();
  };
  const double x0 = 0, x1 = std::max(1.0, acc);

  auto seriesOf = [&](const std::string &key, const std::string &label) {
    Series s{key, label, {}};
    for (const json &r : rows) {
      auto it = r.find(key);
      if (it != r.end() && it->is_number()) {
        const double v = it->get<double>();
        if (std::isfinite(v))
          s.pts.push_back({xOf(r), v});
      }
    }
    return s;
  };
  struct Spec {
    std::string title, unit;
    std::vector<std::pair<std::string, std::string>> keys;
    double scale = 1;
  };
  std::vector<Spec> specs = {
      {"Reward", "", {{"reward_mean", "train (rollouts)"}, {"eval_reward", "held-out (greedy)"}}},
      {"KL", "", {{"kl_loss", "to the reference"}, {"ppo_kl", "old to new policy"}}},
      {"Response length", "tokens", {{"response_length", "mean"}}},
      {"Losses", "", {{"sft_loss", "sft"}, {"pg_loss", "policy"}, {"vf_loss", "value"},
                      {"rm_loss", "reward model"}}},
      {"Entropy", "nats", {{"entropy", "policy"}}},
      {"Clip fractions", "", {{"pg_clipfrac", "policy"}, {"vf_clipfrac", "value"}}},
      {"Reward model", "", {{"rm_acc", "accuracy"}, {"eval_pair_acc", "held-out accuracy"}}},
      {"Gradient norm", "", {{"grad_norm", "before clipping"}}},
      {"Learning rate", "", {{"lr", "lr"}}},
      {"Weight reshard bytes", "MiB", {{"reshard_bytes", "received"}}, 1.0 / (1 << 20)},
      {"Weight reshard time", "ms", {{"reshard_ms", "all transitions"}}},
      {"Throughput", "tokens/s", {{"tokens_per_s", "generated"}}},
  };
  // Stage times: the iteration and each step of the plan that ran.
  std::set<int> steps;
  for (const json &r : rows)
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key().rfind("ms_step_", 0) == 0)
        steps.insert(std::atoi(it.key().c_str() + 8));
  Spec stage{"Iteration and stage time", "ms", {{"iteration_ms", "iteration"}}};
  for (int s : steps)
    stage.keys.push_back({"ms_step_" + std::to_string(s), "step " + std::to_string(s)});
  specs.insert(specs.begin() + 9, stage);

  int drawn = 0;
  for (const Spec &sp : specs) {
    std::vector<Series> ss;
    for (auto &[k, label] : sp.keys) {
      Series s = seriesOf(k, label);
      if (!s.pts.empty())
        ss.push_back(std::move(s));
    }
    if (ss.empty()) {
      absent.push_back(sp.title);
      continue;
    }
    charts << chart(sp.title, sp.unit, ss, x0, x1, phases, sp.scale);
    ++drawn;
  }

  return drawn;
}

/// The summary: one row per phase.
std::string summaryTable(const std::vector<json> &rows, const std::vector<Phase> &phases) {
  std::ostringstream table;
  table << "<table class=\"summary\"><thead><tr><th>phase</th><th>iterations</th>"
           "<th>wall time</th><th>iteration (median)</th><th>reward, first &rarr; last</th>"
           "<th>loss, first &rarr; last</th><th>held-out reward, last</th>"
           "<th>reshard bytes / iteration</th></tr></thead><tbody>\n";
  double lastTime = 0;
  for (const json &r : rows)
    if (r["phase"] == "start" && r.contains("time_s") && r["time_s"].is_number())
      lastTime = r["time_s"].get<double>();
  for (const Phase &p : phases) {
    std::vector<const json *> pr;
    for (const json &r : rows)
      if (r["phase"] == p.name)
        pr.push_back(&r);
    auto firstLast = [&](const char *k) -> std::string {
      const json *a = nullptr, *b = nullptr;
      for (const json *r : pr)
        if (r->contains(k) && (*r)[k].is_number()) {
          if (!a)
            a = r;
          b = r;
        }
      if (!a)
        return "&mdash;";
      return num((*a)[k].get<double>()) + " &rarr; " + num((*b)[k].get<double>());
    };
    auto last = [&](const char *k) -> std::string {
      for (auto it = pr.rbegin(); it != pr.rend(); ++it)
        if ((*it)->contains(k) && (**it)[k].is_number())
          return num((**it)[k].get<double>());
      return "&mdash;";
    };
    std::vector<double> ms, rb;
    double end = lastTime;
    for (const json *r : pr) {
      if (r->contains("iteration_ms") && (*r)["iteration_ms"].is_number())
        ms.push_back((*r)["iteration_ms"].get<double>());
      if (r->contains("reshard_bytes") && (*r)["reshard_bytes"].is_number())
        rb.push_back((*r)["reshard_bytes"].get<double>());
      if (r->contains("time_s") && (*r)["time_s"].is_number())
        end = std::max(end, (*r)["time_s"].get<double>());
    }
    // The phase's loss: the first of these it has.
    std::string loss = "&mdash;";
    for (const char *k : {"sft_loss", "pg_loss", "rm_loss"})
      if (loss == "&mdash;")
        loss = firstLast(k);
    table << "<tr><td>" << esc(p.name) << "</td><td>" << pr.size() << "</td><td>"
          << num(end - lastTime) << " s</td><td>"
          << (ms.empty() ? "&mdash;" : num(median(ms)) + " ms") << "</td><td>"
          << firstLast("reward_mean") << "</td><td>" << loss << "</td><td>"
          << last("eval_reward") << "</td><td>"
          << (rb.empty() ? "&mdash;" : num(median(rb) / (1 << 20)) + " MiB") << "</td></tr>\n";
    lastTime = end;
  }
  table << "</tbody></table>\n";

  return table.str();
}

} // namespace

std::string renderHtmlReport(const std::vector<json> &rows, const std::string &title,
                             const std::string &source) {
  if (rows.empty())
    throw std::runtime_error("no metrics rows to report");
  std::map<std::string, double> offset;
  double acc = 0;
  const std::vector<Phase> phases = phaseAxis(rows, offset, acc);
  std::ostringstream charts;
  std::vector<std::string> absent;
  const int drawn = drawCharts(rows, phases, offset, acc, charts, absent);
  const std::string table = summaryTable(rows, phases);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
    << esc(title) << "</title>\n<style>\n"
    << "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;"
       "color:#222;background:#fff}\n"
    << "h1{font-size:20px;margin:0 0 4px}p.source{color:#666;margin:0 0 16px;font-size:13px}\n"
    << "table.summary{border-collapse:collapse;font-size:13px;margin-bottom:20px}\n"
    << "table.summary th,table.summary td{border:1px solid #ccc;padding:4px 8px;text-align:right}\n"
    << "table.summary th{background:#f3f3f3}table.summary td:first-child{text-align:left}\n"
    << ".charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid "
       "#e3e3e3}\n"
    << "svg text{font-size:11px;fill:#333}svg text.title{font-size:13px;font-weight:600}\n"
    << "svg text.tick{fill:#666}svg text.phasename{fill:#999;font-style:italic}\n"
    << ".grid{stroke:#eee}.frame{fill:none;stroke:#bbb}.phase{stroke:#999;"
       "stroke-dasharray:4 3}\n"
    << ".series{fill:none;stroke-width:1.4}p.absent{color:#888;font-size:12px}\n"
    << "</style></head>\n<body>\n<h1>" << esc(title) << "</h1>\n<p class=\"source\">"
    << esc(source) << " &middot; " << rows.size() << " rows &middot; " << phases.size()
    << " phase" << (phases.size() == 1 ? "" : "s") << " &middot; " << drawn << " charts</p>\n"
    << table << "<div class=\"charts\">\n"
    << charts.str() << "</div>\n";
  if (!absent.empty()) {
    o << "<p class=\"absent\">Not in this run: ";
    for (size_t i = 0; i < absent.size(); ++i)
      o << (i ? ", " : "") << esc(absent[i]);
    o << ".</p>\n";
  }
  o << "</body></html>\n";
  return o.str();
}

void writeReportFile(const std::string &path, const std::string &html) {
  if (std::string err = outputs::writeWholeFile(path, html); !err.empty())
    throw std::runtime_error(err);
}

} // namespace hflow::report
