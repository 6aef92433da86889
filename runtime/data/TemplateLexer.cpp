//===- TemplateLexer.cpp - the renderer's text rewrites and tokens ----------===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace hflow::data::tmpl {

bool isLineTerminator(char32_t c) { return c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029; }

MappedText preprocess(const std::u32string &src) {
  MappedText a;
  size_t n = src.size();
  if (n && src[n - 1] == '\n')
    --n;
  // lstrip_blocks: blanks at a line start before {%, {# or {-.
  for (size_t i = 0; i < n;) {
    if (i == 0 || isLineTerminator(src[i - 1])) {
      size_t j = i;
      while (j < n && (src[j] == ' ' || src[j] == '\t'))
        ++j;
      if (j + 1 < n && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
        i = j;
        a.push(src[i], static_cast<uint32_t>(i));
        ++i;
        continue;
      }
    }
    a.push(src[i], static_cast<uint32_t>(i));
    ++i;
  }
  // trim_blocks: the newline after %}, #} or -}.
  MappedText b;
  for (size_t i = 0; i < a.s.size();) {
    if (i + 2 < a.s.size() && (a.s[i] == '#' || a.s[i] == '%' || a.s[i] == '-') && a.s[i + 1] == '}' &&
        a.s[i + 2] == '\n') {
      b.push(a.s[i], a.pos[i]);
      b.push(a.s[i + 1], a.pos[i + 1]);
      i += 3;
      continue;
    }
    b.push(a.s[i], a.pos[i]);
    ++i;
  }
  // {% generation %} / {% endgeneration %} are dropped, with the blanks
  // around them when the tag has "-" on that side.
  MappedText c;
  const std::u32string &t = b.s;
  size_t floor = 0; // where the last match ended
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '{' && i + 1 < t.size() && t[i + 1] == '%') {
      size_t j = i + 2;
      bool lstrip = false, rstrip = false;
      if (j < t.size() && t[j] == '-')
        lstrip = true, ++j;
      while (j < t.size() && isJsSpace(t[j]))
        ++j;
      static const std::u32string kEnd = U"end", kGen = U"generation";
      if (t.compare(j, 3, kEnd) == 0)
        j += 3;
      if (t.compare(j, kGen.size(), kGen) == 0) {
        j += kGen.size();
        while (j < t.size() && isJsSpace(t[j]))
          ++j;
        if (j < t.size() && t[j] == '-')
          rstrip = true, ++j;
        if (j + 1 < t.size() && t[j] == '%' && t[j + 1] == '}') {
          j += 2;
          if (lstrip) {
            size_t k = c.s.size();
            // Drop the blanks just before (not before the previous match).
            size_t keep = i;
            while (keep > floor && isJsSpace(t[keep - 1]))
              --keep;
            size_t drop = i - keep;
            c.s.resize(k - drop);
            c.pos.resize(k - drop);
          }
          size_t after = j;
          while (after < t.size() && isJsSpace(t[after]))
            ++after;
          if (!rstrip)
            for (size_t k = j; k < after; ++k)
              c.push(t[k], b.pos[k]);
          i = after;
          floor = after;
          continue;
        }
      }
    }
    c.push(t[i], b.pos[i]);
    ++i;
  }
  return c;
}

const char *ttName(TT t) {
  switch (t) {
  case TT::Text: return "text";
  case TT::Numeric: return "number";
  case TT::String: return "string";
  case TT::Ident: return "identifier";
  case TT::Equals: return "'='";
  case TT::OpenParen: return "'('";
  case TT::CloseParen: return "')'";
  case TT::OpenStmt: return "'{%'";
  case TT::CloseStmt: return "'%}'";
  case TT::OpenExpr: return "'{{'";
  case TT::CloseExpr: return "'}}'";
  case TT::OpenSquare: return "'['";
  case TT::CloseSquare: return "']'";
  case TT::OpenCurly: return "'{'";
  case TT::CloseCurly: return "'}'";
  case TT::Comma: return "','";
  case TT::Dot: return "'.'";
  case TT::Colon: return "':'";
  case TT::Pipe: return "'|'";
  case TT::Additive: return "operator";
  case TT::Multiplicative: return "operator";
  case TT::Power: return "'**'";
  case TT::Comparison: return "comparison";
  case TT::Unary: return "unary operator";
  case TT::Comment: return "comment";
  case TT::End: return "end of template";
  }
  return "?";
}

namespace {

/// -1, or the value of one hexadecimal digit.
int hexValue(char32_t h) {
  return (h >= '0' && h <= '9')   ? int(h - '0')
         : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
         : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                  : -1;
}

bool isDigit(char32_t c) { return c >= '0' && c <= '9'; }

/// The punctuation and operators inside a tag, longest first where one is
/// the start of another (as @huggingface/jinja's lexer orders them).
const std::pair<const char *, TT> kPunctuation[] = {
    {"{%", TT::OpenStmt}, {"%}", TT::CloseStmt}, {"{{", TT::OpenExpr}, {"}}", TT::CloseExpr},
    {"(", TT::OpenParen}, {")", TT::CloseParen}, {"{", TT::OpenCurly}, {"}", TT::CloseCurly},
    {"[", TT::OpenSquare}, {"]", TT::CloseSquare}, {",", TT::Comma}, {".", TT::Dot},
    {":", TT::Colon}, {"|", TT::Pipe}, {"<=", TT::Comparison}, {">=", TT::Comparison},
    {"==", TT::Comparison}, {"!=", TT::Comparison}, {"<", TT::Comparison}, {">", TT::Comparison},
    {"+", TT::Additive}, {"-", TT::Additive}, {"~", TT::Additive}, {"**", TT::Power},
    {"*", TT::Multiplicative}, {"//", TT::Multiplicative}, {"/", TT::Multiplicative},
    {"%", TT::Multiplicative}, {"=", TT::Equals}};

/// One template's tokens: text between tags, comments, and each tag's
/// punctuation, strings, numbers and names, with whitespace control.
class Lexer {
public:
  Lexer(const MappedText &m, uint32_t endPos) : m_(m), s_(m.s), n_(m.s.size()), end_(endPos) {}

  std::vector<Token> run() {
    while (cur_ < n_) {
      if (text() || comment() || openTrimmed())
        continue;
      skipSpace();
      if (cur_ >= n_)
        fail(cur_, "unexpected end of template inside a tag");
      if (closeTrimmed() || signedNumber() || punctuation() || string() || number() || word())
        continue;
      std::string cs;
      appendUtf8(cs, s_[cur_]);
      fail(cur_, "unexpected character '" + cs + "'");
    }
    return std::move(toks_);
  }

private:
  uint32_t posAt(size_t i) const { return i < n_ ? m_.pos[i] : end_; }
  [[noreturn]] void fail(size_t i, const std::string &msg) const { throw Located(posAt(i), msg); }
  char32_t at(size_t i) const { return i < n_ ? s_[i] : 0; }
  bool startsWith(size_t i, const char *lit) const {
    for (size_t k = 0; lit[k]; ++k)
      if (at(i + k) != static_cast<char32_t>(lit[k]))
        return false;
    return true;
  }
  TT last() const { return toks_.empty() ? TT::End : toks_.back().type; }
  void push(TT t, std::string v, size_t i) { toks_.push_back(Token{t, std::move(v), posAt(i)}); }
  /// `{%-`, `{{-`, `{#-`: the text before loses its trailing whitespace.
  void stripTrailing() {
    if (!toks_.empty() && toks_.back().type == TT::Text) {
      toks_.back().value = trimEnd(toks_.back().value);
      if (toks_.back().value.empty())
        toks_.pop_back();
    }
  }
  void skipSpace() {
    while (cur_ < n_ && isJsSpace(s_[cur_]))
      ++cur_;
  }
  std::string digits() {
    std::string d;
    while (cur_ < n_ && isDigit(s_[cur_]))
      d += static_cast<char>(s_[cur_++]);
    return d;
  }

  /// Text up to the next tag, where no tag is open.
  bool text() {
    const TT l = last();
    if (!(toks_.empty() || l == TT::CloseStmt || l == TT::CloseExpr || l == TT::Comment))
      return false;
    size_t start = cur_;
    std::u32string t;
    while (cur_ < n_ &&
           !(s_[cur_] == '{' && (at(cur_ + 1) == '%' || at(cur_ + 1) == '{' || at(cur_ + 1) == '#')))
      t += s_[cur_++];
    if (t.empty())
      return false;
    push(TT::Text, toUtf8(t), start);
    return true;
  }

  /// `{# ... #}`, with `-` on either side trimming the whitespace there.
  bool comment() {
    if (!(s_[cur_] == '{' && at(cur_ + 1) == '#'))
      return false;
    size_t start = cur_;
    cur_ += 2;
    bool stripBefore = at(cur_) == '-';
    if (stripBefore)
      ++cur_;
    std::u32string c;
    while (!(at(cur_) == '#' && at(cur_ + 1) == '}')) {
      if (cur_ + 2 >= n_)
        fail(start, "missing end of comment tag '#}'");
      c += s_[cur_++];
    }
    bool stripAfter = !c.empty() && c.back() == '-';
    if (stripAfter)
      c.pop_back();
    if (stripBefore)
      stripTrailing();
    push(TT::Comment, toUtf8(c), start);
    cur_ += 2;
    if (stripAfter)
      skipSpace();
    return true;
  }

  /// `{%-` and `{{-`.
  bool openTrimmed() {
    if (startsWith(cur_, "{%-")) {
      stripTrailing();
      push(TT::OpenStmt, "{%", cur_);
      cur_ += 3;
      return true;
    }
    if (startsWith(cur_, "{{-")) {
      stripTrailing();
      push(TT::OpenExpr, "{{", cur_);
      curlyDepth_ = 0;
      cur_ += 3;
      return true;
    }
    return false;
  }

  /// `-%}` and `-}}`: the whitespace after is skipped.
  bool closeTrimmed() {
    for (auto [lit, t, v] : {std::tuple{"-%}", TT::CloseStmt, "%}"},
                             std::tuple{"-}}", TT::CloseExpr, "}}"}})
      if (startsWith(cur_, lit)) {
        push(t, v, cur_);
        cur_ += 3;
        skipSpace();
        return true;
      }
    return false;
  }

  /// `-` or `+` where no operand precedes it: a signed number, or a unary
  /// operator.
  bool signedNumber() {
    const char32_t ch = s_[cur_];
    if (ch != '-' && ch != '+')
      return false;
    const TT lt = last();
    if (toks_.empty() || lt == TT::Text)
      fail(cur_, std::string("unexpected character '") + static_cast<char>(ch) + "'");
    if (lt == TT::Ident || lt == TT::Numeric || lt == TT::String || lt == TT::CloseParen ||
        lt == TT::CloseSquare)
      return false;
    size_t start = cur_;
    ++cur_;
    std::string num = digits();
    if (!num.empty() && at(cur_) == '.' && isDigit(at(cur_ + 1))) {
      ++cur_;
      num += "." + digits();
    }
    push(num.empty() ? TT::Unary : TT::Numeric, std::string(1, static_cast<char>(ch)) + num, start);
    return true;
  }

  bool punctuation() {
    for (auto &entry : kPunctuation) {
      if (entry.second == TT::CloseExpr && curlyDepth_ > 0)
        continue;
      if (!startsWith(cur_, entry.first))
        continue;
      push(entry.second, entry.first, cur_);
      if (entry.second == TT::OpenExpr)
        curlyDepth_ = 0;
      else if (entry.second == TT::OpenCurly)
        ++curlyDepth_;
      else if (entry.second == TT::CloseCurly)
        --curlyDepth_;
      cur_ += std::strlen(entry.first);
      return true;
    }
    return false;
  }

  /// `\xHH` or `\uHHHH` at cur_ (after the letter): its code point, a UTF-16
  /// surrogate pair written as two \u escapes joined.
  uint32_t hexEscape(char32_t e) {
    const size_t len = e == 'x' ? 2 : 4;
    uint32_t v = 0;
    for (size_t k = 0; k < len; ++k) {
      int d = hexValue(at(cur_ + k));
      if (d < 0)
        fail(cur_ - 2, "invalid hexadecimal escape sequence");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    cur_ += len;
    if (v >= 0xD800 && v <= 0xDBFF && at(cur_) == '\\' && at(cur_ + 1) == 'u') {
      uint32_t lo = 0;
      bool ok = true;
      for (size_t k = 0; k < 4; ++k) {
        int d = hexValue(at(cur_ + 2 + k));
        if (d < 0)
          ok = false;
        else
          lo = lo * 16 + static_cast<uint32_t>(d);
      }
      if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        cur_ += 6;
      }
    }
    return v;
  }

  /// One escape after a backslash, appended to `str`.
  void escape(size_t start, std::string &str) {
    ++cur_;
    if (cur_ >= n_)
      fail(start, "unterminated string literal");
    char32_t e = s_[cur_++];
    if (e == 'x' || e == 'u') {
      appendUtf8(str, hexEscape(e));
      return;
    }
    switch (e) {
    case 'n': str += '\n'; break;
    case 't': str += '\t'; break;
    case 'r': str += '\r'; break;
    case 'b': str += '\b'; break;
    case 'f': str += '\f'; break;
    case 'v': str += '\v'; break;
    case '\'': str += '\''; break;
    case '"': str += '"'; break;
    case '\\': str += '\\'; break;
    default: {
      std::string ec;
      appendUtf8(ec, e);
      fail(cur_ - 2, "unexpected escaped character '" + ec + "'");
    }
    }
  }

  bool string() {
    const char32_t quote = s_[cur_];
    if (quote != '\'' && quote != '"')
      return false;
    size_t start = cur_;
    ++cur_;
    std::string str;
    while (true) {
      if (cur_ >= n_)
        fail(start, "unterminated string literal");
      char32_t c = s_[cur_];
      if (c == quote)
        break;
      if (c == '\\') {
        escape(start, str);
        continue;
      }
      appendUtf8(str, c);
      ++cur_;
    }
    push(TT::String, str, start);
    ++cur_;
    return true;
  }

  /// Digits, and a fraction unless the number follows a dot (`x.0.1`).
  bool number() {
    if (!isDigit(s_[cur_]))
      return false;
    size_t start = cur_;
    std::string num = digits();
    if (last() != TT::Dot && at(cur_) == '.' && isDigit(at(cur_ + 1))) {
      ++cur_;
      num += "." + digits();
    }
    push(TT::Numeric, num, start);
    return true;
  }

  bool word() {
    if (!isAsciiWord(s_[cur_]))
      return false;
    size_t start = cur_;
    std::string w;
    while (cur_ < n_ && isAsciiWord(s_[cur_]))
      w += static_cast<char>(s_[cur_++]);
    push(TT::Ident, w, start);
    return true;
  }

  const MappedText &m_;
  const std::u32string &s_;
  const size_t n_;
  const uint32_t end_;
  std::vector<Token> toks_;
  size_t cur_ = 0;
  int curlyDepth_ = 0;
};

} // namespace

std::vector<Token> tokenize(const MappedText &m, uint32_t endPos) { return Lexer(m, endPos).run(); }

} // namespace hflow::data::tmpl
