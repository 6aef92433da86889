//===- HfShared.cpp - what the Hugging Face tokenizer's stages share -------===//
//
// Reading the files (size and nesting limits), the error form every stage
// uses, GPT-2's byte alphabet and split pattern, and small text helpers.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

namespace hflow::data::hf {

[[noreturn]] void TokenizerFile::fail(const std::string &where, const std::string &msg) const {
  throw std::runtime_error("tokenizer '" + path + "'" + (where.empty() ? "" : ": " + where) +
                           ": " + msg);
}

std::string typeOf(const json &j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : "";
}

const char kReplacement[] = "\xEF\xBF\xBD"; // U+FFFD

std::string encodeCp(int32_t cp) {
  std::string s;
  appendUtf8(s, (uint32_t)cp);
  return s;
}

bool isWhiteSpace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

void replaceAll(std::string &s, const std::string &from, const std::string &to) {
  if (from.empty())
    return;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string::npos) {
      out.append(s, i, std::string::npos);
      break;
    }
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
  }
  s.swap(out);
}

std::string readFile(const std::string &path, const std::string &what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(EISDIR));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parseJsonFile(const std::string &path, const std::string &what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      (uintmax_t)st.st_size > kMaxTokenizerFileBytes)
    throw std::runtime_error(what + " '" + path + "' has " + std::to_string(st.st_size) +
                             " bytes, more than the " +
                             std::to_string(kMaxTokenizerFileBytes >> 20) +
                             " MiB hflow reads (the limit)");
  std::string text = readFile(path, what);
  struct TooDeep {};
  try {
    return json::parse(text, [](int depth, json::parse_event_t, json &) {
      if (depth > kMaxJsonDepth)
        throw TooDeep{};
      return true;
    });
  } catch (const TooDeep &) {
    throw std::runtime_error(what + " '" + path + "' nests deeper than " +
                             std::to_string(kMaxJsonDepth) + " levels (the limit)");
  } catch (const json::exception &e) { // parse errors and number overflow (out_of_range)
    std::string m = e.what();
    auto p = m.find("] ");
    throw std::runtime_error(what + " '" + path + "' is not valid JSON: " +
                             (p == std::string::npos ? m : m.substr(p + 2)));
  }
}

bool fileExists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirOf(const std::string &path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

const ByteAlphabet &byteAlphabet() {
  static const ByteAlphabet a;
  return a;
}

const char *kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

} // namespace hflow::data::hf
