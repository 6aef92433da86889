//===- TemplateLexer.cpp - the renderer's text rewrites and tokens ----------===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <cstring>

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

std::vector<Token> tokenize(const MappedText &m, uint32_t endPos) {
  const std::u32string &s = m.s;
  const size_t n = s.size();
  std::vector<Token> toks;
  size_t cur = 0;
  int curlyDepth = 0;
  auto posAt = [&](size_t i) { return i < n ? m.pos[i] : endPos; };
  auto fail = [&](size_t i, const std::string &msg) { throw Located(posAt(i), msg); };
  auto at = [&](size_t i) -> char32_t { return i < n ? s[i] : 0; };
  auto startsWith = [&](size_t i, const char *lit) {
    for (size_t k = 0; lit[k]; ++k)
      if (at(i + k) != static_cast<char32_t>(lit[k]))
        return false;
    return true;
  };
  auto push = [&](TT t, std::string v, size_t i) { toks.push_back(Token{t, std::move(v), posAt(i)}); };
  auto stripTrailing = [&] {
    if (!toks.empty() && toks.back().type == TT::Text) {
      toks.back().value = trimEnd(toks.back().value);
      if (toks.back().value.empty())
        toks.pop_back();
    }
  };
  auto skipSpace = [&] {
    while (cur < n && isJsSpace(s[cur]))
      ++cur;
  };
  auto isDigit = [](char32_t c) { return c >= '0' && c <= '9'; };
  auto digits = [&] {
    std::string d;
    while (cur < n && isDigit(s[cur]))
      d += static_cast<char>(s[cur++]);
    return d;
  };
  static const std::pair<const char *, TT> table[] = {
      {"{%", TT::OpenStmt}, {"%}", TT::CloseStmt}, {"{{", TT::OpenExpr}, {"}}", TT::CloseExpr},
      {"(", TT::OpenParen}, {")", TT::CloseParen}, {"{", TT::OpenCurly}, {"}", TT::CloseCurly},
      {"[", TT::OpenSquare}, {"]", TT::CloseSquare}, {",", TT::Comma}, {".", TT::Dot},
      {":", TT::Colon}, {"|", TT::Pipe}, {"<=", TT::Comparison}, {">=", TT::Comparison},
      {"==", TT::Comparison}, {"!=", TT::Comparison}, {"<", TT::Comparison}, {">", TT::Comparison},
      {"+", TT::Additive}, {"-", TT::Additive}, {"~", TT::Additive}, {"**", TT::Power},
      {"*", TT::Multiplicative}, {"//", TT::Multiplicative}, {"/", TT::Multiplicative},
      {"%", TT::Multiplicative}, {"=", TT::Equals}};

  while (cur < n) {
    TT last = toks.empty() ? TT::End : toks.back().type;
    if (toks.empty() || last == TT::CloseStmt || last == TT::CloseExpr || last == TT::Comment) {
      size_t start = cur;
      std::u32string text;
      while (cur < n && !(s[cur] == '{' && (at(cur + 1) == '%' || at(cur + 1) == '{' || at(cur + 1) == '#')))
        text += s[cur++];
      if (!text.empty()) {
        push(TT::Text, toUtf8(text), start);
        continue;
      }
    }
    if (s[cur] == '{' && at(cur + 1) == '#') {
      size_t start = cur;
      cur += 2;
      bool stripBefore = at(cur) == '-';
      if (stripBefore)
        ++cur;
      std::u32string comment;
      while (!(at(cur) == '#' && at(cur + 1) == '}')) {
        if (cur + 2 >= n)
          fail(start, "missing end of comment tag '#}'");
        comment += s[cur++];
      }
      bool stripAfter = !comment.empty() && comment.back() == '-';
      if (stripAfter)
        comment.pop_back();
      if (stripBefore)
        stripTrailing();
      push(TT::Comment, toUtf8(comment), start);
      cur += 2;
      if (stripAfter)
        skipSpace();
      continue;
    }
    if (startsWith(cur, "{%-")) {
      stripTrailing();
      push(TT::OpenStmt, "{%", cur);
      cur += 3;
      continue;
    }
    if (startsWith(cur, "{{-")) {
      stripTrailing();
      push(TT::OpenExpr, "{{", cur);
      curlyDepth = 0;
      cur += 3;
      continue;
    }
    skipSpace();
    if (cur >= n)
      fail(cur, "unexpected end of template inside a tag");
    if (startsWith(cur, "-%}")) {
      push(TT::CloseStmt, "%}", cur);
      cur += 3;
      skipSpace();
      continue;
    }
    if (startsWith(cur, "-}}")) {
      push(TT::CloseExpr, "}}", cur);
      cur += 3;
      skipSpace();
      continue;
    }
    char32_t ch = s[cur];
    if (ch == '-' || ch == '+') {
      TT lt = toks.empty() ? TT::End : toks.back().type;
      if (toks.empty() || lt == TT::Text)
        fail(cur, std::string("unexpected character '") + static_cast<char>(ch) + "'");
      if (!(lt == TT::Ident || lt == TT::Numeric || lt == TT::String || lt == TT::CloseParen ||
            lt == TT::CloseSquare)) {
        size_t start = cur;
        ++cur;
        std::string num = digits();
        if (!num.empty() && at(cur) == '.' && isDigit(at(cur + 1))) {
          ++cur;
          num += "." + digits();
        }
        push(num.empty() ? TT::Unary : TT::Numeric, std::string(1, static_cast<char>(ch)) + num, start);
        continue;
      }
    }
    bool matched = false;
    for (auto &entry : table) {
      if (entry.second == TT::CloseExpr && curlyDepth > 0)
        continue;
      if (startsWith(cur, entry.first)) {
        push(entry.second, entry.first, cur);
        if (entry.second == TT::OpenExpr)
          curlyDepth = 0;
        else if (entry.second == TT::OpenCurly)
          ++curlyDepth;
        else if (entry.second == TT::CloseCurly)
          --curlyDepth;
        cur += std::strlen(entry.first);
        matched = true;
        break;
      }
    }
    if (matched)
      continue;
    if (ch == '\'' || ch == '"') {
      size_t start = cur;
      ++cur;
      std::string str;
      while (true) {
        if (cur >= n)
          fail(start, "unterminated string literal");
        char32_t c = s[cur];
        if (c == ch)
          break;
        if (c == '\\') {
          ++cur;
          if (cur >= n)
            fail(start, "unterminated string literal");
          char32_t e = s[cur++];
          if (e == 'x' || e == 'u') {
            size_t len = e == 'x' ? 2 : 4;
            uint32_t v = 0;
            for (size_t k = 0; k < len; ++k) {
              char32_t h = at(cur + k);
              int d = (h >= '0' && h <= '9')   ? int(h - '0')
                      : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                      : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                               : -1;
              if (d < 0)
                fail(cur - 2, "invalid hexadecimal escape sequence");
              v = v * 16 + static_cast<uint32_t>(d);
            }
            cur += len;
            // A UTF-16 surrogate pair written as two \u escapes.
            if (v >= 0xD800 && v <= 0xDBFF && at(cur) == '\\' && at(cur + 1) == 'u') {
              uint32_t lo = 0;
              bool ok = true;
              for (size_t k = 0; k < 4; ++k) {
                char32_t h = at(cur + 2 + k);
                int d = (h >= '0' && h <= '9')   ? int(h - '0')
                        : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                        : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                                 : -1;
                if (d < 0)
                  ok = false;
                else
                  lo = lo * 16 + static_cast<uint32_t>(d);
              }
              if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                cur += 6;
              }
            }
            appendUtf8(str, v);
            continue;
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
            fail(cur - 2, "unexpected escaped character '" + ec + "'");
          }
          }
          continue;
        }
        appendUtf8(str, c);
        ++cur;
      }
      push(TT::String, str, start);
      ++cur;
      continue;
    }
    if (isDigit(ch)) {
      size_t start = cur;
      std::string num = digits();
      if ((toks.empty() || toks.back().type != TT::Dot) && at(cur) == '.' && isDigit(at(cur + 1))) {
        ++cur;
        num += "." + digits();
      }
      push(TT::Numeric, num, start);
      continue;
    }
    if (isAsciiWord(ch)) {
      size_t start = cur;
      std::string w;
      while (cur < n && isAsciiWord(s[cur]))
        w += static_cast<char>(s[cur++]);
      push(TT::Ident, w, start);
      continue;
    }
    std::string cs;
    appendUtf8(cs, ch);
    fail(cur, "unexpected character '" + cs + "'");
  }
  return toks;
}

} // namespace hflow::data::tmpl
