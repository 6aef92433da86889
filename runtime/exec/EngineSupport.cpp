//===- EngineSupport.cpp - small helpers every part of the engine uses -----===//
#include "runtime/exec/EngineSupport.h"

#include "runtime/schema/Fnv1a.h"

#include <sys/resource.h>
#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>

namespace hflow::exec {


double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double pageFaults() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0)
    return 0;
  return (double)u.ru_minflt + (double)u.ru_majflt;
}

std::string str(const flatbuffers::String *s, const char *dflt) {
  return s ? s->str() : std::string(dflt);
}

std::vector<int> ints(const flatbuffers::Vector<int32_t> *v) {
  return v ? std::vector<int>(v->begin(), v->end()) : std::vector<int>();
}

std::string stepLabel(const hflow::plan::Plan &p, int step) {
  const hflow::plan::Step &st = *p.steps()->Get(step);
  const std::string role = st.role() >= 0 && p.roles() && st.role() < (int)p.roles()->size()
                               ? str(p.roles()->Get(st.role())->name())
                               : std::string();
  if (st.kind() == hflow::plan::StepKind::Reshard)
    return "reshard " + role;
  return role.empty() ? str(st.method()) : role + "." + str(st.method());
}

std::string rankList(const std::vector<int> &rs) {
  std::string out;
  for (size_t i = 0; i < rs.size();) {
    size_t j = i;
    while (j + 1 < rs.size() && rs[j + 1] == rs[j] + 1)
      ++j;
    if (!out.empty())
      out += ",";
    out += std::to_string(rs[i]);
    if (j > i)
      out += "-" + std::to_string(rs[j]);
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::string fmtBytes(double b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  else if (b < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool isOutOfMemory(const std::string &what) {
  for (const char *s : {"can't allocate memory", "out of memory", "std::bad_alloc",
                        "Cannot allocate memory"})
    if (what.find(s) != std::string::npos)
      return true;
  return false;
}

int envInt(const char *name, int dflt) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return dflt;
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  return *end ? dflt : (int)x;
}

int threadCount() {
  const int n = envInt("HFLOW_NUM_THREADS", 1);
  return n < 1 || n > 4096 ? 1 : n;
}

std::string fileHash(const std::string &path) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw RunError("cannot read '" + path + "'");
  uint64_t h = kFnv1a64Offset;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    h = fnv1a64(buf, n, h);
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad)
    throw RunError("cannot read '" + path + "'");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return hex;
}

bool fileExists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirOf(const std::string &p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

} // namespace hflow::exec
