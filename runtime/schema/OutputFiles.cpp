//===- OutputFiles.cpp - how every hflow tool writes what it writes --------===//
//
// See OutputFiles.h. std::filesystem only through its error_code overloads:
// nothing here throws.
//
//===----------------------------------------------------------------------===//
#include "runtime/schema/OutputFiles.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace hflow::outputs {

std::string systemReason(int e) { return e ? std::strerror(e) : "an I/O error"; }

void ignoreFileSizeSignal() { std::signal(SIGXFSZ, SIG_IGN); }

namespace {

std::string folderOf(const std::string &path) {
  fs::path p(path);
  fs::path parent = p.parent_path();
  return parent.empty() ? "." : parent.string();
}

/// Writes all of [data, data + n) to fd, retrying short writes and EINTR.
/// Returns 0 or the errno.
int writeAll(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    if (w == 0)
      return EIO;
    p += w;
    n -= size_t(w);
  }
  return 0;
}

/// fsync, where the file can be synced (a device or a pipe says EINVAL).
int syncFd(int fd) {
  if (::fsync(fd) == 0 || errno == EINVAL || errno == EROFS || errno == ENOTSUP)
    return 0;
  return errno;
}

std::string quote(const std::string &s) { return "'" + s + "'"; }

} // namespace

//===----------------------------------------------------------------------===//
// Paths
//===----------------------------------------------------------------------===//

std::string resolvedPath(const std::string &path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec)
    return path;
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec)
    return abs.lexically_normal().string();
  std::string s = r.string();
  while (s.size() > 1 && s.back() == '/')
    s.pop_back();
  return s;
}

bool samePath(const std::string &a, const std::string &b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return resolvedPath(a) == resolvedPath(b);
}

bool isInside(const std::string &path, const std::string &dir) {
  if (samePath(path, dir))
    return true;
  const std::string p = resolvedPath(path), d = resolvedPath(dir);
  if (d == "/")
    return true;
  return p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
}

//===----------------------------------------------------------------------===//
// IoSet
//===----------------------------------------------------------------------===//

void IoSet::add(Kind kind, std::string what, std::string path) {
  if (!path.empty())
    entries_.push_back({kind, std::move(what), std::move(path)});
}

std::string IoSet::check() const {
  auto isOutput = [](Kind k) { return k == Kind::OutputFile || k == Kind::OutputFolder; };
  auto name = [](const Entry &e) { return e.what + " " + quote(e.path); };
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry &o = entries_[i];
    if (!isOutput(o.kind))
      continue;
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (i == j)
        continue;
      const Entry &x = entries_[j];
      const bool xOut = isOutput(x.kind);
      if (xOut && j < i)
        continue; // the pair was seen from x's side
      if (samePath(o.path, x.path)) {
        if (xOut)
          return name(o) + " and " + name(x) + " name the same " +
                 (o.kind == Kind::OutputFolder ? "folder" : "file") +
                 ": each output needs its own";
        return name(o) + " is " + x.what + " (an input): hflow never writes over what it "
               "reads; choose another path";
      }
      if (o.kind == Kind::OutputFolder && isInside(x.path, o.path)) {
        if (xOut)
          return name(x) + " lies inside " + name(o) +
                 ", which hflow fills itself: choose a path outside it";
        return x.what + " " + quote(x.path) + " lies inside " + name(o) +
               ", which hflow fills itself: hflow never writes where it reads; choose "
               "another folder";
      }
      if (x.kind == Kind::OutputFolder && isInside(o.path, x.path))
        return name(o) + " lies inside " + name(x) +
               ", which hflow fills itself: choose a path outside it";
      if (o.kind == Kind::OutputFolder && x.kind == Kind::InputFolder &&
          isInside(o.path, x.path))
        return name(o) + " lies inside " + x.what + " " + quote(x.path) +
               " (an input): hflow never writes where it reads; choose another folder";
    }
  }
  return "";
}

//===----------------------------------------------------------------------===//
// AtomicFile
//===----------------------------------------------------------------------===//

AtomicFile::~AtomicFile() { abort(); }

std::string AtomicFile::open(const std::string &path) {
  abort();
  path_ = path;
  tmp_.clear();
  written_ = 0;
  struct stat st;
  std::string target = path;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // Replace what the link points at, not the link.
    std::error_code ec;
    fs::path t = fs::canonical(path, ec);
    if (!ec)
      target = t.string();
  }
  if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return "cannot write " + quote(path) + ": it is a directory";
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A device, a FIFO, a socket: written in place.
    fd_ = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0)
      return "cannot write " + quote(path) + ": " + systemReason(errno);
    done_ = false;
    return "";
  }
  fs::path t(target);
  tmp_ = (t.parent_path() / ("." + t.filename().string() + ".hflow-tmp-" +
                             std::to_string(::getpid())))
             .string();
  target_ = target;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int e = errno;
    tmp_.clear();
    return "cannot write " + quote(path) + ": " + systemReason(e);
  }
  done_ = false;
  return "";
}

std::string AtomicFile::write(const void *data, size_t n) {
  if (fd_ < 0)
    return "cannot write " + quote(path_) + ": the file is not open";
  if (int e = writeAll(fd_, data, n)) {
    abort();
    return "cannot write " + quote(path_) + ": " + systemReason(e);
  }
  written_ += n;
  return "";
}

std::string AtomicFile::commit() {
  if (fd_ < 0)
    return "cannot write " + quote(path_) + ": the file is not open";
  if (int e = syncFd(fd_)) {
    abort();
    return "cannot write " + quote(path_) + ": " + systemReason(e);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    abort();
    return "cannot write " + quote(path_) + ": " + systemReason(e);
  }
  if (!tmp_.empty()) {
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
      const int e = errno;
      abort();
      return "cannot write " + quote(path_) + ": renaming " + quote(tmp_) + ": " +
             systemReason(e);
    }
  }
  done_ = true; // renamed (or written in place): nothing to remove any more
  return tmp_.empty() ? "" : syncFolder(folderOf(target_));
}

void AtomicFile::abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!done_ && !tmp_.empty())
    ::unlink(tmp_.c_str());
  done_ = true;
}

std::string writeWholeFile(const std::string &path, std::string_view bytes) {
  AtomicFile f;
  if (std::string err = f.open(path); !err.empty())
    return err;
  if (std::string err = f.write(bytes); !err.empty())
    return err;
  return f.commit();
}

std::string syncFolder(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return "cannot open folder " + quote(dir) + " to sync it: " + systemReason(errno);
  const int e = syncFd(fd);
  ::close(fd);
  if (e)
    return "cannot sync folder " + quote(dir) + ": " + systemReason(e);
  return "";
}

//===----------------------------------------------------------------------===//
// RecordLog
//===----------------------------------------------------------------------===//

RecordLog::~RecordLog() {
  if (fd_ >= 0)
    ::close(fd_);
}

std::string RecordLog::open(const std::string &path, std::string_view keep) {
  path_ = path;
  partial_ = partialPath(path);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    // A device or a pipe (--metrics /dev/stdout): written in place.
    partial_.clear();
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0)
      return "cannot write " + quote(path) + ": " + systemReason(errno);
    size_ = 0;
    return keep.empty() ? "" : append(keep);
  }
  fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return "cannot write " + quote(partial_) + ": " + systemReason(errno);
  size_ = 0;
  if (!keep.empty())
    return append(keep);
  return "";
}

std::string RecordLog::append(std::string_view record) {
  const std::string &file = partial_.empty() ? path_ : partial_;
  if (fd_ < 0)
    return "cannot write " + quote(file) + ": the file is not open";
  if (int e = writeAll(fd_, record.data(), record.size())) {
    // Cut a torn record off: the file ends in whole records.
    if (!partial_.empty() && ::ftruncate(fd_, off_t(size_)) == 0)
      ::lseek(fd_, off_t(size_), SEEK_SET);
    return "cannot write " + quote(file) + ": " + systemReason(e);
  }
  size_ += record.size();
  return "";
}

std::string RecordLog::publish() {
  if (fd_ < 0)
    return "";
  const int e = syncFd(fd_);
  ::close(fd_);
  fd_ = -1;
  if (partial_.empty())
    return e ? "cannot write " + quote(path_) + ": " + systemReason(e) : "";
  if (e)
    return "cannot write " + quote(partial_) + ": " + systemReason(e);
  if (::rename(partial_.c_str(), path_.c_str()) != 0)
    return "cannot rename " + quote(partial_) + " to " + quote(path_) + ": " +
           systemReason(errno);
  return syncFolder(folderOf(path_));
}

std::string readRecords(const std::string &path, std::string &records) {
  records.clear();
  std::string from = RecordLog::partialPath(path);
  struct stat st;
  if (::stat(from.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    from = path;
    if (::stat(from.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return ""; // nothing, or a device (--metrics /dev/stdout): no rows to keep
  }
  std::FILE *f = std::fopen(from.c_str(), "rb");
  if (!f)
    return "cannot read " + quote(from) + ": " + systemReason(errno);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    records.append(buf, n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad)
    return "cannot read " + quote(from) + ": " + systemReason(EIO);
  const size_t end = records.rfind('\n');
  records.resize(end == std::string::npos ? 0 : end + 1);
  return "";
}

//===----------------------------------------------------------------------===//
// JobLock
//===----------------------------------------------------------------------===//

std::string describeThisJob(const std::string &command) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  std::string cmd = command;
  if (cmd.empty()) {
    // This process's own command line, as the kernel has it.
    if (std::FILE *f = std::fopen("/proc/self/cmdline", "rb")) {
      char buf[2048];
      const size_t n = std::fread(buf, 1, sizeof buf, f);
      std::fclose(f);
      for (size_t i = 0; i < n; ++i)
        cmd += buf[i] == '\0' ? ' ' : buf[i];
      while (!cmd.empty() && cmd.back() == ' ')
        cmd.pop_back();
    }
  }
  return "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when +
         (cmd.empty() ? "" : ": " + cmd);
}

JobLock::JobLock(JobLock &&o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

JobLock &JobLock::operator=(JobLock &&o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

std::string JobLock::acquire(const std::string &lockFile, const std::string &holder) {
  release();
  for (int attempt = 0; attempt < 16; ++attempt) {
    int fd = ::open(lockFile.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return "cannot create the lock file " + quote(lockFile) + ": " + systemReason(errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      std::string who;
      char buf[1024];
      ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      if (n > 0)
        who.assign(buf, size_t(n));
      while (!who.empty() && (who.back() == '\n' || who.back() == '\r'))
        who.pop_back();
      ::close(fd);
      if (e == EWOULDBLOCK)
        return "is in use by another job (" + (who.empty() ? "its description is not written yet" : who) +
               "); wait for it to finish or choose another path";
      return "cannot lock " + quote(lockFile) + ": " + systemReason(e);
    }
    // The holder before us may have removed the file after we opened it:
    // then we hold a lock on nothing, and try again.
    struct stat a, b;
    if (::fstat(fd, &a) != 0 || ::stat(lockFile.c_str(), &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
      ::close(fd);
      continue;
    }
    const std::string line = holder + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != (ssize_t)line.size()) {
      const int e = errno;
      ::unlink(lockFile.c_str());
      ::close(fd);
      return "cannot write the lock file " + quote(lockFile) + ": " + systemReason(e);
    }
    path_ = lockFile;
    fd_ = fd;
    return "";
  }
  return "cannot lock " + quote(lockFile) + ": it keeps being replaced";
}

void JobLock::release() {
  if (fd_ < 0)
    return;
  ::unlink(path_.c_str()); // while still locked: a waiter then retries on a new file
  ::close(fd_);
  fd_ = -1;
}

std::string lockFileFor(const std::string &file) {
  fs::path p(file);
  return (p.parent_path() / ("." + p.filename().string() + ".hflow-lock")).string();
}

//===----------------------------------------------------------------------===//
// Folders
//===----------------------------------------------------------------------===//

namespace {

bool isHflowFile(const std::string &name) {
  return name == kMarkerFile || name == kFolderLock;
}

/// The marker's one field we read back: "kind": "<name>".
std::string markerKind(const std::string &dir) {
  std::FILE *f = std::fopen((fs::path(dir) / kMarkerFile).c_str(), "rb");
  if (!f)
    return "";
  char buf[4096];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string text(buf, n);
  const std::string key = "\"kind\": \"";
  size_t at = text.find(key);
  if (at == std::string::npos)
    return "?";
  at += key.size();
  size_t end = text.find('"', at);
  return end == std::string::npos ? "?" : text.substr(at, end - at);
}

std::string listNames(const std::vector<std::string> &names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 6);
  for (size_t i = 0; i < shown; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > shown)
    out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

} // namespace

std::vector<std::string> ownedEntries(const std::string &dir, const FolderKind &kind) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (!isHflowFile(n) && kind.owns && kind.owns(n))
      out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string removeEntry(const std::string &dir, const std::string &name) {
  std::error_code ec;
  fs::remove_all(fs::path(dir) / name, ec);
  if (ec)
    return "cannot remove " + quote((fs::path(dir) / name).string()) + ": " + ec.message();
  return "";
}

std::string claimFolder(const std::string &dir, const FolderKind &kind, FolderMode mode,
                        const std::string &tool, const std::string &holder, JobLock &lock) {
  const std::string what = kind.flag + " " + quote(dir);
  std::error_code ec;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return what + " exists and is not a folder";
  fs::create_directories(dir, ec);
  if (ec)
    return what + " cannot be created: " + ec.message();
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return what + " is not writable: " + systemReason(errno);
  if (std::string err = lock.acquire((fs::path(dir) / kFolderLock).string(), holder);
      !err.empty())
    return what + " " + err;
  std::vector<std::string> foreign, owned;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (isHflowFile(n))
      continue;
    (kind.owns && kind.owns(n) ? owned : foreign).push_back(n);
  }
  if (ec)
    return what + " cannot be read: " + ec.message();
  std::sort(foreign.begin(), foreign.end());
  std::sort(owned.begin(), owned.end());
  const std::string marker = markerKind(dir);
  const bool empty = foreign.empty() && owned.empty();
  if (!empty && marker.empty()) {
    std::vector<std::string> all = owned;
    all.insert(all.end(), foreign.begin(), foreign.end());
    std::sort(all.begin(), all.end());
    lock.release();
    return what + " holds files hflow did not write (" + listNames(all) +
           "): hflow fills only an empty folder or one it filled itself; choose another "
           "folder, or empty this one";
  }
  if (!marker.empty() && marker != kind.name) {
    lock.release();
    return what + " holds what hflow wrote as " + marker + ", not as " + kind.name +
           ": choose another folder";
  }
  if (!foreign.empty()) {
    lock.release();
    return what + " holds files hflow did not write there (" + listNames(foreign) +
           "): hflow fills only an empty folder or one it filled itself, and --overwrite "
           "removes only what hflow wrote; choose another folder, or move them";
  }
  if (!owned.empty()) {
    if (mode == FolderMode::Fresh) {
      lock.release();
      return what + " holds an earlier run's files (" + listNames(owned) + "): " +
             kind.reuse + ", or choose another folder";
    }
    if (mode == FolderMode::Overwrite)
      for (const std::string &n : owned)
        if (std::string err = removeEntry(dir, n); !err.empty()) {
          lock.release();
          return what + ": --overwrite: " + err;
        }
  }
  if (marker.empty()) {
    const std::string text = "{\"kind\": \"" + kind.name + "\", \"written_by\": \"" + tool +
                             "\"}\n";
    if (std::string err = writeWholeFile((fs::path(dir) / kMarkerFile).string(), text);
        !err.empty()) {
      lock.release();
      return what + ": " + err;
    }
  }
  return "";
}

} // namespace hflow::outputs
