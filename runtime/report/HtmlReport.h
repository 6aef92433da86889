//===- HtmlReport.h - a run's metrics as one self-contained HTML page -------===//
//
// hflow-report metrics.jsonl -o report.html, and hflow-run --report FILE:
// the metrics JSONL of a run (one object per iteration, runtime.md) drawn as
// inline SVG line charts (reward, train and held-out; KL; response length;
// losses; entropy; clip fractions; gradient norm; learning rate; stage and
// iteration times; weight-reshard bytes and time; throughput) over one
// iteration axis with the phases marked, and a summary table per phase. No
// script, no style sheet or font from elsewhere: the file opens offline.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_REPORT_HTMLREPORT_H
#define HFLOW_RUNTIME_REPORT_HTMLREPORT_H

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace hflow::report {

/// The rows of a metrics JSONL file, in order. Throws std::runtime_error
/// "PATH:LINE: what" for a line that is not a JSON object with a string
/// "phase" and a number "iteration", or "PATH: ..." for a missing, unreadable
/// or empty file.
std::vector<nlohmann::json> readMetricsJsonl(const std::string &path);

/// The page for `rows` (at least one). `title` heads it; `source` says
/// where the rows came from.
std::string renderHtmlReport(const std::vector<nlohmann::json> &rows, const std::string &title,
                             const std::string &source);

/// Writes `html` to `path` through a temporary file renamed into place.
/// Throws std::runtime_error naming the path.
void writeReportFile(const std::string &path, const std::string &html);

} // namespace hflow::report

#endif // HFLOW_RUNTIME_REPORT_HTMLREPORT_H
