//===- HfNormalizer.cpp - the Hugging Face tokenizer: normalizers ----------===//
//
// tokenizer.json's "normalizer": Unicode normal forms (utf8proc), Prepend
// and Replace (a String pattern), in a Sequence or alone.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <utf8proc.h>

#include <cstdlib>

namespace hflow::data::hf {

void NormalizerChain::load(const json &n, const std::string &where, const TokenizerFile &f) {
  path_ = f.path;
  if (n.is_null())
    return;
  std::string type = typeOf(n);
  if (type == "Sequence") {
    const json &list = n.value("normalizers", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      load(list[k], where + ".normalizers[" + std::to_string(k) + "]", f);
    return;
  }
  Step x{Step::NFC, "", ""};
  if (type == "NFC")
    x.kind = Step::NFC;
  else if (type == "NFD")
    x.kind = Step::NFD;
  else if (type == "NFKC")
    x.kind = Step::NFKC;
  else if (type == "NFKD")
    x.kind = Step::NFKD;
  else if (type == "Prepend") {
    x.kind = Step::Prepend;
    x.a = n.value("prepend", std::string());
  } else if (type == "Replace") {
    x.kind = Step::Replace;
    const json &p = n.value("pattern", json::object());
    if (!p.contains("String") || !p["String"].is_string())
      f.fail(where + ".pattern", "only a String pattern is supported for Replace");
    x.a = p["String"].get<std::string>();
    x.b = n.value("content", std::string());
  } else
    f.fail(where, "normalizer '" + type + "' is not supported (supported: NFC, NFD, "
                  "NFKC, NFKD, Prepend, Replace, Sequence)");
  steps_.push_back(x);
}

std::string NormalizerChain::apply(std::string s) const {
  for (const auto &x : steps_) {
    switch (x.kind) {
    case Step::Prepend:
      if (!s.empty())
        s = x.a + s;
      break;
    case Step::Replace:
      replaceAll(s, x.a, x.b);
      break;
    default: {
      int opts = UTF8PROC_STABLE;
      if (x.kind == Step::NFC || x.kind == Step::NFKC)
        opts |= UTF8PROC_COMPOSE;
      else
        opts |= UTF8PROC_DECOMPOSE;
      if (x.kind == Step::NFKC || x.kind == Step::NFKD)
        opts |= UTF8PROC_COMPAT;
      if (s.empty())
        break;
      utf8proc_uint8_t *dst = nullptr;
      utf8proc_ssize_t len =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                       (utf8proc_ssize_t)s.size(), &dst, (utf8proc_option_t)opts);
      if (len < 0)
        throw std::runtime_error(std::string("tokenizer '") + path_ +
                                 "': Unicode normalization failed: " +
                                 utf8proc_errmsg(len));
      s.assign(reinterpret_cast<const char *>(dst), (size_t)len);
      std::free(dst);
    }
    }
  }
  return s;
}

} // namespace hflow::data::hf
