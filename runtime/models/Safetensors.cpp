//===- Safetensors.cpp - the safetensors file format: read and write ------===//
#include "runtime/models/Safetensors.h"
#include "runtime/models/Checkpoint.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors I/O assumes a little-endian host"
#endif

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hflow::models {

namespace {

/// The safetensors spec's limit on the header (100 MB).
constexpr uint64_t kMaxHeaderBytes = 100000000ULL;

struct DtypeEntry {
  const char *name;
  at::ScalarType type;
};
const DtypeEntry kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf},
    {"BF16", at::kBFloat16}, {"I64", at::kLong}, {"I32", at::kInt},
    {"I16", at::kShort},  {"I8", at::kChar},    {"U8", at::kByte},
    {"BOOL", at::kBool},
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string errnoStr() { return std::strerror(errno); }

/// Bytes of one element of a known safetensors dtype.
uint64_t elemSize(at::ScalarType t) { return c10::elementSize(t); }

} // namespace

std::string shapeString(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string safetensorsDtypeName(at::ScalarType t) {
  for (const auto &d : kDtypes)
    if (d.type == t)
      return d.name;
  throw std::invalid_argument(std::string("safetensors: dtype ") +
                              c10::toString(t) + " cannot be stored");
}

std::optional<at::ScalarType> safetensorsDtype(const std::string &name) {
  for (const auto &d : kDtypes)
    if (name == d.name)
      return d.type;
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// SafetensorsFile
//===----------------------------------------------------------------------===//

void SafetensorsFile::fail(const std::string &what) const {
  throw std::runtime_error("safetensors " + path_ + ": " + what);
}

/// The header's JSON object (after the length and its limits).
nlohmann::json SafetensorsFile::readHeader() {
  unsigned char lenBytes[8];
  readAt(0, lenBytes, 8, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | lenBytes[i];
  if (n > fileSize_ - 8)
    fail("header length " + std::to_string(n) +
         " runs past the end of the file (" + std::to_string(fileSize_) +
         " bytes); is the file truncated?");
  if (n > kMaxHeaderBytes)
    fail("header length " + std::to_string(n) + " exceeds the limit of " +
         std::to_string(kMaxHeaderBytes) + " bytes");
  headerLen_ = n;
  dataStart_ = 8 + n;
  dataLen_ = fileSize_ - dataStart_;
  std::string text(n, '\0');
  readAt(8, text.data(), n, "the header");

  json h;
  try {
    h = json::parse(text);
  } catch (const json::parse_error &e) {
    fail("header is not valid JSON (at byte " + std::to_string(e.byte) +
         " of " + std::to_string(n) + ")");
  } catch (const json::exception &e) { // a number out of range
    fail(std::string("header is not valid: ") + e.what());
  }
  if (!h.is_object())
    fail("header is not a JSON object");

  return h;
}

/// One tensor's header entry, checked against the data buffer.
SafetensorsTensorInfo SafetensorsFile::tensorEntry(const std::string &name,
                                                   const nlohmann::json &v) const {
  auto bad = [&](const std::string &what) {
    fail("tensor '" + name + "': " + what);
  };
  if (!v.is_object())
    bad("header entry is not a JSON object");
  if (!v.contains("dtype") || !v["dtype"].is_string())
    bad("no \"dtype\" string");
  if (!v.contains("shape") || !v["shape"].is_array())
    bad("no \"shape\" array");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2)
    bad("no \"data_offsets\" [begin, end] pair");
  SafetensorsTensorInfo info;
  info.name = name;
  info.dtype = v["dtype"].get<std::string>();
  auto st = safetensorsDtype(info.dtype);
  if (!st)
    bad("unknown dtype '" + info.dtype +
        "' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  info.scalarType = *st;
  // Bytes the shape needs; saturates past the file size (no overflow).
  unsigned __int128 need = elemSize(*st);
  for (const auto &d : v["shape"]) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      bad("shape " + v["shape"].dump() + " has an entry that is not a "
          "non-negative integer");
    uint64_t dim = d.get<uint64_t>();
    if (dim > uint64_t(INT64_MAX))
      bad("shape " + v["shape"].dump() + " is too large");
    info.shape.push_back(static_cast<int64_t>(dim));
    need *= dim;
    if (need > (unsigned __int128)fileSize_ + 1)
      need = (unsigned __int128)fileSize_ + 1;
  }
  for (const auto &o : v["data_offsets"])
    if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
      bad("data_offsets " + v["data_offsets"].dump() +
          " are not non-negative integers");
  info.begin = v["data_offsets"][0].get<uint64_t>();
  info.end = v["data_offsets"][1].get<uint64_t>();
  std::string offs = "data_offsets [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + "]";
  if (info.begin > info.end)
    bad(offs + " end before they begin");
  if (info.end > dataLen_)
    bad(offs + " run past the end of the data buffer (" +
        std::to_string(dataLen_) + " bytes); is the file truncated?");
  if (need != (unsigned __int128)(info.end - info.begin))
    bad("shape " + shapeString(info.shape) + " of " + info.dtype + " needs " +
        (need > fileSize_ ? std::string("more bytes than the file has")
                          : std::to_string((uint64_t)need) + " bytes") +
        ", but " + offs + " hold " + std::to_string(info.end - info.begin));
  return info;
}

/// Sorts the tensors by their bytes; no two non-empty ones may share one.
void SafetensorsFile::sortAndCheckOverlaps() {
  std::sort(tensors_.begin(), tensors_.end(), [](const auto &a, const auto &b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // No two non-empty tensors may share a byte.
  const SafetensorsTensorInfo *reach = nullptr; // the one ending furthest
  for (const auto &t : tensors_) {
    if (t.begin == t.end)
      continue;
    if (reach && t.begin < reach->end)
      fail("tensors '" + reach->name + "' [" + std::to_string(reach->begin) +
           ", " + std::to_string(reach->end) + ") and '" + t.name + "' [" +
           std::to_string(t.begin) + ", " + std::to_string(t.end) +
           ") overlap");
    if (!reach || t.end > reach->end)
      reach = &t;
  }
}

SafetensorsFile::SafetensorsFile(const std::string &path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    fail("cannot open: " + errnoStr());
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0)
      fail("cannot stat: " + errnoStr());
    if (!S_ISREG(st.st_mode))
      fail("not a regular file");
    fileSize_ = static_cast<uint64_t>(st.st_size);
    if (fileSize_ < 8)
      fail("truncated: the file has " + std::to_string(fileSize_) +
           " bytes, fewer than the 8-byte header length");
    const nlohmann::json h = readHeader();
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string &name = it.key();
      const json &v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object())
          fail("__metadata__ is not a JSON object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            fail("__metadata__ value of '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      tensors_.push_back(tensorEntry(name, v));
    }
    sortAndCheckOverlaps();
    for (size_t i = 0; i < tensors_.size(); ++i)
      index_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

void SafetensorsFile::readAt(uint64_t offset, void *dst, uint64_t n,
                             const std::string &what) const {
  auto *p = static_cast<char *>(dst);
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ULL << 30));
    ssize_t r = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      fail("reading " + what + ": " + errnoStr());
    }
    if (r == 0)
      fail("reading " + what + ": unexpected end of file at byte " +
           std::to_string(offset) + "; was the file truncated?");
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
    if (dataStart_ > 0 && offset - static_cast<uint64_t>(r) >= dataStart_)
      bytesRead_ += static_cast<uint64_t>(r); // data, not the header
  }
}

const SafetensorsTensorInfo &SafetensorsFile::info(const std::string &name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail("no tensor '" + name + "'");
  return tensors_[it->second];
}

static at::Tensor convertForMode(at::Tensor t, SafetensorsFile::ReadMode mode) {
  if (mode == SafetensorsFile::ReadMode::HalfToFloat32 &&
      (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16))
    return t.to(at::kFloat);
  return t;
}

at::Tensor SafetensorsFile::read(const std::string &name, ReadMode mode) const {
  const auto &ti = info(name);
  at::Tensor t = at::empty(ti.shape, at::TensorOptions().dtype(ti.scalarType));
  readAt(dataStart_ + ti.begin, t.data_ptr(), ti.end - ti.begin,
         "tensor '" + name + "'");
  return convertForMode(std::move(t), mode);
}

at::Tensor SafetensorsFile::readRows(const std::string &name, int64_t r0,
                                     int64_t r1, ReadMode mode) const {
  const auto &ti = info(name);
  if (ti.shape.empty())
    fail("tensor '" + name + "': a scalar has no rows to read");
  if (r0 < 0 || r1 < r0 || r1 > ti.shape[0])
    fail("tensor '" + name + "': rows [" + std::to_string(r0) + ", " +
         std::to_string(r1) + ") are outside its shape " + shapeString(ti.shape));
  std::vector<int64_t> shape = ti.shape;
  shape[0] = r1 - r0;
  uint64_t rowBytes = elemSize(ti.scalarType);
  for (size_t i = 1; i < ti.shape.size(); ++i)
    rowBytes *= static_cast<uint64_t>(ti.shape[i]);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(ti.scalarType));
  readAt(dataStart_ + ti.begin + rowBytes * static_cast<uint64_t>(r0),
         t.data_ptr(), rowBytes * static_cast<uint64_t>(r1 - r0),
         "tensor '" + name + "'");
  return convertForMode(std::move(t), mode);
}

at::Tensor SafetensorsFile::readBox(const std::string &name, int64_t r0, int64_t r1,
                                    int64_t c0, int64_t c1, ReadMode mode) const {
  const auto &ti = info(name);
  if (ti.shape.empty() || ti.shape.size() > 2)
    fail("tensor '" + name + "': a box needs a 1-D or 2-D tensor, it has shape " +
         shapeString(ti.shape));
  const int64_t rows = ti.shape.size() == 2 ? ti.shape[0] : 1;
  const int64_t cols = ti.shape.back();
  if (r0 < 0 || r1 < r0 || r1 > rows || c0 < 0 || c1 < c0 || c1 > cols)
    fail("tensor '" + name + "': box rows [" + std::to_string(r0) + ", " +
         std::to_string(r1) + ") x cols [" + std::to_string(c0) + ", " +
         std::to_string(c1) + ") is outside its shape " + shapeString(ti.shape));
  const uint64_t es = elemSize(ti.scalarType);
  at::Tensor t = at::empty({r1 - r0, c1 - c0}, at::TensorOptions().dtype(ti.scalarType));
  const std::string what = "tensor '" + name + "'";
  if (t.numel() > 0) {
    const uint64_t rowBytes = es * static_cast<uint64_t>(cols);
    const uint64_t base = dataStart_ + ti.begin;
    if (c0 == 0 && c1 == cols) {
      readAt(base + rowBytes * static_cast<uint64_t>(r0), t.data_ptr(),
             rowBytes * static_cast<uint64_t>(r1 - r0), what);
    } else {
      auto *dst = static_cast<char *>(t.data_ptr());
      const uint64_t seg = es * static_cast<uint64_t>(c1 - c0);
      for (int64_t r = r0; r < r1; ++r, dst += seg)
        readAt(base + rowBytes * static_cast<uint64_t>(r) + es * static_cast<uint64_t>(c0),
               dst, seg, what);
    }
  }
  return convertForMode(std::move(t), mode);
}

uint64_t SafetensorsFile::computeChecksum() const {
  uint64_t h = kFnv1a64Offset;
  std::vector<char> buf(8u << 20);
  for (uint64_t pos = 0; pos < dataLen_;) {
    uint64_t n = std::min<uint64_t>(buf.size(), dataLen_ - pos);
    readAt(dataStart_ + pos, buf.data(), n, "the data buffer");
    h = fnv1a64(buf.data(), n, h);
    pos += n;
  }
  return h;
}

static uint64_t parseChecksum(const SafetensorsFile &f) {
  auto it = f.metadata().find(kSafetensorsChecksumKey);
  if (it == f.metadata().end())
    throw std::runtime_error("safetensors " + f.path() + ": no " +
                             kSafetensorsChecksumKey +
                             " checksum in __metadata__");
  const std::string &s = it->second;
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error("safetensors " + f.path() + ": " +
                             kSafetensorsChecksumKey + " '" + s +
                             "' is not 16 hex digits");
  return std::stoull(s, nullptr, 16);
}

void SafetensorsFile::verifyChecksum() const {
  uint64_t want = parseChecksum(*this);
  uint64_t got = computeChecksum();
  if (got != want)
    fail("checksum mismatch: the data buffer hashes to " + hex64(got) +
         ", the header says " + hex64(want) + "; the file is corrupt");
}

std::map<std::string, at::Tensor> SafetensorsFile::readAllVerified() const {
  uint64_t want = parseChecksum(*this);
  uint64_t h = kFnv1a64Offset;
  std::vector<char> buf;
  auto hashRange = [&](uint64_t from, uint64_t to) { // bytes nobody owns
    while (from < to) {
      uint64_t n = std::min<uint64_t>(to - from, 8u << 20);
      buf.resize(n);
      readAt(dataStart_ + from, buf.data(), n, "the data buffer");
      h = fnv1a64(buf.data(), n, h);
      from += n;
    }
  };
  std::map<std::string, at::Tensor> out;
  uint64_t pos = 0;
  for (const auto &ti : tensors_) { // ordered by offset, no overlaps
    hashRange(pos, ti.begin);
    at::Tensor t = at::empty(ti.shape, at::TensorOptions().dtype(ti.scalarType));
    uint64_t n = ti.end - ti.begin;
    readAt(dataStart_ + ti.begin, t.data_ptr(), n, "tensor '" + ti.name + "'");
    h = fnv1a64(t.data_ptr(), n, h);
    pos = std::max(pos, ti.end);
    out.emplace(ti.name, std::move(t));
  }
  hashRange(pos, dataLen_);
  if (h != want)
    fail("checksum mismatch: the data buffer hashes to " + hex64(h) +
         ", the header says " + hex64(want) + "; the file is corrupt");
  return out;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

uint64_t writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, at::Tensor>> &tensors,
    const std::map<std::string, std::string> &metadata,
    const SafetensorsWriteOptions &options) {
  auto bad = [&](const std::string &what) -> std::runtime_error {
    return std::runtime_error("safetensors " + path + ": " + what);
  };
  if (options.floatDtype && *options.floatDtype != at::kFloat &&
      *options.floatDtype != at::kBFloat16 && *options.floatDtype != at::kHalf)
    throw bad("floatDtype must be float32, bfloat16 or float16");
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  std::set<std::string> seen;
  json header = json::object();
  uint64_t offset = 0, h = kFnv1a64Offset;
  for (const auto &[name, src] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw bad("invalid tensor name '" + name + "'");
    if (!seen.insert(name).second)
      throw bad("tensor '" + name + "' given twice");
    if (!src.defined())
      throw bad("tensor '" + name + "' is undefined");
    at::Tensor t = src.detach().to(at::kCPU);
    if (options.floatDtype && at::isFloatingType(t.scalar_type()))
      t = t.to(*options.floatDtype);
    t = t.contiguous();
    std::string dt;
    try {
      dt = safetensorsDtypeName(t.scalar_type());
    } catch (const std::exception &) {
      throw bad("tensor '" + name + "' has dtype " +
                std::string(c10::toString(t.scalar_type())) +
                ", which safetensors cannot hold");
    }
    uint64_t n = t.numel() * t.element_size();
    header[name] = {{"dtype", dt},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    if (options.checksum && n)
      h = fnv1a64(t.data_ptr(), n, h);
    offset += n;
    data.push_back(std::move(t));
  }
  json meta = json::object();
  for (const auto &[k, v] : metadata)
    meta[k] = v;
  if (options.checksum)
    meta[kSafetensorsChecksumKey] = hex64(h);
  if (!meta.empty())
    header["__metadata__"] = meta;
  std::string text = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>((uint64_t)text.size() >> (8 * i));

  AtomicFileWriter w(path);
  w.write(len, 8);
  w.write(text);
  for (const auto &t : data)
    if (t.numel())
      w.write(t.data_ptr(), t.numel() * t.element_size());
  w.commit();
  return w.bytesWritten();
}

} // namespace hflow::models
