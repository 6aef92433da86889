//===- RunOutputs.cpp - what one hflow-run job writes, checked and locked ---===//
#include "runtime/exec/RunOutputs.h"

#include "runtime/exec/EngineSupport.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <regex>

#include <sys/stat.h>
#include <unistd.h>

namespace hflow::exec {

namespace fs = std::filesystem;

namespace {

bool matches(const std::string &name, const char *pattern) {
  return std::regex_match(name, std::regex(pattern));
}

std::string folderOf(const std::string &path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

} // namespace

const outputs::FolderKind &RunOutputs::checkpointKind() {
  static const outputs::FolderKind k{
      "checkpoint-dir", "--checkpoint-dir",
      [](const std::string &n) { return n == "latest" || matches(n, "rank-[0-9]+"); },
      "continue that run with --resume, or replace them with --overwrite"};
  return k;
}

const outputs::FolderKind &RunOutputs::tensorboardKind() {
  static const outputs::FolderKind k{
      "tensorboard", "--tensorboard",
      [](const std::string &n) { return n.rfind("events.out.tfevents.", 0) == 0; },
      "continue that run with --resume, or replace them with --overwrite"};
  return k;
}

const outputs::FolderKind &RunOutputs::exportKind() {
  static const outputs::FolderKind k{
      "export-hf", "--export-hf",
      [](const std::string &n) {
        return n == "config.json" || n == "model.safetensors" ||
               n == "model.safetensors.index.json" ||
               matches(n, "model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
      },
      "replace that export with --overwrite"};
  return k;
}

const outputs::FolderKind &RunOutputs::dumpKind() {
  static const outputs::FolderKind k{
      "dump-values", "--dump-values",
      [](const std::string &n) {
        return matches(n, "[A-Za-z_][A-Za-z0-9_]*-[0-9]+") || matches(n, "pairs-.*\\.jsonl");
      },
      "replace them with --overwrite"};
  return k;
}

void RunOutputs::claim(const RunOptions &o, const std::string &checkpointDir,
                       const std::vector<std::string> &exports, const RunInputs &in) {
  const std::string ckFlag =
      o.checkpointDir.empty() ? "the train block's checkpoint_dir" : "--checkpoint-dir";
  outputs::IoSet io;
  for (const auto &[what, path] : in.files)
    io.input(what, path);
  for (const auto &[what, path] : in.folders)
    io.inputFolder(what, path);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"--metrics", o.metricsFile}, {"--report", o.reportFile}, {"--trace", o.traceFile}};
  for (const auto &[flag, path] : files)
    io.outputFile(flag, path);
  if (!o.metricsFile.empty())
    io.outputFile("--metrics' partial file", outputs::RecordLog::partialPath(o.metricsFile));
  io.outputFolder("--tensorboard", o.tensorboardDir);
  io.outputFolder(ckFlag, checkpointDir);
  for (const std::string &e : exports)
    io.outputFolder("--export-hf", e);
  io.outputFolder("--dump-values", o.dumpValues);
  if (std::string clash = io.check(); !clash.empty())
    throw RunError(clash);

  const std::string me = outputs::describeThisJob("");
  for (const auto &[flag, path] : files) {
    if (path.empty())
      continue;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode))
        throw RunError(flag + " '" + path + "' is a folder: give a file name");
      if (!S_ISREG(st.st_mode))
        continue; // a device or a pipe (/dev/stdout): written in place, nothing to lock
    }
    const std::string dir = folderOf(path);
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      throw RunError(flag + " '" + path + "': cannot write in its folder '" + dir +
                     "': " + outputs::systemReason(errno));
    outputs::JobLock lock;
    if (std::string err = lock.acquire(outputs::lockFileFor(path), me); !err.empty())
      throw RunError(flag + " '" + path + "' " + err);
    locks_.push_back(std::move(lock));
  }

  auto claimOne = [&](const std::string &dir, outputs::FolderKind kind, const std::string &flag,
                      outputs::FolderMode mode) {
    if (dir.empty())
      return;
    kind.flag = flag;
    outputs::JobLock lock;
    if (std::string err = outputs::claimFolder(dir, kind, mode, "hflow-run", me, lock);
        !err.empty())
      throw RunError(err);
    locks_.push_back(std::move(lock));
  };
  using outputs::FolderMode;
  const FolderMode fresh = o.overwrite ? FolderMode::Overwrite : FolderMode::Fresh;
  claimOne(checkpointDir, checkpointKind(), ckFlag, o.resume ? FolderMode::Reuse : fresh);
  claimOne(o.tensorboardDir, tensorboardKind(), "--tensorboard",
           o.resume ? FolderMode::Reuse : fresh);
  claimOne(o.dumpValues, dumpKind(), "--dump-values", o.resume ? FolderMode::Reuse : fresh);
  // An export replaces an earlier one only when it is complete (the weights
  // are written, then the files of the old layout removed): --overwrite
  // removes nothing now.
  for (const std::string &e : exports)
    claimOne(e, exportKind(), "--export-hf",
             o.overwrite ? FolderMode::Reuse : FolderMode::Fresh);
}

std::vector<std::string> RunOutputs::rowsBefore(const std::string &records,
                                                const ResumePoint &at, std::string &why) {
  std::vector<std::string> kept;
  why.clear();
  size_t k = 0, lineNo = 0, start = 0;
  int64_t last = 0;
  std::string lastKept;
  while (start < records.size()) {
    size_t end = records.find('\n', start);
    if (end == std::string::npos)
      break;
    const std::string line = records.substr(start, end + 1 - start);
    start = end + 1;
    ++lineNo;
    nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_discarded() || !r.is_object() || !r.contains("phase") ||
        !r["phase"].is_string() || !r.contains("iteration") ||
        !r["iteration"].is_number_integer()) {
      why = "its line " + std::to_string(lineNo) + " is not a metrics row";
      break;
    }
    const std::string phase = r["phase"].get<std::string>();
    const int64_t it = r["iteration"].get<int64_t>();
    if (phase == "start") {
      kept.push_back(line);
      continue;
    }
    if (!(k < at.phases.size() && at.phases[k] == phase && it > last)) {
      size_t next = last == 0 ? k : k + 1;
      while (next < at.phases.size() && at.phases[next] != phase)
        ++next;
      if (next >= at.phases.size()) {
        why = "its line " + std::to_string(lineNo) + " is of phase '" + phase +
              "', which this run does not have there";
        break;
      }
      k = next;
    }
    last = it;
    if (k > at.phase || (k == at.phase && it > at.iteration))
      return kept; // the resume point: the rest is replaced
    kept.push_back(line);
    lastKept = phase + " " + std::to_string(it);
  }
  const bool reached = (at.phase == 0 && at.iteration == 0) ||
                       (k == at.phase && last == at.iteration) ||
                       (at.iteration == 0 && k + 1 == at.phase);
  if (why.empty() && !reached)
    why = std::string("its rows stop at ") + (lastKept.empty() ? "the start" : lastKept);
  return kept;
}

std::vector<std::string> RunOutputs::openMetrics(const RunOptions &o, const ResumePoint *at) {
  if (o.metricsFile.empty())
    return {};
  std::vector<std::string> kept;
  std::string keep;
  if (at) {
    std::string records;
    if (std::string err = outputs::readRecords(o.metricsFile, records); !err.empty())
      throw RunError("--metrics: " + err);
    std::string why;
    kept = rowsBefore(records, *at, why);
    for (const std::string &row : kept)
      keep += row;
    if (!why.empty()) {
      const std::string name = at->phase < at->phases.size() ? at->phases[at->phase] : "?";
      std::fprintf(stderr,
                   "hflow-run: warning: --metrics '%s': %s, not at the resume point (%s %lld); "
                   "kept %zu rows before it\n",
                   o.metricsFile.c_str(), why.c_str(), name.c_str(), (long long)at->iteration,
                   kept.size());
    }
  }
  if (std::string err = metrics_.open(o.metricsFile, keep); !err.empty())
    throw RunError("--metrics: " + err);
  return kept;
}

void RunOutputs::appendMetrics(const std::string &row) {
  if (std::string err = metrics_.append(row); !err.empty())
    throw RunError("--metrics: " + err);
}

std::string RunOutputs::publishMetrics() { return metrics_.publish(); }

} // namespace hflow::exec
