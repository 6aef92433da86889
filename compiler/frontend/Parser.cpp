//===- Parser.cpp - ANTLR parse tree to AST --------------------------------===//
//
// ANTLR4 does the lexing and parsing; this file turns its parse tree into the
// AST and its syntax errors into diagnostics. Nothing here may let an
// exception escape: parseOnly() catches everything.
//
//===----------------------------------------------------------------------===//

#include "compiler/frontend/Frontend.h"
#include "compiler/frontend/Imports.h"
#include "compiler/frontend/Sema.h"

#include "compiler/frontend/grammar/HflowLexer.h"
#include "compiler/frontend/grammar/HflowParser.h"
#include <antlr4-runtime.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace hflow;
using namespace hflow::frontend;
using hflowgrammar::HflowLexer;
using hflowgrammar::HflowParser;

namespace {

/// Deeper nesting than this is refused before parsing: ANTLR's recursive
/// descent would otherwise exhaust the stack on adversarial input.
constexpr int kMaxNesting = 200;

class ErrorCollector : public antlr4::BaseErrorListener {
public:
  ErrorCollector(const std::string &file, DiagnosticList &diags)
      : file_(file), diags_(diags) {}

  void syntaxError(antlr4::Recognizer *, antlr4::Token *offending, size_t line,
                   size_t col, const std::string &msg,
                   std::exception_ptr) override {
    // One syntax error is enough: ANTLR's recovery tends to cascade.
    if (reported_)
      return;
    reported_ = true;
    ast::SourceLoc loc{file_, static_cast<int>(line), static_cast<int>(col) + 1,
                       1};
    std::string text = msg;
    if (offending) {
      std::string tok = offending->getText();
      if (offending->getType() == antlr4::Token::EOF)
        text = "unexpected end of file: " + msg;
      else if (offending->getType() == HflowLexer::ERROR_CHAR)
        text = "unexpected character '" + tok + "'";
      loc.length = std::max<int>(1, static_cast<int>(tok.size()));
    }
    diags_.error(loc, "syntax error: " + text);
  }

private:
  const std::string &file_;
  DiagnosticList &diags_;
  bool reported_ = false;
};

class TreeToAST {
public:
  TreeToAST(const std::string &file, DiagnosticList &diags)
      : file_(file), diags_(diags) {}

  ast::SourceLoc loc(antlr4::Token *t) const {
    if (!t)
      return {file_, 0, 0, 1};
    return {file_, static_cast<int>(t->getLine()),
            static_cast<int>(t->getCharPositionInLine()) + 1,
            std::max<int>(1, static_cast<int>(t->getStopIndex() -
                                              t->getStartIndex() + 1))};
  }
  ast::SourceLoc loc(antlr4::ParserRuleContext *c) const {
    ast::SourceLoc l = loc(c->getStart());
    antlr4::Token *stop = c->getStop();
    if (stop && stop->getLine() == c->getStart()->getLine() &&
        stop->getStopIndex() >= c->getStart()->getStartIndex())
      l.length = static_cast<int>(stop->getStopIndex() -
                                  c->getStart()->getStartIndex() + 1);
    return l;
  }

  void program(HflowParser::ProgramContext *ctx, ast::Program &p) {
    for (auto *i : ctx->importDecl()) {
      ast::ImportDecl decl;
      decl.loc = loc(i->path);
      decl.path = unescape(i->path->getText());
      p.imports.push_back(std::move(decl));
    }
    for (auto *d : ctx->decl()) {
      if (auto *dev = d->deviceDecl()) {
        ast::DeviceDecl decl;
        decl.name = dev->name->getText();
        decl.loc = loc(dev);
        decl.nameLoc = loc(dev->name);
        decl.ctor = call(dev->ctor);
        p.devices.push_back(std::move(decl));
      } else if (auto *c = d->clusterDecl()) {
        ast::ClusterDecl decl;
        decl.name = c->name->getText();
        decl.loc = loc(c);
        decl.nameLoc = loc(c->name);
        decl.ctor = call(c->ctor);
        p.clusters.push_back(std::move(decl));
      } else if (auto *m = d->modelDecl()) {
        ast::ModelDecl decl;
        decl.name = m->name->getText();
        decl.loc = loc(m);
        decl.nameLoc = loc(m->name);
        decl.ctor = call(m->ctor);
        p.models.push_back(std::move(decl));
      } else if (auto *r = d->roleDecl()) {
        ast::RoleDecl decl;
        decl.name = r->name->getText();
        decl.loc = loc(r);
        decl.nameLoc = loc(r->name);
        decl.ctor = call(r->ctor);
        if (auto *body = r->roleBody())
          for (auto *prop : body->prop())
            decl.props.push_back(
                {prop->key->getText(), loc(prop->key), expr(prop->value)});
        p.roles.push_back(std::move(decl));
      } else if (auto *pl = d->placeDecl()) {
        ast::PlaceDecl decl;
        decl.loc = loc(pl);
        if (pl->isAuto) {
          decl.isAuto = true;
          if (pl->mesh) {
            decl.mesh = pl->mesh->getText();
            decl.meshLoc = loc(pl->mesh);
          }
          p.places.push_back(std::move(decl));
          continue;
        }
        for (antlr4::Token *t : pl->roles)
          decl.roles.push_back({t->getText(), loc(t)});
        if (pl->genRole) {
          decl.roles.push_back({pl->genRole->getText(), loc(pl->genRole)});
          decl.phase = pl->phase->getText();
          decl.phaseLoc = loc(pl->phase);
        }
        decl.mesh = pl->mesh->getText();
        decl.meshLoc = loc(pl->mesh);
        decl.lo = integer(pl->lo);
        decl.hi = integer(pl->hi);
        decl.rangeLoc = loc(pl->lo);
        decl.rangeLoc.length = static_cast<int>(pl->hi->getStopIndex() -
                                                pl->lo->getStartIndex() + 1);
        p.places.push_back(std::move(decl));
      } else if (auto *f = d->flowDecl()) {
        ast::FlowDecl decl;
        decl.name = f->name->getText();
        decl.loc = loc(f);
        decl.nameLoc = loc(f->name);
        for (auto *param : f->param())
          decl.params.push_back({param->name->getText(), param->type->getText(),
                                 loc(param->name), loc(param->type)});
        for (auto *s : f->stmt()) {
          ast::Stmt stmt;
          stmt.loc = loc(s);
          if (auto *let = dynamic_cast<HflowParser::LetStmtContext *>(s)) {
            stmt.name = let->name->getText();
            stmt.nameLoc = loc(let->name);
            stmt.value = expr(let->value);
          } else if (auto *e = dynamic_cast<HflowParser::ExprStmtContext *>(s)) {
            stmt.value = expr(e->value);
          }
          if (stmt.value)
            decl.body.push_back(std::move(stmt));
        }
        p.flows.push_back(std::move(decl));
      } else if (auto *t = d->trainDecl()) {
        ast::TrainDecl decl;
        decl.flow = t->flow->getText();
        decl.loc = loc(t);
        decl.flowLoc = loc(t->flow);
        for (auto *prop : t->prop())
          decl.props.push_back(
              {prop->key->getText(), loc(prop->key), expr(prop->value)});
        p.trains.push_back(std::move(decl));
      }
    }
  }

private:
  int64_t integer(antlr4::Token *t) {
    const std::string text = t->getText();
    errno = 0;
    char *end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE || v > (int64_t(1) << 53)) {
      diags_.error(loc(t), "integer literal " + text + " is too large");
      return 0;
    }
    return v;
  }

  /// The value of a decimal literal; one too large for a double is reported.
  double finite(const std::string &text, const ast::SourceLoc &where) {
    double v = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(v)) {
      diags_.error(where, "number " + (text.size() > 24 ? text.substr(0, 24) + "..."
                                                         : text) +
                              " is too large");
      return 0;
    }
    return v;
  }

  ast::ExprPtr call(HflowParser::CallContext *c) {
    auto e = std::make_unique<ast::Expr>(ast::Expr::Kind::Call, loc(c));
    e->text = c->callee->getText();
    e->loc = loc(c->callee);
    if (auto *args = c->argList())
      argList(args, e->args);
    return e;
  }

  void argList(HflowParser::ArgListContext *args, std::vector<ast::Arg> &out) {
    for (auto *a : args->arg()) {
      ast::Arg arg;
      if (a->key) {
        arg.key = a->key->getText();
        arg.keyLoc = loc(a->key);
      }
      arg.value = expr(a->value);
      out.push_back(std::move(arg));
    }
  }

  static std::string unescape(const std::string &quoted) {
    std::string out;
    for (size_t i = 1; i + 1 < quoted.size(); ++i) {
      char c = quoted[i];
      if (c == '\\' && i + 2 < quoted.size()) {
        char n = quoted[++i];
        out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
      } else {
        out += c;
      }
    }
    return out;
  }

  ast::ExprPtr binary(antlr4::Token *op, HflowParser::ExprContext *lhs,
                      HflowParser::ExprContext *rhs) {
    auto e = std::make_unique<ast::Expr>(ast::Expr::Kind::Binary, loc(op));
    e->op = op->getText()[0];
    e->lhs = expr(lhs);
    e->rhs = expr(rhs);
    return e;
  }

  ast::ExprPtr expr(HflowParser::ExprContext *c) {
    using K = ast::Expr::Kind;
    if (auto *m = dynamic_cast<HflowParser::MulExprContext *>(c))
      return binary(m->op, m->lhs, m->rhs);
    if (auto *m = dynamic_cast<HflowParser::AddExprContext *>(c))
      return binary(m->op, m->lhs, m->rhs);
    if (auto *m = dynamic_cast<HflowParser::NegExprContext *>(c)) {
      ast::ExprPtr operand = expr(m->operand);
      // -2, -1e-3: negative literals.
      if (operand->kind == K::Int) {
        operand->intValue = -operand->intValue;
        operand->text = "-" + operand->text;
        operand->loc = loc(m->op);
        return operand;
      }
      if (operand->kind == K::Float || operand->kind == K::Quantity) {
        operand->floatValue = -operand->floatValue;
        operand->text = "-" + operand->text;
        operand->loc = loc(m->op);
        return operand;
      }
      auto e = std::make_unique<ast::Expr>(K::Neg, loc(m->op));
      e->lhs = std::move(operand);
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::FieldExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Field, loc(m->field));
      e->receiver = m->recv->getText();
      e->receiverLoc = loc(m->recv);
      e->text = m->field->getText();
      return e;
    }
    if (dynamic_cast<HflowParser::AutoExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Name, loc(c));
      e->text = "auto";
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::EveryExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Every, loc(m));
      e->intValue = integer(m->count);
      e->text = unescape(m->dir->getText());
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::MethodCallExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::MethodCall, loc(m->method));
      e->receiver = m->recv->getText();
      e->receiverLoc = loc(m->recv);
      e->text = m->method->getText();
      e->loc = loc(m);
      if (auto *args = m->argList())
        argList(args, e->args);
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::CallExprContext *>(c))
      return call(m->call());
    if (auto *m = dynamic_cast<HflowParser::NameExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Name, loc(m->ID()->getSymbol()));
      e->text = m->ID()->getText();
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::QuantityExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Quantity,
                                           loc(m->QUANTITY()->getSymbol()));
      e->text = m->QUANTITY()->getText();
      size_t unitStart = e->text.find_first_not_of("0123456789.");
      e->floatValue = finite(e->text.substr(0, unitStart), e->loc);
      e->unit = e->text.substr(unitStart);
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::IntExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Int, loc(m->INT()->getSymbol()));
      e->intValue = integer(m->INT()->getSymbol());
      e->text = m->INT()->getText();
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::FloatExprContext *>(c)) {
      auto e = std::make_unique<ast::Expr>(K::Float, loc(m->FLOAT()->getSymbol()));
      e->text = m->FLOAT()->getText();
      e->floatValue = finite(e->text, e->loc);
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::StringExprContext *>(c)) {
      auto e =
          std::make_unique<ast::Expr>(K::String, loc(m->STRING()->getSymbol()));
      e->text = unescape(m->STRING()->getText());
      return e;
    }
    if (auto *m = dynamic_cast<HflowParser::ParenExprContext *>(c))
      return expr(m->expr());
    // Only reachable for a tree ANTLR built during error recovery.
    return std::make_unique<ast::Expr>(K::Name, loc(c));
  }

  const std::string &file_;
  DiagnosticList &diags_;
};

/// ANTLR's C++ runtime decodes UTF-8 and throws on anything that is not
/// well-formed (overlong forms, surrogates, code points above U+10FFFF);
/// report the first such byte with its position instead.
bool checkUtf8(const std::string &file, const std::string &src,
               DiagnosticList &diags) {
  int line = 1, col = 1;
  auto byte = [&](size_t i) { return static_cast<unsigned char>(src[i]); };
  for (size_t i = 0; i < src.size();) {
    unsigned char c = byte(i);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3
                 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= src.size();
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (byte(i + k) >> 6) == 0x2;
      cp = (cp << 6) | (byte(i + k) & 0x3f);
    }
    static const uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok && len > 1)
      ok = cp >= kMinForLength[len] && cp <= 0x10ffff &&
           !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      diags.error({file, line, col, 1},
                  std::string("invalid UTF-8 byte ") + hex +
                      "; hflow programs are UTF-8 text");
      return false;
    }
    if (c == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
    i += len;
  }
  return true;
}

/// Refuses input whose parse tree would be deep enough to exhaust the stack
/// (ANTLR's parser, the tree-to-AST conversion and the AST's destructors all
/// recurse over it): bracket nesting beyond kMaxNesting, and chains of more
/// than kMaxNesting `*` operators in one expression. Works on the token
/// stream, so strings and comments cannot hide brackets.
bool checkDepth(const std::string &file, antlr4::CommonTokenStream &tokens,
                DiagnosticList &diags) {
  tokens.fill();
  int depth = 0, chain = 0;
  for (antlr4::Token *t : tokens.getTokens()) {
    // Brackets and separators are one character; skip the text copy
    // (UTF-32 to UTF-8) for every other token.
    if (t->getType() == antlr4::Token::EOF ||
        t->getStopIndex() != t->getStartIndex())
      continue;
    const std::string text = t->getText();
    if (text == "(" || text == "{" || text == "[")
      ++depth;
    else if (text == ")" || text == "}" || text == "]")
      depth = std::max(0, depth - 1);
    if (text == "*" || text == "/" || text == "+" || text == "-")
      ++chain;
    else if (text == "," || text == "{" || text == "}" || text == ":" ||
             text == "=" || text == ";")
      chain = 0;
    if (depth > kMaxNesting || chain > kMaxNesting) {
      diags.error({file, static_cast<int>(t->getLine()),
                   static_cast<int>(t->getCharPositionInLine()) + 1, 1},
                  depth > kMaxNesting
                      ? "nesting deeper than " + std::to_string(kMaxNesting) +
                            " levels is not supported"
                      : "an expression with more than " +
                            std::to_string(kMaxNesting) +
                            " operators is not supported");
      return false;
    }
  }
  return true;
}

} // namespace

FrontendResult hflow::frontend::parseOnly(const std::string &file,
                                          const std::string &source) {
  FrontendResult result;
  try {
    if (!checkUtf8(file, source, result.diags))
      return result;
    antlr4::ANTLRInputStream input(source);
    HflowLexer lexer(&input);
    ErrorCollector errors(file, result.diags);
    lexer.removeErrorListeners();
    lexer.addErrorListener(&errors);
    antlr4::CommonTokenStream tokens(&lexer);
    if (!checkDepth(file, tokens, result.diags))
      return result;
    HflowParser parser(&tokens);
    parser.removeErrorListeners();
    parser.addErrorListener(&errors);
    HflowParser::ProgramContext *tree = parser.program();
    if (result.diags.hasErrors())
      return result;
    auto program = std::make_unique<ast::Program>();
    program->file = file;
    program->source = source;
    TreeToAST(file, result.diags).program(tree, *program);
    result.program = std::move(program);
  } catch (const std::exception &e) {
    result.program.reset();
    result.diags.error({file, 1, 1, 1},
                       std::string("internal error in the parser: ") + e.what());
  } catch (...) {
    result.program.reset();
    result.diags.error({file, 1, 1, 1}, "internal error in the parser");
  }
  return result;
}

FrontendResult hflow::frontend::parseAndCheck(const std::string &file,
                                              const std::string &source,
                                              const FrontendOptions &options) {
  FrontendResult result;
  try {
    result = parseOnly(file, source);
    if (!result.program || result.diags.hasErrors())
      return result;
    loadImports(*result.program, options, result);
    if (result.diags.hasErrors())
      return result;
    checkProgram(*result.program, result.diags);
    if (options.checkDataFiles && !result.diags.hasErrors())
      checkDataFiles(*result.program, result.diags);
  } catch (const std::exception &e) {
    result.diags.error({file, 1, 1, 1},
                       std::string("internal error in the front end: ") +
                           e.what());
  } catch (...) {
    result.diags.error({file, 1, 1, 1}, "internal error in the front end");
  }
  return result;
}
