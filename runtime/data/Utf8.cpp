//===- Utf8.cpp - the one UTF-8 codec of the readers --------------------------===//
#include "runtime/data/Utf8.h"

namespace hflow::data {

size_t utf8SequenceLength(const unsigned char *s, size_t i, size_t n) {
  unsigned char c = s[i];
  if (c < 0x80)
    return 1;
  auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF)
    return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2))
      return 0;
    unsigned char c1 = s[i + 1];
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F))
      return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3))
      return 0;
    unsigned char c1 = s[i + 1];
    if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))
      return 0;
    return 4;
  }
  return 0;
}

size_t utf8InvalidRunLength(const unsigned char *s, size_t i, size_t n) {
  unsigned char c = s[i];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0)
      lo = 0xA0;
    if (c == 0xED)
      hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0)
      lo = 0x90;
    if (c == 0xF4)
      hi = 0x8F;
  } else
    return 1;
  size_t k = 1;
  if (i + k < n && s[i + k] >= lo && s[i + k] <= hi) {
    ++k;
    while (k <= need && i + k < n && (s[i + k] & 0xC0) == 0x80)
      ++k;
  }
  return k;
}

std::string lossyUtf8(const std::string &bytes) {
  const auto *s = reinterpret_cast<const unsigned char *>(bytes.data());
  size_t n = bytes.size(), i = 0;
  std::string out;
  out.reserve(n);
  while (i < n) {
    size_t len = utf8SequenceLength(s, i, n);
    if (len) {
      out.append(bytes, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD"; // U+FFFD
      i += utf8InvalidRunLength(s, i, n);
    }
  }
  return out;
}

bool isValidUtf8(const std::string &bytes) {
  const auto *s = reinterpret_cast<const unsigned char *>(bytes.data());
  for (size_t i = 0, n = bytes.size(); i < n;) {
    size_t len = utf8SequenceLength(s, i, n);
    if (!len)
      return false;
    i += len;
  }
  return true;
}

int32_t decodeValidUtf8(const std::string &s, size_t i, size_t &len) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  unsigned char c = p[i];
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if (c < 0xE0) {
    len = 2;
    return ((c & 0x1F) << 6) | (p[i + 1] & 0x3F);
  }
  if (c < 0xF0) {
    len = 3;
    return ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
  }
  len = 4;
  return ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
         (p[i + 3] & 0x3F);
}

void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decodeUtf8Lenient(const std::string &s, size_t &i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  i += len;
  return cp;
}

} // namespace hflow::data
