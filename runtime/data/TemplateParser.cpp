//===- TemplateParser.cpp - tokens to the syntax tree, checked for the supported subset ---===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <utility>

namespace hflow::data::tmpl {

NodeP node(NK k, uint32_t p) { return NodeP(new Node(k, p)); }

const std::set<std::string> kTests = {"boolean", "callable", "odd", "even", "false", "true", "none",
                                      "string", "number", "integer", "iterable", "mapping",
                                      "sequence", "lower", "upper", "defined", "undefined",
                                      "equalto", "eq"};

const std::set<std::string> kPlainFilters = {
    "safe", "tojson", "list", "first", "last", "length", "reverse", "sort", "join", "string",
    "unique", "upper", "lower", "title", "capitalize", "trim", "indent", "int", "float",
    "abs", "items", "get", "keys", "values", "dictsort", "bool"};

const std::set<std::string> kCallFilters = {
    "tojson", "join", "int", "float", "default", "sort", "selectattr", "rejectattr", "map",
    "indent", "replace", "get", "items", "keys", "values", "dictsort"};

const std::set<std::string> kMethods = {"upper", "lower", "strip", "title", "capitalize",
                                        "rstrip", "lstrip", "startswith", "endswith", "split",
                                        "replace", "get", "items", "keys", "values", "dictsort"};

const std::set<std::string> kGlobalFunctions = {"namespace", "raise_exception", "range",
                                                "strftime_now"};

class Parser {
public:
  explicit Parser(std::vector<Token> toks, uint32_t endPos) : t_(std::move(toks)), endPos_(endPos) {}

  std::vector<NodeP> parseProgram() {
    std::vector<NodeP> body;
    while (i_ < t_.size())
      body.push_back(parseAny());
    return body;
  }

  std::set<std::string> macroNames;
  std::vector<const Node *> calledNames; // Call nodes with an identifier callee

private:
  std::vector<Token> t_;
  size_t i_ = 0;
  uint32_t endPos_;
  int forDepth_ = 0;
  int depth_ = 0; ///< how deep the node being parsed will sit in the tree

  /// Bounds the tree's depth (kMaxTemplateDepth): every recursion and every
  /// link of a left-deep chain (a + b + c, a.b.c, x|f|g) goes one deeper,
  /// so neither the parser, nor the interpreter, nor the tree's destruction
  /// can overflow the stack on a hostile template.
  struct Deeper {
    Parser &p;
    int n = 0;
    explicit Deeper(Parser &parser, int initial = 1) : p(parser) {
      for (int k = 0; k < initial; ++k)
        more();
    }
    void more() {
      ++n;
      if (++p.depth_ > kMaxTemplateDepth)
        p.fail("the template nests deeper than " + std::to_string(kMaxTemplateDepth) +
               " levels (statements, expressions and chains of operators; the limit)");
    }
    ~Deeper() { p.depth_ -= n; }
    Deeper(const Deeper &) = delete;
    Deeper &operator=(const Deeper &) = delete;
  };

  const Token *peek(size_t k = 0) const { return i_ + k < t_.size() ? &t_[i_ + k] : nullptr; }
  uint32_t here() const { return i_ < t_.size() ? t_[i_].pos : endPos_; }
  [[noreturn]] void fail(const std::string &msg) const { throw Located(here(), msg); }
  [[noreturn]] void failAt(uint32_t p, const std::string &msg) const { throw Located(p, msg); }
  bool is(TT t) const { return i_ < t_.size() && t_[i_].type == t; }
  bool isIdent(const char *name, size_t k = 0) const {
    const Token *tk = peek(k);
    return tk && tk->type == TT::Ident && tk->value == name;
  }
  bool isStatement(std::initializer_list<const char *> names) const {
    const Token *a = peek(0), *b = peek(1);
    if (!a || a->type != TT::OpenStmt || !b || b->type != TT::Ident)
      return false;
    for (const char *nm : names)
      if (b->value == nm)
        return true;
    return false;
  }
  std::string found() const {
    if (i_ >= t_.size())
      return "end of template";
    const Token &tk = t_[i_];
    if (tk.type == TT::Ident || tk.type == TT::Additive || tk.type == TT::Multiplicative ||
        tk.type == TT::Comparison || tk.type == TT::Unary || tk.type == TT::Numeric)
      return "'" + tk.value + "'";
    if (tk.type == TT::String)
      return "string literal";
    return ttName(tk.type);
  }
  const Token &expect(TT type, const char *what) {
    if (!is(type))
      fail(std::string("expected ") + what + ", found " + found());
    return t_[i_++];
  }
  void expectIdent(const char *name) {
    if (!isIdent(name))
      fail(std::string("expected '") + name + "', found " + found());
    ++i_;
  }
  // Parses statements until one of `names` opens; fails at the end.
  void parseUntil(std::vector<NodeP> &out, std::initializer_list<const char *> names, uint32_t openPos,
                  const char *what) {
    while (!isStatement(names)) {
      if (i_ >= t_.size())
        failAt(openPos, std::string("unclosed '") + what + "' block (reached the end of the template)");
      out.push_back(parseAny());
    }
  }

  /// "{% NAME %}": the tag that closes a block.
  void expectEnd(const char *name) {
    expect(TT::OpenStmt, "'{%'");
    expectIdent(name);
    expect(TT::CloseStmt, "'%}'");
  }

  NodeP parseAny() {
    const Token &tk = t_[i_];
    switch (tk.type) {
    case TT::Comment:
      ++i_;
      return nullptr;
    case TT::Text: {
      NodeP nd = node(NK::Text, tk.pos);
      nd->s = tk.value;
      ++i_;
      return nd;
    }
    case TT::OpenStmt:
      return parseStatement();
    case TT::OpenExpr: {
      uint32_t p = tk.pos;
      ++i_;
      NodeP nd = node(NK::Output, p);
      nd->x = parseExpression();
      expect(TT::CloseExpr, "'}}'");
      return nd;
    }
    default:
      fail("unexpected " + found());
    }
  }

  NodeP parseStatement() {
    Deeper deeper(*this);
    uint32_t openPos = t_[i_].pos;
    ++i_;
    if (!is(TT::Ident))
      fail("expected a statement name after '{%', found " + found());
    std::string name = t_[i_].value;
    uint32_t namePos = t_[i_].pos;
    if (name == "set") {
      ++i_;
      return parseSet(openPos);
    }
    if (name == "if") {
      ++i_;
      NodeP nd = parseIf(openPos);
      expectEnd("endif");
      return nd;
    }
    if (name == "for") {
      ++i_;
      NodeP nd = parseFor(openPos);
      expectEnd("endfor");
      return nd;
    }
    if (name == "macro") {
      ++i_;
      NodeP nd = parseMacro(openPos);
      expectEnd("endmacro");
      return nd;
    }
    if (name == "break" || name == "continue") {
      if (forDepth_ == 0)
        failAt(namePos, "'" + name + "' outside a for loop");
      ++i_;
      expect(TT::CloseStmt, "'%}'");
      return node(name == "break" ? NK::Break : NK::Continue, namePos);
    }
    if (name == "filter") {
      ++i_;
      NodeP f = parseFilterCall(nullptr);
      expect(TT::CloseStmt, "'%}'");
      NodeP nd = node(NK::FilterBlock, openPos);
      nd->x = std::move(f);
      parseUntil(nd->a, {"endfilter"}, openPos, "filter");
      expectEnd("endfilter");
      return nd;
    }
    if (name == "call")
      failAt(namePos, "unsupported statement '{% call %}'");
    if (name == "else" || name == "elif" || name.compare(0, 3, "end") == 0)
      failAt(openPos, "unexpected '{% " + name + " %}' (no open block it belongs to)");
    failAt(namePos, "unsupported statement '" + name + "'");
  }

  NodeP parseSet(uint32_t openPos) {
    uint32_t targetPos = here();
    NodeP target = parseExpressionSequence(false);
    auto checkIdent = [&](const Node &nd) {
      if (nd.k != NK::Ident)
        failAt(nd.pos, "unsupported assignment target (expected a name)");
    };
    if (target->k == NK::TupleLit) {
      for (auto &e : target->a)
        checkIdent(*e);
    } else if (target->k == NK::Member) {
      if (target->flag)
        failAt(targetPos, "unsupported assignment target (only name.attribute)");
    } else {
      checkIdent(*target);
    }
    NodeP nd = node(NK::Set, openPos);
    nd->x = std::move(target);
    if (is(TT::Equals)) {
      ++i_;
      nd->y = parseExpressionSequence(false);
    } else {
      expect(TT::CloseStmt, "'=' or '%}'");
      parseUntil(nd->a, {"endset"}, openPos, "set");
      expect(TT::OpenStmt, "'{%'");
      expectIdent("endset");
    }
    expect(TT::CloseStmt, "'%}'");
    return nd;
  }

  NodeP parseIf(uint32_t openPos) {
    NodeP nd = node(NK::If, openPos);
    nd->x = parseExpression();
    expect(TT::CloseStmt, "'%}'");
    parseUntil(nd->a, {"elif", "else", "endif"}, openPos, "if");
    if (isStatement({"elif"})) {
      uint32_t p = t_[i_].pos;
      i_ += 2;
      nd->b.push_back(parseIf(p));
    } else if (isStatement({"else"})) {
      i_ += 2;
      expect(TT::CloseStmt, "'%}'");
      parseUntil(nd->b, {"endif"}, openPos, "if");
    }
    return nd;
  }

  NodeP parseFor(uint32_t openPos) {
    NodeP nd = node(NK::For, openPos);
    NodeP var = parseExpressionSequence(true);
    if (var->k == NK::Ident) {
      nd->a.push_back(std::move(var));
    } else if (var->k == NK::TupleLit) {
      for (auto &e : var->a) {
        if (e->k != NK::Ident)
          failAt(e->pos, "expected a name in the loop variables");
        nd->a.push_back(std::move(e));
      }
      nd->flag = true;
    } else {
      failAt(var->pos, "expected a name or names for the loop variable");
    }
    if (!isIdent("in"))
      fail("expected 'in' after the loop variable, found " + found());
    ++i_;
    NodeP iter = parseExpression();
    if (iter->k == NK::Select) {
      nd->x = std::move(iter->x);
      nd->y = std::move(iter->y);
    } else {
      nd->x = std::move(iter);
    }
    expect(TT::CloseStmt, "'%}'");
    ++forDepth_;
    parseUntil(nd->b, {"endfor", "else"}, openPos, "for");
    --forDepth_;
    if (isStatement({"else"})) {
      i_ += 2;
      expect(TT::CloseStmt, "'%}'");
      parseUntil(nd->c, {"endfor"}, openPos, "for");
    }
    return nd;
  }

  static bool mentions(const Node *nd, const std::set<std::string> &names) {
    if (!nd)
      return false;
    if (nd->k == NK::Ident && names.count(nd->s))
      return true;
    for (auto *v : {&nd->a, &nd->b, &nd->c})
      for (auto &ch : *v)
        if (mentions(ch.get(), names))
          return true;
    return mentions(nd->x.get(), names) || mentions(nd->y.get(), names) || mentions(nd->z.get(), names);
  }

  NodeP parseMacro(uint32_t openPos) {
    if (!is(TT::Ident))
      fail("expected the macro name, found " + found());
    NodeP nd = node(NK::Macro, openPos);
    nd->s = t_[i_++].value;
    expect(TT::OpenParen, "'('");
    std::set<std::string> seen;
    bool sawDefault = false;
    while (!is(TT::CloseParen)) {
      if (!is(TT::Ident))
        fail("expected a parameter name, found " + found());
      uint32_t p = here();
      std::string pname = t_[i_++].value;
      if (!seen.insert(pname).second)
        failAt(p, "duplicate parameter name '" + pname + "'");
      NodeP param;
      if (is(TT::Equals)) {
        ++i_;
        param = node(NK::Kwarg, p);
        param->s = pname;
        param->x = parseExpression();
        sawDefault = true;
      } else {
        if (sawDefault)
          failAt(p, "non-default parameter follows default parameter");
        param = node(NK::Ident, p);
        param->s = pname;
      }
      nd->a.push_back(std::move(param));
      if (is(TT::Comma))
        ++i_;
      else if (!is(TT::CloseParen))
        fail("expected ',' or ')', found " + found());
    }
    ++i_;
    expect(TT::CloseStmt, "'%}'");
    int savedFor = forDepth_;
    forDepth_ = 0;
    parseUntil(nd->b, {"endmacro"}, openPos, "macro");
    forDepth_ = savedFor;
    static const std::set<std::string> special = {"varargs", "kwargs", "caller"};
    for (auto &st : nd->b)
      if (mentions(st.get(), special))
        failAt(openPos, "unsupported in macros: varargs, kwargs and caller");
    for (auto &pa : nd->a)
      if (special.count(pa->s))
        failAt(pa->pos, "unsupported macro parameter '" + pa->s + "'");
    macroNames.insert(nd->s);
    return nd;
  }

  NodeP parseExpressionSequence(bool primary) {
    uint32_t p = here();
    NodeP first = primary ? parsePrimary() : parseExpression();
    if (!is(TT::Comma))
      return first;
    NodeP tup = node(NK::TupleLit, p);
    tup->a.push_back(std::move(first));
    while (is(TT::Comma)) {
      ++i_;
      tup->a.push_back(primary ? parsePrimary() : parseExpression());
    }
    return tup;
  }

  NodeP parseExpression() {
    Deeper deeper(*this);
    uint32_t p = here();
    NodeP a = parseOr();
    if (isIdent("if")) {
      ++i_;
      NodeP test = parseOr();
      if (isIdent("else")) {
        ++i_;
        NodeP f = parseExpression();
        NodeP nd = node(NK::Ternary, p);
        nd->x = std::move(test);
        nd->y = std::move(a);
        nd->z = std::move(f);
        return nd;
      }
      NodeP nd = node(NK::Select, p);
      nd->x = std::move(a);
      nd->y = std::move(test);
      return nd;
    }
    return a;
  }

  NodeP binary(const std::string &op, uint32_t p, NodeP l, NodeP r) {
    NodeP nd = node(NK::Binary, p);
    nd->s = op;
    nd->x = std::move(l);
    nd->y = std::move(r);
    return nd;
  }

  NodeP parseOr() {
    Deeper chain(*this, 0);
    NodeP l = parseAnd();
    while (isIdent("or")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      l = binary("or", p, std::move(l), parseAnd());
    }
    return l;
  }
  NodeP parseAnd() {
    Deeper chain(*this, 0);
    NodeP l = parseNot();
    while (isIdent("and")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      l = binary("and", p, std::move(l), parseNot());
    }
    return l;
  }
  NodeP parseNot() {
    if (isIdent("not")) {
      Deeper deeper(*this);
      uint32_t p = t_[i_++].pos;
      NodeP nd = node(NK::Unary, p);
      nd->s = "not";
      nd->x = parseNot();
      return nd;
    }
    return parseComparison();
  }
  NodeP parseComparison() {
    Deeper chain(*this, 0);
    NodeP l = parseAdditive();
    while (true) {
      std::string op;
      uint32_t p = here();
      if (isIdent("not") && isIdent("in", 1)) {
        op = "not in";
        i_ += 2;
      } else if (isIdent("in")) {
        op = "in";
        ++i_;
      } else if (is(TT::Comparison)) {
        op = t_[i_++].value;
      } else {
        break;
      }
      chain.more();
      l = binary(op, p, std::move(l), parseAdditive());
    }
    return l;
  }
  NodeP parseAdditive() {
    Deeper chain(*this, 0);
    NodeP l = parseMultiplicative();
    while (is(TT::Additive)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary(tk.value, tk.pos, std::move(l), parseMultiplicative());
    }
    return l;
  }
  NodeP parseMultiplicative() {
    Deeper chain(*this, 0);
    NodeP l = parsePower();
    while (is(TT::Multiplicative)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary(tk.value, tk.pos, std::move(l), parsePower());
    }
    return l;
  }
  NodeP parsePower() {
    Deeper chain(*this, 0);
    NodeP l = parseTest();
    while (is(TT::Power)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary("**", tk.pos, std::move(l), parseTest());
    }
    return l;
  }
  NodeP parseTest() {
    Deeper chain(*this, 0);
    NodeP operand = parseFilter();
    while (isIdent("is")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      bool negate = false;
      if (isIdent("not")) {
        negate = true;
        ++i_;
      }
      if (!is(TT::Ident))
        fail("expected a test name after 'is', found " + found());
      const Token &tk = t_[i_++];
      if (!kTests.count(tk.value))
        failAt(tk.pos, "unsupported test '" + tk.value + "'");
      if (is(TT::OpenParen))
        fail("unsupported: arguments to test '" + tk.value + "'");
      NodeP nd = node(NK::Test, p);
      nd->s = tk.value;
      nd->flag = negate;
      nd->x = std::move(operand);
      operand = std::move(nd);
    }
    return operand;
  }
  NodeP parseFilter() {
    Deeper chain(*this, 0);
    NodeP operand = parseUnarySign();
    while (is(TT::Pipe)) {
      chain.more();
      ++i_;
      operand = parseFilterCall(std::move(operand));
    }
    return operand;
  }
  // The filter after '|' (or in {% filter %}), checked for the subset.
  NodeP parseFilterCall(NodeP operand) {
    if (!is(TT::Ident))
      fail("expected a filter name, found " + found());
    const Token &tk = t_[i_++];
    NodeP nd = node(NK::Filter, tk.pos);
    nd->s = tk.value;
    nd->x = std::move(operand);
    if (is(TT::OpenParen)) {
      nd->flag = true;
      parseArgs(nd->a);
      if (!kCallFilters.count(nd->s)) {
        if (kPlainFilters.count(nd->s))
          failAt(tk.pos, "unsupported: filter '" + nd->s + "' with arguments");
        failAt(tk.pos, "unsupported filter '" + nd->s + "'");
      }
      checkFilterArgs(*nd);
    } else if (!kPlainFilters.count(nd->s)) {
      if (kCallFilters.count(nd->s))
        failAt(tk.pos, "unsupported: filter '" + nd->s + "' without an argument list");
      failAt(tk.pos, "unsupported filter '" + nd->s + "'");
    }
    return nd;
  }
  void checkFilterArgs(const Node &f) {
    const std::string &nm = f.s;
    auto kwargNames = [&] {
      std::set<std::string> k;
      for (auto &a : f.a)
        if (a->k == NK::Kwarg)
          k.insert(a->s);
      return k;
    };
    size_t positional = 0;
    for (auto &a : f.a)
      if (a->k != NK::Kwarg)
        ++positional;
    if (nm == "tojson") {
      if (positional)
        failAt(f.pos, "unsupported: positional arguments to 'tojson' (use indent=...)");
      for (auto &k : kwargNames())
        if (k != "indent" && k != "ensure_ascii" && k != "separators")
          failAt(f.pos, "unsupported: tojson(" + k + "=...)");
    } else if (nm == "selectattr" || nm == "rejectattr") {
      if (f.a.empty() || f.a.size() > 3)
        failAt(f.pos, "'" + nm + "' takes 1 to 3 string arguments");
      for (auto &a : f.a)
        if (a->k != NK::StrLit)
          failAt(a->pos, "arguments of '" + nm + "' must be string literals");
      if (f.a.size() >= 2 && !kTests.count(f.a[1]->s))
        failAt(f.a[1]->pos, "unsupported test '" + f.a[1]->s + "'");
    } else if (nm == "map") {
      if (!kwargNames().count("attribute"))
        failAt(f.pos, "unsupported: 'map' without attribute=");
    }
  }
  NodeP parseUnarySign() {
    if (i_ < t_.size() && (t_[i_].type == TT::Unary || t_[i_].type == TT::Additive) &&
        (t_[i_].value == "-" || t_[i_].value == "+")) {
      Deeper deeper(*this);
      const Token &tk = t_[i_++];
      NodeP nd = node(NK::Unary, tk.pos);
      nd->s = tk.value;
      nd->x = parseUnarySign();
      return nd;
    }
    NodeP m = parseMember(parsePrimary());
    if (is(TT::OpenParen))
      return parseCall(std::move(m));
    return m;
  }
  NodeP parseCall(NodeP callee) {
    uint32_t p = here();
    NodeP nd = node(NK::Call, callee->pos);
    (void)p;
    // Known callees only.
    if (callee->k == NK::Member && !callee->flag) {
      const std::string &meth = callee->y->s;
      if (!kMethods.count(meth))
        failAt(callee->y->pos, "unsupported method '" + meth + "'");
    }
    nd->x = std::move(callee);
    parseArgs(nd->a);
    if (nd->x->k == NK::Ident)
      calledNames.push_back(nd.get());
    NodeP e = parseMember(std::move(nd));
    if (is(TT::OpenParen))
      e = parseCall(std::move(e));
    return e;
  }
  void parseArgs(std::vector<NodeP> &out) {
    expect(TT::OpenParen, "'('");
    bool sawKw = false;
    std::set<std::string> kwNames;
    while (!is(TT::CloseParen)) {
      if (is(TT::Power) || (is(TT::Multiplicative) && t_[i_].value == "*"))
        fail("unsupported: argument unpacking");
      uint32_t p = here();
      NodeP arg = parseExpression();
      if (is(TT::Equals)) {
        ++i_;
        if (arg->k != NK::Ident)
          failAt(p, "expected a name for the keyword argument");
        NodeP kw = node(NK::Kwarg, p);
        kw->s = arg->s;
        if (!kwNames.insert(kw->s).second)
          failAt(p, "keyword argument '" + kw->s + "' given twice");
        kw->x = parseExpression();
        arg = std::move(kw);
        sawKw = true;
      } else if (sawKw) {
        failAt(p, "positional argument after keyword argument");
      }
      out.push_back(std::move(arg));
      if (is(TT::Comma))
        ++i_;
      else if (!is(TT::CloseParen))
        fail("expected ',' or ')', found " + found());
    }
    ++i_;
  }
  NodeP parseMember(NodeP object) {
    Deeper chain(*this, 0);
    while (is(TT::Dot) || is(TT::OpenSquare)) {
      chain.more();
      const Token &op = t_[i_++];
      NodeP nd = node(NK::Member, op.pos);
      nd->x = std::move(object);
      if (op.type == TT::OpenSquare) {
        nd->flag = true;
        nd->y = parseSubscript(op.pos);
        expect(TT::CloseSquare, "']'");
      } else {
        if (is(TT::Ident)) {
          nd->y = node(NK::StrLit, t_[i_].pos);
          nd->y->s = t_[i_++].value;
        } else if (is(TT::Numeric) && t_[i_].value.find('.') == std::string::npos &&
                   t_[i_].value[0] != '-' && t_[i_].value[0] != '+') {
          nd->flag = true; // integer after '.': an index
          nd->y = node(NK::IntLit, t_[i_].pos);
          nd->y->n = std::strtod(t_[i_++].value.c_str(), nullptr);
        } else {
          fail("expected a name after '.', found " + found());
        }
      }
      object = std::move(nd);
    }
    return object;
  }
  NodeP parseSubscript(uint32_t p) {
    std::vector<NodeP> parts;
    bool isSlice = false;
    while (!is(TT::CloseSquare)) {
      if (i_ >= t_.size())
        fail("expected ']', found end of template");
      if (is(TT::Colon)) {
        parts.push_back(nullptr);
        ++i_;
        isSlice = true;
      } else {
        parts.push_back(parseExpression());
        if (is(TT::Colon)) {
          ++i_;
          isSlice = true;
        } else if (!is(TT::CloseSquare)) {
          fail("expected ':' or ']', found " + found());
        }
      }
    }
    if (parts.empty())
      failAt(p, "expected an index or slice inside '[]'");
    if (!isSlice) {
      return std::move(parts[0]);
    }
    if (parts.size() > 3)
      failAt(p, "a slice takes at most 3 parts");
    NodeP nd = node(NK::Slice, p);
    parts.resize(3);
    nd->x = std::move(parts[0]);
    nd->y = std::move(parts[1]);
    nd->z = std::move(parts[2]);
    return nd;
  }
  NodeP parsePrimary() {
    if (i_ >= t_.size())
      fail("expected an expression, found end of template");
    const Token &tk = t_[i_++];
    switch (tk.type) {
    case TT::Numeric: {
      bool isFloat = tk.value.find('.') != std::string::npos;
      NodeP nd = node(isFloat ? NK::FloatLit : NK::IntLit, tk.pos);
      nd->n = std::strtod(tk.value.c_str(), nullptr);
      return nd;
    }
    case TT::String: {
      NodeP nd = node(NK::StrLit, tk.pos);
      nd->s = tk.value;
      while (is(TT::String))
        nd->s += t_[i_++].value;
      return nd;
    }
    case TT::Ident: {
      NodeP nd = node(NK::Ident, tk.pos);
      nd->s = tk.value;
      return nd;
    }
    case TT::OpenParen: {
      NodeP e = parseExpressionSequence(false);
      expect(TT::CloseParen, "')'");
      return e;
    }
    case TT::OpenSquare: {
      NodeP nd = node(NK::ArrayLit, tk.pos);
      while (!is(TT::CloseSquare)) {
        nd->a.push_back(parseExpression());
        if (is(TT::Comma))
          ++i_;
        else if (!is(TT::CloseSquare))
          fail("expected ',' or ']', found " + found());
      }
      ++i_;
      return nd;
    }
    case TT::OpenCurly: {
      NodeP nd = node(NK::ObjectLit, tk.pos);
      while (!is(TT::CloseCurly)) {
        nd->a.push_back(parseExpression());
        expect(TT::Colon, "':'");
        nd->b.push_back(parseExpression());
        if (is(TT::Comma))
          ++i_;
        else if (!is(TT::CloseCurly))
          fail("expected ',' or '}', found " + found());
      }
      ++i_;
      return nd;
    }
    default:
      --i_;
      fail("unexpected " + found() + " in an expression");
    }
  }
};

std::vector<NodeP> parseProgram(std::vector<Token> tokens, uint32_t endPos) {
  Parser parser(std::move(tokens), endPos);
  std::vector<NodeP> body = parser.parseProgram();
  for (const Node *call : parser.calledNames) {
    const std::string &nm = call->x->s;
    if (!kGlobalFunctions.count(nm) && !parser.macroNames.count(nm))
      throw Located(call->x->pos, "unsupported function '" + nm + "'");
  }
  return body;
}

} // namespace hflow::data::tmpl
