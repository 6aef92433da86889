//===- EventFile.cpp - TensorBoard event files ------------------------------===//
#include "runtime/report/EventFile.h"

#if HFLOW_HAVE_EVENT_FILES
#include "runtime/report/tensorboard_event.pb.h"
#include "runtime/schema/OutputFiles.h"

#include <boost/crc.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace hflow::report {

bool eventFilesBuilt() { return true; }

uint32_t crc32c(const void *data, size_t n) {
  // CRC-32C: polynomial 0x1EDC6F41, reflected, initial and final XOR ~0.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> c;
  c.process_bytes(data, n);
  return c.checksum();
}

uint32_t maskedCrc32c(const void *data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace {
void putLE(std::string &s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    s.push_back((char)((v >> (8 * i)) & 0xff));
}
uint64_t getLE(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
bool isEventFile(const fs::path &p) {
  const std::string n = p.filename().string();
  // Hidden names are temporary files (runtime/schema/OutputFiles.h).
  return n.find("tfevents") != std::string::npos && n[0] != '.' &&
         !(n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0);
}
} // namespace

std::string tfRecord(const std::string &payload) {
  std::string len, out;
  putLE(len, payload.size(), 8);
  out = len;
  putLE(out, maskedCrc32c(len.data(), len.size()), 4);
  out += payload;
  putLE(out, maskedCrc32c(payload.data(), payload.size()), 4);
  return out;
}

std::vector<std::string> readTfRecords(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read event file '" + path + "': " + std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto *b = reinterpret_cast<const unsigned char *>(bytes.data());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    auto bad = [&](const std::string &what) {
      return std::runtime_error("event file '" + path + "': the record at byte " +
                                std::to_string(at) + " " + what);
    };
    if (bytes.size() - at < 12)
      throw bad("is cut short (" + std::to_string(bytes.size() - at) + " bytes)");
    const uint64_t n = getLE(b + at, 8);
    if ((uint32_t)getLE(b + at + 8, 4) != maskedCrc32c(b + at, 8))
      throw bad("has a wrong length checksum");
    if (n > bytes.size() - at - 16)
      throw bad("claims " + std::to_string(n) + " bytes, more than the file holds");
    if ((uint32_t)getLE(b + at + 12 + n, 4) != maskedCrc32c(b + at + 12, n))
      throw bad("has a wrong payload checksum");
    out.emplace_back(bytes.data() + at + 12, n);
    at += 16 + n;
  }
  return out;
}

EventWriter::EventWriter(const std::string &dir, bool resume) : dir_(dir), resume_(resume) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::runtime_error("--tensorboard " + dir_ + ": cannot create the directory" +
                             (ec ? ": " + ec.message() : std::string()));
}

EventWriter::~EventWriter() {
  if (fd_ >= 0)
    ::close(fd_);
}

void EventWriter::open(int64_t firstStep) {
  // Resuming: what the earlier run wrote at firstStep or later is dropped
  // (each file rewritten whole, then renamed over the old one). The names
  // are listed first: rewriting creates files in the directory.
  std::vector<fs::path> earlier;
  if (resume_)
    for (const auto &e : fs::directory_iterator(dir_))
      if (isEventFile(e.path()))
        earlier.push_back(e.path());
  for (const fs::path &p : earlier) {
    const std::vector<std::string> recs = readTfRecords(p.string());
    std::string kept;
    size_t dropped = 0;
    for (const std::string &r : recs) {
      tensorboard::Event ev;
      if (!ev.ParseFromString(r))
        throw std::runtime_error("event file '" + p.string() +
                                 "': a record is not an Event message");
      if (ev.has_summary() && ev.step() >= firstStep)
        ++dropped;
      else
        kept += tfRecord(r);
    }
    if (dropped == 0)
      continue;
    if (std::string err = outputs::writeWholeFile(p.string(), kept); !err.empty())
      throw std::runtime_error("--tensorboard: rewriting an event file: " + err);
  }
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  const long long now = (long long)std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  std::string base = dir_ + "/events.out.tfevents." + std::to_string(now) + "." + host + ".hflow";
  path_ = base;
  for (int k = 1; fs::exists(path_); ++k)
    path_ = base + "." + std::to_string(k);
  // A new file of its own (O_EXCL): an event file is never written over.
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error("--tensorboard: cannot write event file '" + path_ + "': " +
                             std::strerror(errno));
  size_ = 0;
  tensorboard::Event ev;
  ev.set_wall_time((double)now);
  ev.set_file_version("brain.Event:2");
  write(ev.SerializeAsString());
}

void EventWriter::write(const std::string &payload) {
  const std::string rec = tfRecord(payload);
  const char *p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : EIO;
      // The file ends in whole records: a torn one is cut off.
      if (::ftruncate(fd_, (off_t)size_) == 0)
        ::lseek(fd_, (off_t)size_, SEEK_SET);
      throw std::runtime_error("--tensorboard: cannot write event file '" + path_ + "': " +
                               outputs::systemReason(e));
    }
    p += w;
    n -= (size_t)w;
  }
  size_ += rec.size();
}

void EventWriter::scalars(int64_t step, double wallTime,
                          const std::vector<std::pair<std::string, double>> &values) {
  if (fd_ < 0)
    open(step);
  tensorboard::Event ev;
  ev.set_wall_time(wallTime);
  ev.set_step(step);
  tensorboard::Summary *s = ev.mutable_summary();
  for (const auto &[tag, v] : values) {
    tensorboard::SummaryValue *sv = s->add_value();
    sv->set_tag(tag);
    sv->set_simple_value((float)v);
  }
  write(ev.SerializeAsString());
}

} // namespace hflow::report

#else // !HFLOW_HAVE_EVENT_FILES

#include <stdexcept>

namespace hflow::report {

namespace {
[[noreturn]] void unavailable() {
  throw std::runtime_error("--tensorboard: this hflow-run was built without protobuf, protoc "
                           "or Boost's headers, which TensorBoard event files need; rebuild "
                           "with libprotobuf-dev, protobuf-compiler and libboost-dev installed");
}
} // namespace

bool eventFilesBuilt() { return false; }
uint32_t crc32c(const void *, size_t) { unavailable(); }
uint32_t maskedCrc32c(const void *, size_t) { unavailable(); }
std::string tfRecord(const std::string &) { unavailable(); }
std::vector<std::string> readTfRecords(const std::string &) { unavailable(); }
EventWriter::EventWriter(const std::string &, bool) { unavailable(); }
EventWriter::~EventWriter() {}
void EventWriter::open(int64_t) { unavailable(); }
void EventWriter::write(const std::string &) { unavailable(); }
void EventWriter::scalars(int64_t, double, const std::vector<std::pair<std::string, double>> &) {
  unavailable();
}

} // namespace hflow::report

#endif // HFLOW_HAVE_EVENT_FILES
