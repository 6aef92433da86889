//===- hflow-report - a run's metrics as one self-contained HTML page --------===//
//
//   hflow-report METRICS.jsonl -o REPORT.html [--title TEXT]
//
// Reads what hflow-run --metrics wrote and draws it (runtime/report/
// HtmlReport.h): SVG charts and a summary table in one file that needs no
// network. Exit status: 0 written, 1 a bad or unreadable input or an
// unwritable output, 2 a usage error.
//
//===----------------------------------------------------------------------===//
#include "runtime/report/HtmlReport.h"
#include "runtime/schema/OutputFiles.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

const char *kUsage =
    "usage: hflow-report METRICS.jsonl -o REPORT.html [--title TEXT]\n"
    "\n"
    "Draws a run's metrics (the JSONL of hflow-run --metrics) as one HTML page:\n"
    "reward (train and held-out), KL, response length, losses, entropy, clip\n"
    "fractions, gradient norm, learning rate, iteration and stage times,\n"
    "weight-reshard bytes and time, throughput, and a summary table per phase.\n"
    "The page is self-contained (inline SVG and CSS, no script, nothing fetched).\n"
    "\n"
    "  -o, --output FILE   where to write the page (required)\n"
    "  --title TEXT        the page's heading (default: the metrics file's name)\n"
    "  -h, --help          this text\n";

int usageError(const std::string &msg) {
  std::fprintf(stderr, "hflow-report: error: %s (see 'hflow-report --help')\n", msg.c_str());
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  std::string in, out, title;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string &v) {
      if (i + 1 >= argc)
        return false;
      v = argv[++i];
      return true;
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-o" || a == "--output") {
      if (!value(out))
        return usageError("option " + a + " needs a value");
    } else if (a == "--title") {
      if (!value(title))
        return usageError("option --title needs a value");
    } else if (a.size() > 1 && a[0] == '-') {
      return usageError("unknown option '" + a + "'");
    } else if (in.empty()) {
      in = a;
    } else {
      return usageError("expected one metrics file, got '" + in + "' and '" + a + "'");
    }
  }
  if (in.empty())
    return usageError("missing the metrics file (hflow-run --metrics FILE writes one)");
  if (out.empty())
    return usageError("missing -o REPORT.html");
  hflow::outputs::ignoreFileSizeSignal();
  {
    hflow::outputs::IoSet io;
    io.input("the metrics file", in);
    io.outputFile("-o", out);
    if (std::string clash = io.check(); !clash.empty()) {
      std::fprintf(stderr, "hflow-report: error: %s\n", clash.c_str());
      return 2;
    }
  }
  try {
    auto rows = hflow::report::readMetricsJsonl(in);
    const std::string name = in.substr(in.find_last_of('/') == std::string::npos
                                           ? 0
                                           : in.find_last_of('/') + 1);
    const std::string html = hflow::report::renderHtmlReport(
        rows, title.empty() ? "hflow run: " + name : title, in);
    hflow::report::writeReportFile(out, html);
    std::printf("hflow-report: %s (%zu rows) -> %s\n", in.c_str(), rows.size(), out.c_str());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "hflow-report: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
