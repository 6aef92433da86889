//===- HfPreTokenizer.cpp - the Hugging Face tokenizer: pre-tokenizers -----===//
//
// tokenizer.json's "pre_tokenizer": Split (a PCRE2 regex or a String, with
// its four behaviours) and ByteLevel (the prefix space and GPT-2's split),
// in a Sequence or alone.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

namespace hflow::data::hf {

void PreTokenizerChain::load(const json &p, const std::string &where, const TokenizerFile &f) {
  if (p.is_null())
    return;
  std::string type = typeOf(p);
  if (type == "Sequence") {
    const json &list = p.value("pretokenizers", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      load(list[k], where + ".pretokenizers[" + std::to_string(k) + "]", f);
    return;
  }
  Step x{Step::Split};
  if (type == "Split") {
    if (p.value("invert", false))
      f.fail(where, "an inverted Split is not supported");
    const json &pat = p.value("pattern", json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string())
      x.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(),
                                        "tokenizer '" + f.path + "': " + where + ".pattern");
    else if (pat.contains("String") && pat["String"].is_string())
      x.literal = pat["String"].get<std::string>();
    else
      f.fail(where + ".pattern", "needs a Regex or a String");
    if (!x.regex && x.literal.empty())
      f.fail(where + ".pattern", "the String is empty");
    std::string b = p.value("behavior", std::string("Isolated"));
    if (b == "Isolated")
      x.behavior = Step::Isolated;
    else if (b == "Removed")
      x.behavior = Step::Removed;
    else if (b == "MergedWithPrevious")
      x.behavior = Step::MergedWithPrevious;
    else if (b == "MergedWithNext")
      x.behavior = Step::MergedWithNext;
    else
      f.fail(where + ".behavior", "behavior '" + b + "' is not supported");
  } else if (type == "ByteLevel") {
    x.kind = Step::ByteLevel;
    x.addPrefixSpace = p.value("add_prefix_space", false);
    x.useRegex = p.value("use_regex", true);
    if (x.useRegex)
      x.regex = std::make_shared<Regex>(kGpt2Pattern, "the GPT-2 pattern");
    byteLevel_ = true;
  } else
    f.fail(where, "pre-tokenizer '" + type + "' is not supported (supported: Split, "
                  "ByteLevel, Sequence)");
  steps_.push_back(x);
}

void PreTokenizerChain::splitWith(const Step &p, const std::string &s, Pieces &out) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (p.regex)
    p.regex->findAll(s, [&](size_t b, size_t e) { matches.emplace_back(b, e); });
  else
    for (size_t i = s.find(p.literal); i != std::string::npos;
         i = s.find(p.literal, i + p.literal.size()))
      matches.emplace_back(i, i + p.literal.size());
  auto emit = [&](size_t b, size_t e) {
    if (e > b)
      out.push_back(s.substr(b, e - b));
  };
  size_t last = 0;
  switch (p.behavior) {
  case Step::Isolated:
  case Step::Removed:
    for (auto [b, e] : matches) {
      emit(last, b);
      if (p.behavior == Step::Isolated)
        emit(b, e);
      last = e;
    }
    emit(last, s.size());
    break;
  case Step::MergedWithPrevious:
    for (auto [b, e] : matches) {
      emit(last, e);
      last = e;
    }
    emit(last, s.size());
    break;
  case Step::MergedWithNext:
    for (auto [b, e] : matches) {
      emit(last, b);
      last = b;
    }
    emit(last, s.size());
    break;
  }
}

Pieces PreTokenizerChain::apply(const std::string &text) const {
  Pieces pieces{text};
  if (text.empty())
    return {};
  for (const auto &p : steps_) {
    Pieces next;
    for (std::string &piece : pieces) {
      if (p.kind == Step::Split) {
        splitWith(p, piece, next);
        continue;
      }
      // ByteLevel: the prefix space, the GPT-2 split, then bytes -> chars
      // (done by the model: the pieces stay raw bytes).
      if (p.addPrefixSpace && piece[0] != ' ')
        piece = " " + piece;
      if (p.useRegex)
        splitWith(p, piece, next);
      else
        next.push_back(std::move(piece));
    }
    pieces.swap(next);
  }
  return pieces;
}

} // namespace hflow::data::hf
