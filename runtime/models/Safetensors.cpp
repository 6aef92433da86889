//===- Safetensors.cpp - safetensors files and Hugging Face model dirs -----===//
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

std::string errnoStr() { return std::strerror(errno); }

/// Bytes of one element of a known safetensors dtype.
uint64_t elemSize(at::ScalarType t) { return c10::elementSize(t); }

} // namespace

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
    }
    if (!h.is_object())
      fail("header is not a JSON object");

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
        bad("shape " + shapeStr(info.shape) + " of " + info.dtype + " needs " +
            (need > fileSize_ ? std::string("more bytes than the file has")
                              : std::to_string((uint64_t)need) + " bytes") +
            ", but " + offs + " hold " + std::to_string(info.end - info.begin));
      tensors_.push_back(std::move(info));
    }
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
         std::to_string(r1) + ") are outside its shape " + shapeStr(ti.shape));
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
         shapeStr(ti.shape));
  const int64_t rows = ti.shape.size() == 2 ? ti.shape[0] : 1;
  const int64_t cols = ti.shape.back();
  if (r0 < 0 || r1 < r0 || r1 > rows || c0 < 0 || c1 < c0 || c1 > cols)
    fail("tensor '" + name + "': box rows [" + std::to_string(r0) + ", " +
         std::to_string(r1) + ") x cols [" + std::to_string(c0) + ", " +
         std::to_string(c1) + ") is outside its shape " + shapeStr(ti.shape));
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

//===----------------------------------------------------------------------===//
// Hugging Face model directories
//===----------------------------------------------------------------------===//

namespace {

constexpr const char *kSingleFile = "model.safetensors";
constexpr const char *kIndexFile = "model.safetensors.index.json";

/// Reads a whole (small) text file; throws naming it.
std::string readSmallFile(const std::string &path, uint64_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path + ": no such file, or not readable");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad())
    throw std::runtime_error("cannot read " + path + ": I/O error");
  if (text.size() > maxBytes)
    throw std::runtime_error(path + " is larger than " + std::to_string(maxBytes) +
                             " bytes");
  return text;
}

json parseJsonFile(const std::string &path, uint64_t maxBytes) {
  std::string text = readSmallFile(path, maxBytes);
  try {
    return json::parse(text);
  } catch (const json::parse_error &e) {
    throw std::runtime_error(path + ": not valid JSON (at byte " +
                             std::to_string(e.byte) + ")");
  }
}

bool isShardName(const std::string &name) {
  // model-00001-of-00002.safetensors
  if (name.size() != std::strlen("model-00001-of-00002.safetensors"))
    return false;
  auto digits = [&](size_t at) {
    for (size_t i = at; i < at + 5; ++i)
      if (name[i] < '0' || name[i] > '9')
        return false;
    return true;
  };
  return name.compare(0, 6, "model-") == 0 && digits(6) &&
         name.compare(11, 4, "-of-") == 0 && digits(15) &&
         name.compare(20, std::string::npos, ".safetensors") == 0;
}

} // namespace

HfWeights::HfWeights(const std::string &dir) : dir_(dir) {
  fs::path single = fs::path(dir) / kSingleFile;
  fs::path index = fs::path(dir) / kIndexFile;
  std::error_code ec;
  if (fs::exists(single, ec)) {
    auto f = std::make_unique<SafetensorsFile>(single.string());
    for (const auto &t : f->tensors())
      weightMap_[t.name] = kSingleFile;
    open_[kSingleFile] = std::move(f);
    return;
  }
  if (!fs::exists(index, ec))
    throw std::runtime_error("hf weights " + dir + ": neither " + kSingleFile +
                             " nor " + kIndexFile + " exists");
  sharded_ = true;
  json j = parseJsonFile(index.string(), 1ULL << 28);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw std::runtime_error(index.string() + ": no \"weight_map\" object");
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw std::runtime_error(index.string() + ": weight_map entry of '" +
                               it.key() + "' is not a file name");
    std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." ||
        file == "..")
      throw std::runtime_error(index.string() + ": weight_map puts '" +
                               it.key() + "' in '" + file +
                               "', which is not a file name in the directory");
    weightMap_[it.key()] = file;
  }
}

HfWeights::~HfWeights() = default;

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto &[name, file] : weightMap_)
    out.push_back(name);
  return out;
}

bool HfWeights::has(const std::string &hfName) const {
  return weightMap_.count(hfName) != 0;
}

const SafetensorsFile &HfWeights::fileOf(const std::string &hfName) const {
  auto it = weightMap_.find(hfName);
  if (it == weightMap_.end())
    throw std::runtime_error("hf weights " + dir_ + ": no tensor '" + hfName + "'");
  auto &f = open_[it->second];
  if (!f)
    f = std::make_unique<SafetensorsFile>((fs::path(dir_) / it->second).string());
  if (!f->has(hfName))
    throw std::runtime_error((fs::path(dir_) / kIndexFile).string() +
                             ": weight_map puts '" + hfName + "' in " +
                             it->second + ", which has no such tensor");
  return *f;
}

static at::Tensor floatTo32(at::Tensor t) {
  return at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kFloat
             ? t.to(at::kFloat)
             : t;
}

at::Tensor HfWeights::read(const std::string &hfName) const {
  return floatTo32(fileOf(hfName).read(hfName));
}

at::Tensor HfWeights::readRows(const std::string &hfName, int64_t r0,
                               int64_t r1) const {
  return floatTo32(fileOf(hfName).readRows(hfName, r0, r1));
}

at::Tensor HfWeights::readBox(const std::string &hfName, int64_t r0, int64_t r1,
                              int64_t c0, int64_t c1) const {
  return floatTo32(fileOf(hfName).readBox(hfName, r0, r1, c0, c1));
}

uint64_t HfWeights::bytesRead() const {
  uint64_t n = 0;
  for (const auto &[path, f] : open_)
    n += f->bytesRead();
  return n;
}

std::string hfParameterName(const std::string &n) {
  if (n == "embed")
    return "model.embed_tokens.weight";
  if (n == "final_norm")
    return "model.norm.weight";
  if (n == "lm_head")
    return "lm_head.weight";
  static const std::pair<const char *, const char *> kLayer[] = {
      {"attn_norm", "input_layernorm.weight"},
      {"attn.q", "self_attn.q_proj.weight"},
      {"attn.q_bias", "self_attn.q_proj.bias"},
      {"attn.k", "self_attn.k_proj.weight"},
      {"attn.k_bias", "self_attn.k_proj.bias"},
      {"attn.v", "self_attn.v_proj.weight"},
      {"attn.v_bias", "self_attn.v_proj.bias"},
      {"attn.o", "self_attn.o_proj.weight"},
      {"mlp_norm", "post_attention_layernorm.weight"},
      {"mlp.gate", "mlp.gate_proj.weight"},
      {"mlp.up", "mlp.up_proj.weight"},
      {"mlp.down", "mlp.down_proj.weight"},
  };
  if (n.compare(0, 7, "layers.") == 0) {
    size_t dot = n.find('.', 7);
    std::string idx = n.substr(7, dot == std::string::npos ? dot : dot - 7);
    if (dot != std::string::npos && !idx.empty() &&
        idx.find_first_not_of("0123456789") == std::string::npos) {
      std::string rest = n.substr(dot + 1);
      for (const auto &[ours, theirs] : kLayer)
        if (rest == ours)
          return "model.layers." + idx + "." + theirs;
    }
  }
  throw std::invalid_argument("no Hugging Face name for parameter '" + n + "'");
}

bool hfParameterIs1D(const std::string &n) {
  auto endsWith = [&](const char *s) {
    size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  return endsWith("norm") || endsWith("_bias");
}

at::Tensor readHfRows(const std::string &dir, const std::string &hfName,
                      int64_t r0, int64_t r1) {
  return HfWeights(dir).readRows(hfName, r0, r1);
}

uint64_t loadHfShards(const std::string &dir, const LlamaConfig &config,
                      const std::vector<std::pair<std::string, at::Tensor>> &shards,
                      const std::vector<std::pair<std::string, Box>> &boxes) {
  HfWeights w(dir);
  auto shapes = llamaParameterShapes(config);
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> byName;
  for (const auto &[name, shape] : shapes) {
    std::string hf = hfParameterName(name);
    std::vector<int64_t> expected =
        hfParameterIs1D(name) ? std::vector<int64_t>{shape[1]} : shape;
    if (!w.has(hf))
      throw std::runtime_error("hf weights " + dir + ": tensor '" + hf +
                               "' is missing (expected shape " + shapeStr(expected) +
                               ", for parameter '" + name + "')");
    const SafetensorsFile &f = w.fileOf(hf);
    const auto &ti = f.info(hf);
    if (ti.shape != expected)
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has shape " + shapeStr(ti.shape) + ", expected " +
                               shapeStr(expected) +
                               " (the model config does not match these weights)");
    if (!at::isFloatingType(ti.scalarType))
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has dtype " + ti.dtype +
                               ", expected a floating-point dtype (F32, BF16, F16 or F64)");
    byName[name] = {hf, shape};
  }
  if (shards.size() != boxes.size())
    throw std::invalid_argument("loadHfShards: " + std::to_string(shards.size()) +
                                " shards but " + std::to_string(boxes.size()) + " boxes");
  std::vector<at::Tensor> read;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto &[name, dst] = shards[i];
    const Box &b = boxes[i].second;
    auto it = byName.find(name);
    if (it == byName.end() || boxes[i].first != name)
      throw std::invalid_argument("loadHfShards: parameter '" + name +
                                  "' is not one of the model's or its box is missing");
    if (dst.numel() != b.numel())
      throw std::invalid_argument("loadHfShards: parameter '" + name + "' holds " +
                                  std::to_string(dst.numel()) + " numbers, its box " +
                                  std::to_string(b.numel()));
    if (b.empty()) {
      read.emplace_back();
      continue;
    }
    read.push_back(w.readBox(it->second.first, b.r0, b.r1, b.c0, b.c1));
  }
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < shards.size(); ++i)
    if (read[i].defined())
      shards[i].second.copy_(read[i].view(shards[i].second.sizes()));
  return w.bytesRead();
}

void loadHfIntoLlama(const std::string &dir, Llama &model) {
  HfWeights w(dir);
  auto named = model.namedParameters();
  // Check every tensor before touching the model: a failed load leaves it
  // as it was.
  std::vector<std::string> hfNames;
  for (const auto &[name, view] : named) {
    std::string hf = hfParameterName(name);
    std::vector<int64_t> expected =
        hfParameterIs1D(name) ? std::vector<int64_t>{view.size(1)} : view.sizes().vec();
    if (!w.has(hf))
      throw std::runtime_error("hf weights " + dir + ": tensor '" + hf +
                               "' is missing (expected shape " +
                               shapeStr(expected) + ", for parameter '" + name +
                               "')");
    const SafetensorsFile &f = w.fileOf(hf);
    const auto &ti = f.info(hf);
    if (ti.shape != expected)
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has shape " + shapeStr(ti.shape) +
                               ", expected " + shapeStr(expected) +
                               " (the model config does not match these weights)");
    if (!at::isFloatingType(ti.scalarType))
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has dtype " + ti.dtype +
                               ", expected a floating-point dtype (F32, BF16, "
                               "F16 or F64)");
    hfNames.push_back(std::move(hf));
  }
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < named.size(); ++i) {
    at::Tensor &dst = named[i].second;
    dst.copy_(w.read(hfNames[i]).view(dst.sizes()));
  }
}

//===----------------------------------------------------------------------===//
// config.json
//===----------------------------------------------------------------------===//

std::string hfConfigJson(const LlamaConfig &cfg) {
  nlohmann::ordered_json j;
  bool qwen = cfg.qkvBias;
  j["architectures"] = {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen2" : "llama";
  j["hidden_size"] = cfg.hidden;
  j["intermediate_size"] = cfg.ffn;
  j["num_attention_heads"] = cfg.heads;
  j["num_key_value_heads"] = cfg.kvHeads;
  j["num_hidden_layers"] = cfg.layers;
  j["vocab_size"] = cfg.vocab;
  j["rope_theta"] = cfg.ropeTheta;
  j["rms_norm_eps"] = cfg.normEps;
  j["tie_word_embeddings"] = cfg.tieEmbeddings;
  j["hidden_act"] = "silu";
  if (!qwen)
    j["attention_bias"] = false; // transformers' Llama would also bias o_proj
  else
    j["use_sliding_window"] = false;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

LlamaConfig hfConfigFromJson(const std::string &pathArg) {
  fs::path path = pathArg;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    path /= "config.json";
  const std::string file = path.string();
  json j = parseJsonFile(file, 1ULL << 24);
  if (!j.is_object())
    throw std::runtime_error(file + " is not a JSON object");
  auto err = [&](const std::string &what) {
    return std::runtime_error(file + ": " + what);
  };
  LlamaConfig c;
  std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (!j.contains("model_type"))
    throw err("has no 'model_type'");
  if (type != "llama" && type != "qwen2")
    throw err("model_type '" + (type.empty() ? j["model_type"].dump() : type) +
              "' is not supported; hflow builds llama and qwen2 models");
  fs::path dir = path.parent_path();
  c.name = dir.filename().string();
  if (c.name.empty() || c.name == ".")
    c.name = type;
  c.qkvBias = type == "qwen2";
  auto dim = [&](const char *key, int &out, const char *fallback) {
    const char *k = key;
    if (!j.contains(k) && fallback && j.contains(fallback))
      k = fallback;
    if (!j.contains(k))
      throw err(std::string("has no '") + key + "'");
    const json &v = j[k];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 ||
        v.get<int64_t>() > INT32_MAX)
      throw err(std::string("'") + k + "' must be a positive integer, got " + v.dump());
    out = static_cast<int>(v.get<int64_t>());
  };
  dim("num_hidden_layers", c.layers, nullptr);
  dim("hidden_size", c.hidden, nullptr);
  dim("num_attention_heads", c.heads, nullptr);
  dim("num_key_value_heads", c.kvHeads, "num_attention_heads");
  dim("intermediate_size", c.ffn, nullptr);
  dim("vocab_size", c.vocab, nullptr);
  auto flag = [&](const char *key, bool &out) {
    if (!j.contains(key))
      return;
    if (!j[key].is_boolean())
      throw err(std::string("'") + key + "' must be true or false");
    out = j[key].get<bool>();
  };
  flag("tie_word_embeddings", c.tieEmbeddings);
  flag("attention_bias", c.qkvBias);
  auto positive = [&](const char *key, double &out, double dflt) {
    out = dflt;
    if (!j.contains(key))
      return;
    if (!j[key].is_number() || !(j[key].get<double>() > 0))
      throw err(std::string("'") + key + "' must be a positive number, got " +
                j[key].dump());
    out = j[key].get<double>();
  };
  positive("rope_theta", c.ropeTheta, 10000.0);
  positive("rms_norm_eps", c.normEps, 1e-6);
  std::string why = c.validate();
  if (!why.empty())
    throw err(why);
  return c;
}

std::unique_ptr<Llama> loadHfLlama(const std::string &dir) {
  auto model = std::make_unique<Llama>(hfConfigFromJson(dir), /*seed=*/0);
  loadHfIntoLlama(dir, *model);
  return model;
}

//===----------------------------------------------------------------------===//
// Export
//===----------------------------------------------------------------------===//

std::vector<std::string> exportHf(const std::string &dir, const Llama &model,
                                  uint64_t maxShardBytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw std::runtime_error("hf export: cannot create directory '" + dir +
                             "'" + (ec ? ": " + ec.message() : ""));
  std::vector<std::pair<std::string, at::Tensor>> all;
  uint64_t total = 0;
  for (const auto &[name, view] : model.namedParameters()) {
    at::Tensor t = hfParameterIs1D(name) ? view.reshape({-1}) : view;
    t = t.detach().to(at::kCPU, at::kFloat).contiguous();
    total += t.numel() * t.element_size();
    all.emplace_back(hfParameterName(name), std::move(t));
  }
  writeFileAtomic((fs::path(dir) / "config.json").string(),
                  hfConfigJson(model.config()));
  const std::map<std::string, std::string> meta = {{"format", "pt"}};

  std::vector<std::string> written;
  if (total <= maxShardBytes) {
    written.push_back((fs::path(dir) / kSingleFile).string());
    writeSafetensors(written.back(), all, meta);
  } else {
    // Greedy, in parameter order; a tensor larger than the limit gets a
    // shard of its own.
    std::vector<std::vector<size_t>> shards;
    uint64_t cur = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      uint64_t n = all[i].second.numel() * all[i].second.element_size();
      if (shards.empty() || (cur + n > maxShardBytes && cur > 0)) {
        shards.emplace_back();
        cur = 0;
      }
      shards.back().push_back(i);
      cur += n;
    }
    if (shards.size() > 99999)
      throw std::runtime_error("hf export: " + std::to_string(shards.size()) +
                               " shards is more than 99999; raise maxShardBytes");
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1,
                    shards.size());
      std::vector<std::pair<std::string, at::Tensor>> part;
      for (size_t i : shards[s]) {
        part.push_back(all[i]);
        weightMap[all[i].first] = name;
      }
      written.push_back((fs::path(dir) / name).string());
      writeSafetensors(written.back(), part, meta);
    }
    index["weight_map"] = weightMap;
    writeFileAtomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
  }
  // The new layout is complete; remove what belongs to an older one (a
  // loader prefers model.safetensors over the index).
  std::set<std::string> keep;
  for (const auto &p : written)
    keep.insert(fs::path(p).filename().string());
  std::vector<fs::path> stale;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!keep.count(name) &&
        (name == kSingleFile || isShardName(name) ||
         (name == kIndexFile && total <= maxShardBytes)))
      stale.push_back(e.path());
  }
  for (const auto &p : stale)
    fs::remove(p, ec);
  if (!stale.empty())
    fsyncDirectory(dir);
  return written;
}

} // namespace hflow::models
