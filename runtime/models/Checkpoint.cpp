//===- Checkpoint.cpp - atomic files and training-state checkpoints --------===//
#include "runtime/models/Checkpoint.h"
#include "runtime/models/Safetensors.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hflow::models {

namespace {

std::string errnoStr(int e = errno) { return std::strerror(e); }

std::string shapeStr(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::function<void(const std::string &)> &saveHook() {
  static std::function<void(const std::string &)> hook;
  return hook;
}

void stage(const std::string &name) {
  if (saveHook())
    saveHook()(name);
}

constexpr const char *kFormat = "hflow-checkpoint";
// 2: meta.json's "integrity_fnv1a64" covers what gives the numbers their
// meaning (meta.json itself and every tensor's name, dtype, shape and
// offsets), besides the data buffer's own checksum.
constexpr int kVersion = 2;
constexpr const char *kStateFile = "state.safetensors";
constexpr const char *kMetaFile = "meta.json";
constexpr const char *kLatestFile = "latest";

std::string stepName(int64_t step) { return "step-" + std::to_string(step); }

/// "step-<digits>" -> the step; -1 otherwise.
int64_t parseStepName(const std::string &s) {
  if (s.size() <= 5 || s.compare(0, 5, "step-") != 0 || s.size() > 5 + 18)
    return -1;
  if (s.find_first_not_of("0123456789", 5) != std::string::npos)
    return -1;
  return std::stoll(s.substr(5));
}

std::string readWholeFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path + ": " + errnoStr());
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad())
    throw std::runtime_error("cannot read " + path + ": I/O error");
  return text;
}

/// Removes a directory tree when destroyed, unless released.
struct TreeRemover {
  std::string path;
  ~TreeRemover() {
    if (!path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

} // namespace

/// FNV-1a over meta.json without its own integrity field (nlohmann's dump:
/// keys sorted) and every tensor's header entry of the state file.
static std::string integrityOf(const json &meta, const SafetensorsFile &file) {
  json m = meta;
  m.erase("integrity_fnv1a64");
  std::string text = m.dump();
  for (const SafetensorsTensorInfo &t : file.tensors()) {
    text += "\n" + t.name + " " + t.dtype + " [";
    for (int64_t d : t.shape)
      text += std::to_string(d) + ",";
    text += "] " + std::to_string(t.begin) + "-" + std::to_string(t.end);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                (unsigned long long)fnv1a64(text.data(), text.size()));
  return hex;
}

//===----------------------------------------------------------------------===//
// Atomic files
//===----------------------------------------------------------------------===//

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  if (std::string err = file_.open(path_); !err.empty())
    throw std::runtime_error(err);
}

AtomicFileWriter::~AtomicFileWriter() { abort(); }

void AtomicFileWriter::abort() noexcept { file_.abort(); }

void AtomicFileWriter::write(const void *data, size_t n) {
  if (std::string err = file_.write(data, n); !err.empty())
    throw std::runtime_error(err);
}

void AtomicFileWriter::commit() {
  if (std::string err = file_.commit(); !err.empty())
    throw std::runtime_error(err);
}

bool allFinite(const at::Tensor &t) {
  if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type()))
    return true;
  return std::isfinite(t.detach().sum(at::kDouble).item<double>());
}

void writeFileAtomic(const std::string &path, const std::string &bytes) {
  if (std::string err = outputs::writeWholeFile(path, bytes); !err.empty())
    throw std::runtime_error(err);
}

void fsyncDirectory(const std::string &dir) {
  if (std::string err = outputs::syncFolder(dir); !err.empty())
    throw std::runtime_error(err);
}

void checkWritable(const std::string &dir, uint64_t minFreeBytes) {
  const std::string what = "checkpoint directory '" + dir + "'";
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw std::runtime_error(what + " exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(what + " cannot be created: " + ec.message());
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error(what + " exists and is not a directory");
  std::string probe =
      (fs::path(dir) / (".hflow-write-probe-" + std::to_string(::getpid()))).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(what + " is not writable: " + errnoStr());
  bool ok = ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
  int e = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok)
    throw std::runtime_error(what + " is not writable: " + errnoStr(e));
  if (minFreeBytes > 0) {
    struct statvfs vfs;
    if (::statvfs(dir.c_str(), &vfs) != 0)
      throw std::runtime_error(what + ": cannot query free space: " + errnoStr());
    uint64_t avail = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
    if (avail < minFreeBytes)
      throw std::runtime_error(what + " has " + std::to_string(avail) +
                               " bytes free, fewer than the " +
                               std::to_string(minFreeBytes) + " needed");
  }
}

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

namespace testhooks {
void setSaveFailureHook(std::function<void(const std::string &)> hook) {
  saveHook() = std::move(hook);
}
} // namespace testhooks

std::string saveCheckpoint(const std::string &dir, const CheckpointState &state) {
  if (state.step < 0)
    throw std::invalid_argument("saveCheckpoint: step " +
                                std::to_string(state.step) + " is negative");
  const std::string name = stepName(state.step);
  const std::string finalDir = (fs::path(dir) / name).string();
  const std::string tmpDir =
      (fs::path(dir) / ("." + name + ".tmp-" + std::to_string(::getpid()))).string();
  const std::string context =
      "saving checkpoint " + name + " in '" + dir + "': ";
  // A checkpoint never holds a non-finite value: refused before anything is
  // written, so the earlier checkpoints and `latest` stay as they were.
  for (const auto &[tname, t] : state.tensors)
    if (!allFinite(t))
      throw std::runtime_error(context + "tensor '" + tname +
                               "' holds a non-finite value (NaN or infinity): a checkpoint "
                               "never holds one; nothing was written");
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error("cannot create the directory: " + ec.message());
    fs::remove_all(tmpDir, ec); // a leftover of this pid's earlier failure
    if (::mkdir(tmpDir.c_str(), 0755) != 0)
      throw std::runtime_error("cannot create " + tmpDir + ": " + errnoStr());
    TreeRemover removeTmp{tmpDir};
    stage("tmpdir-created");

    std::vector<std::pair<std::string, at::Tensor>> tensors(state.tensors.begin(),
                                                            state.tensors.end());
    const std::string stateFile = (fs::path(tmpDir) / kStateFile).string();
    writeSafetensors(stateFile, tensors, {{"format", kFormat}});
    std::string checksum;
    {
      SafetensorsFile check(stateFile); // re-validates what was written
      checksum = check.metadata().at(kSafetensorsChecksumKey);
    }
    stage("state-written");

    json meta = {{"format", kFormat},
                 {"version", kVersion},
                 {"step", state.step},
                 {"tensors", state.tensors.size()},
                 {"state_fnv1a64", checksum},
                 {"meta", state.meta}};
    {
      SafetensorsFile written(stateFile);
      meta["integrity_fnv1a64"] = integrityOf(meta, written);
    }
    writeFileAtomic((fs::path(tmpDir) / kMetaFile).string(), meta.dump(2) + "\n");
    stage("meta-written");
    fsyncDirectory(tmpDir);

    // Put the step directory in place. An existing step-<N> (from a save
    // whose `latest` update never happened, or a rerun) is swapped out
    // atomically -- or, where the file system cannot exchange, moved aside
    // first -- and removed once `latest` is written.
    enum { Fresh, Exchanged, MovedAside } how = Fresh;
    const std::string asideDir =
        (fs::path(dir) / ("." + name + ".old-" + std::to_string(::getpid()))).string();
    TreeRemover removeAside;
    if (fs::exists(finalDir, ec)) {
      if (::renameat2(AT_FDCWD, tmpDir.c_str(), AT_FDCWD, finalDir.c_str(),
                      RENAME_EXCHANGE) == 0) {
        how = Exchanged; // tmpDir now holds the old step directory
      } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
        fs::remove_all(asideDir, ec);
        if (::rename(finalDir.c_str(), asideDir.c_str()) != 0)
          throw std::runtime_error("cannot move " + finalDir + " aside: " + errnoStr());
        how = MovedAside;
        if (::rename(tmpDir.c_str(), finalDir.c_str()) != 0) {
          int e = errno;
          ::rename(asideDir.c_str(), finalDir.c_str());
          throw std::runtime_error("cannot rename " + tmpDir + " to " + finalDir +
                                   ": " + errnoStr(e));
        }
      } else {
        throw std::runtime_error("cannot exchange " + tmpDir + " with " +
                                 finalDir + ": " + errnoStr());
      }
    } else if (::rename(tmpDir.c_str(), finalDir.c_str()) != 0) {
      throw std::runtime_error("cannot rename " + tmpDir + " to " + finalDir +
                               ": " + errnoStr());
    }
    try {
      fsyncDirectory(dir);
      stage("renamed");
      writeFileAtomic((fs::path(dir) / kLatestFile).string(), name + "\n");
    } catch (...) {
      // Roll back: the old step directory (if any) returns, the new one goes.
      if (how == Exchanged) {
        ::renameat2(AT_FDCWD, tmpDir.c_str(), AT_FDCWD, finalDir.c_str(),
                    RENAME_EXCHANGE);
      } else {
        fs::remove_all(finalDir, ec);
        if (how == MovedAside)
          ::rename(asideDir.c_str(), finalDir.c_str());
      }
      try {
        fsyncDirectory(dir);
      } catch (...) {
      }
      throw;
    }
    if (how == MovedAside)
      removeAside.path = asideDir;
    // removeTmp deletes the exchanged old directory (or nothing), removeAside
    // the moved-aside one.
    return finalDir;
  } catch (const std::exception &e) {
    throw std::runtime_error(context + e.what());
  }
}

int64_t latestCheckpointStep(const std::string &dir) {
  const std::string path = (fs::path(dir) / kLatestFile).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    return -1;
  std::string text = readWholeFile(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' ||
                           text.back() == '\r'))
    text.pop_back();
  int64_t step = parseStepName(text);
  if (step < 0)
    throw std::runtime_error(path + ": expected \"step-<N>\", found \"" +
                             text.substr(0, 64) + "\"");
  return step;
}

std::vector<int64_t> listCheckpointSteps(const std::string &dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    int64_t s = parseStepName(e.path().filename().string());
    if (s >= 0 && fs::is_regular_file(e.path() / kStateFile, ec) &&
        fs::is_regular_file(e.path() / kMetaFile, ec))
      steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

CheckpointState loadCheckpoint(const std::string &dir) {
  int64_t step = latestCheckpointStep(dir);
  if (step < 0)
    throw std::runtime_error("no checkpoint in '" + dir + "': " +
                             (fs::path(dir) / kLatestFile).string() +
                             " does not exist");
  return loadCheckpoint(dir, step);
}

CheckpointState loadCheckpoint(const std::string &dir, int64_t step) {
  const fs::path stepDir = fs::path(dir) / stepName(step);
  std::error_code ec;
  if (!fs::is_directory(stepDir, ec))
    throw std::runtime_error("no checkpoint " + stepName(step) + " in '" + dir +
                             "': " + stepDir.string() + " does not exist");
  const std::string metaPath = (stepDir / kMetaFile).string();
  const std::string statePath = (stepDir / kStateFile).string();
  json meta;
  {
    std::string text = readWholeFile(metaPath);
    try {
      meta = json::parse(text);
    } catch (const json::parse_error &e) {
      throw std::runtime_error(metaPath + ": not valid JSON (at byte " +
                               std::to_string(e.byte) +
                               "); the checkpoint is corrupt");
    } catch (const json::exception &e) { // a number out of range
      throw std::runtime_error(metaPath + ": " + e.what() + "; the checkpoint is corrupt");
    }
  }
  auto bad = [&](const std::string &what) {
    return std::runtime_error(metaPath + ": " + what);
  };
  if (!meta.is_object() || meta.value("format", json()) != kFormat)
    throw bad(std::string("not an hflow checkpoint (no \"format\": \"") +
              kFormat + "\")");
  if (!meta.contains("version") || meta["version"] != kVersion)
    throw bad("unsupported version " + meta.value("version", json()).dump());
  if (!meta.contains("step") || meta["step"] != step)
    throw bad("says step " + meta.value("step", json()).dump() + ", expected " +
              std::to_string(step));
  if (!meta.contains("meta") || !meta.contains("state_fnv1a64") ||
      !meta["state_fnv1a64"].is_string() || !meta.contains("tensors"))
    throw bad("incomplete (needs meta, state_fnv1a64, tensors)");

  SafetensorsFile file(statePath);
  auto it = file.metadata().find(kSafetensorsChecksumKey);
  if (it == file.metadata().end())
    throw std::runtime_error("safetensors " + statePath + ": no " +
                             kSafetensorsChecksumKey + " checksum in __metadata__");
  if (it->second != meta["state_fnv1a64"].get<std::string>())
    throw std::runtime_error(statePath + ": checksum " + it->second +
                             " differs from " + metaPath + "'s " +
                             meta["state_fnv1a64"].get<std::string>() +
                             "; the files do not belong together");
  if (!meta.contains("integrity_fnv1a64") || !meta["integrity_fnv1a64"].is_string())
    throw bad("incomplete (needs integrity_fnv1a64)");
  if (const std::string want = meta["integrity_fnv1a64"].get<std::string>(),
      got = integrityOf(meta, file);
      want != got)
    throw bad("the integrity checksum " + want + " does not match what the checkpoint now "
              "holds (" + got + "): its description or its tensors' headers (names, dtypes, "
              "shapes, offsets) changed since it was written; the checkpoint is corrupt");
  CheckpointState out;
  out.step = step;
  out.meta = meta["meta"];
  out.tensors = file.readAllVerified();
  if (meta["tensors"] != out.tensors.size())
    throw bad("lists " + meta["tensors"].dump() + " tensors, " + statePath +
              " holds " + std::to_string(out.tensors.size()));
  return out;
}

void restoreInto(const CheckpointState &state, const std::string &name,
                 at::Tensor &dst) {
  auto it = state.tensors.find(name);
  auto describe = [](const at::Tensor &t) {
    return shapeStr(t.sizes()) + " " + std::string(c10::toString(t.scalar_type()));
  };
  if (it == state.tensors.end())
    throw std::runtime_error(
        "checkpoint step " + std::to_string(state.step) + " has no tensor '" +
        name + "'" + (dst.defined() ? " (expected " + describe(dst) + ")" : ""));
  const at::Tensor &src = it->second;
  if (!dst.defined()) {
    dst = src.clone();
    return;
  }
  if (src.sizes() != dst.sizes() || src.scalar_type() != dst.scalar_type())
    throw std::runtime_error("checkpoint tensor '" + name + "': expected " +
                             describe(dst) + ", found " + describe(src));
  c10::NoGradGuard noGrad;
  dst.copy_(src);
}

at::Tensor generatorState(const at::Generator &gen) {
  at::Generator g = gen; // shares the generator; mutex() is not const
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state().clone();
}

void restoreGenerator(at::Generator &gen, const at::Tensor &state) {
  if (!state.defined() || state.scalar_type() != at::kByte || state.dim() != 1)
    throw std::runtime_error("generator state must be a 1-D uint8 tensor, found " +
                             (state.defined() ? shapeStr(state.sizes()) + " " +
                                                    c10::toString(state.scalar_type())
                                              : std::string("undefined")));
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state.contiguous());
  } catch (const c10::Error &e) {
    throw std::runtime_error("cannot restore the generator state: " +
                             std::string(e.what_without_backtrace()));
  }
}

} // namespace hflow::models
