//===- TemplateDetail.h - the chat-template renderer's parts ----------------===//
//
// The inside of runtime/data/ChatTemplate.h, a small Jinja2 subset with the
// semantics of @huggingface/jinja 0.5.x, split by stage as that library is:
// text and numbers (TemplateText.cpp), values (TemplateValue.cpp), the
// preprocessing and tokens (TemplateLexer.cpp), the syntax tree
// (TemplateParser.cpp), the interpreter (TemplateInterp.cpp) and its
// tests, operators and methods (TemplateFilters.cpp). Only ChatTemplate.cpp
// and those files include it.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_TEMPLATEDETAIL_H
#define HFLOW_RUNTIME_DATA_TEMPLATEDETAIL_H

#include "runtime/data/Utf8.h"

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <locale.h>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::data::tmpl {

// --- text and numbers (TemplateText.cpp) ---

std::u32string toU32(const std::string &s);

std::string toUtf8(const std::u32string &s);

size_t utf16Length(const std::string &s);

std::vector<uint16_t> toUtf16(const std::string &s);

// JavaScript's WhiteSpace and LineTerminator (what \s, trim() match).
bool isJsSpace(uint32_t c);

std::string trimStart(const std::string &s);

std::string trimEnd(const std::string &s);

std::string trimBoth(const std::string &s);

bool isAsciiWord(uint32_t c);

locale_t utf8Locale();

// A template is code from a downloaded file: parsing and rendering it are
// bounded, so that a hostile one is refused with its limit named instead of
// overflowing the stack, growing until the kernel kills the process, or
// running forever (docs/data.md, "Chat templates").
/// The deepest a template's syntax tree may be.
inline constexpr int kMaxTemplateDepth = 256;

/// The most statements and expressions one render may evaluate (a real
/// chat template renders a long conversation in well under a million).
inline constexpr uint64_t kMaxTemplateSteps = 20000000;

/// The longest string a render may make, and its output: 64 MiB.
inline constexpr size_t kMaxTemplateBytes = size_t(64) << 20;

/// How deep a render may nest evaluations (macros calling macros included).
inline constexpr int kMaxRenderDepth = 2000;

struct JsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Code points whose JavaScript case mapping is not one-to-one (or depends on
// context); refused rather than mapped differently.
bool hasSpecialUpper(uint32_t c);

uint32_t mapCase(uint32_t c, bool upper);

std::string jsCase(const std::string &s, bool upper);

std::string jsNumber(double x);

// FloatValue.toString(): integral floats keep one decimal ("2.0").
std::string jsFloatString(double x);

// Number(string) (for loose equality).
double jsToNumber(const std::string &s0);

// parseInt(s, 10)
double jsParseInt(const std::string &s0);

// parseFloat(s)
double jsParseFloat(const std::string &s0);

bool isIntegral(double x);

// --- values (TemplateValue.cpp) ---

enum class VT { Undefined, Null, Bool, Int, Float, String, Array, Tuple, Object, KwArgs, Namespace, Function };

struct Value;

struct ObjData;

struct FuncData;

using Array = std::vector<Value>;

struct Value {
  VT t = VT::Undefined;
  bool b = false;
  double n = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const Array> a;
  std::shared_ptr<ObjData> o;
  std::shared_ptr<const FuncData> f;

  const std::string &str() const { return *s; }
  bool isArray() const { return t == VT::Array || t == VT::Tuple; }
  bool isObject() const { return t == VT::Object || t == VT::KwArgs; }
  bool isAttrContainer() const { return isObject() || t == VT::Namespace; }
  bool isNumber() const { return t == VT::Int || t == VT::Float; }
};

struct ObjData {
  std::vector<std::pair<std::string, Value>> items;
  const Value *find(const std::string &k) const {
    for (auto &kv : items)
      if (kv.first == k)
        return &kv.second;
    return nullptr;
  }
  void set(const std::string &k, Value v) {
    for (auto &kv : items)
      if (kv.first == k) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(k, std::move(v));
  }
};

struct Node;

struct FuncData {
  enum Kind { Global, Method, Macro } kind;
  std::string name;
  Value receiver;
  const Node *macro = nullptr;
};

Value mkUndef();

Value mkNull();

Value mkBool(bool b);

Value mkInt(double n);

Value mkFloat(double n);

Value mkStr(std::string s);

Value mkArr(Array a, VT t = VT::Array);

Value mkObj(std::shared_ptr<ObjData> o, VT t = VT::Object);

Value mkFunc(FuncData::Kind kind, std::string name, Value receiver = Value(), const Node *macro = nullptr);

// A JavaScript number converted as convertToRuntimeValues does.
Value mkNumber(double n);

const char *typeName(const Value &v);

bool truthy(const Value &v);

// Integer-like keys first in ascending order, then the others in insertion
// order: the property order of a JavaScript object.
bool isArrayIndexKey(const std::string &k, double &out);

Value fromJson(const nlohmann::ordered_json &j);

// JSON.stringify of a string.
std::string jsonQuote(const std::string &s, bool ensureAscii);

struct JsonOpts {
  int indent = 0; // 0: none
  bool ensureAscii = false;
  bool hasSeparators = false;
  std::string itemSep, keySep;
};

std::string toJson(const Value &v, const JsonOpts &o, int depth, bool undefToNull);

// RuntimeValue.toString(): how a value renders in {{ }}.
std::string toStr(const Value &v);

// String(x) of the JavaScript value behind a runtime value (`+`, `~`,
// join): numbers print without ".0", arrays join their elements' toString()
// with ",", objects are "[object Map]", null and undefined are "" in join.
std::string rawStr(const Value &v);

// The JavaScript `===` of the values behind two runtime values (none and
// undefined both hold JavaScript undefined).
bool strictEq(const Value &x, const Value &y);

// The JavaScript `==` of the values behind two runtime values.
bool looseEq(const Value &x, const Value &y);

// compareRuntimeValues (sort, dictsort).
int compareValues(const Value &a, const Value &b, bool caseSensitive);

// --- preprocessing and tokens (TemplateLexer.cpp) ---

// Text with, for each character, its index in the original source.
struct MappedText {
  std::u32string s;
  std::vector<uint32_t> pos;
  void push(char32_t c, uint32_t p) {
    s += c;
    pos.push_back(p);
  }
};

bool isLineTerminator(char32_t c);

MappedText preprocess(const std::u32string &src);

enum class TT {
  Text, Numeric, String, Ident, Equals, OpenParen, CloseParen, OpenStmt, CloseStmt, OpenExpr, CloseExpr,
  OpenSquare, CloseSquare, OpenCurly, CloseCurly, Comma, Dot, Colon, Pipe, Additive, Multiplicative,
  Power, Comparison, Unary, Comment, End
};

const char *ttName(TT t);

struct Token {
  TT type;
  std::string value; // UTF-8
  uint32_t pos;      // index (in characters) in the original source
};

struct Located : std::runtime_error {
  uint32_t pos;
  Located(uint32_t p, const std::string &m) : std::runtime_error(m), pos(p) {}
};

std::vector<Token> tokenize(const MappedText &m, uint32_t endPos);

// --- the syntax tree (TemplateParser.cpp) ---

enum class NK {
  // statements
  Text, Output, If, For, Set, Macro, Break, Continue, FilterBlock,
  // expressions
  IntLit, FloatLit, StrLit, Ident, ArrayLit, TupleLit, ObjectLit, Member, Slice, Call, Binary,
  Unary, Filter, Test, Select, Ternary, Kwarg
};

using NodeP = std::unique_ptr<Node>;

struct Node {
  NK k;
  uint32_t pos = 0;
  std::string s;
  double n = 0;
  bool flag = false;
  std::vector<NodeP> a, b, c;
  NodeP x, y, z;
  Node(NK kind, uint32_t p) : k(kind), pos(p) {}
};

NodeP node(NK k, uint32_t p);

extern const std::set<std::string> kTests;

// Filters @huggingface/jinja applies without arguments (for some types).
extern const std::set<std::string> kPlainFilters;

// ... and with an argument list.
extern const std::set<std::string> kCallFilters;

extern const std::set<std::string> kMethods;

extern const std::set<std::string> kGlobalFunctions;

// --- the interpreter (TemplateInterp.cpp) ---

struct Env {
  Env *parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  explicit Env(Env *p) : parent(p) {}
  Value *findLocal(const std::string &k) {
    for (auto &kv : vars)
      if (kv.first == k)
        return &kv.second;
    return nullptr;
  }
  void set(const std::string &k, Value v) {
    if (Value *p = findLocal(k))
      *p = std::move(v);
    else
      vars.emplace_back(k, std::move(v));
  }
  Value lookup(const std::string &k) {
    for (Env *e = this; e; e = e->parent)
      if (Value *p = e->findLocal(k))
        return *p;
    return mkUndef();
  }
};

struct BreakSignal {};

struct ContinueSignal {};

struct Raised {
  uint32_t pos;
  std::string msg;
};

std::vector<uint32_t> lineStarts(const std::u32string &s);

/// Parses a preprocessed template's tokens into its statements, with every
/// call of an unknown function refused. Throws Located.
std::vector<NodeP> parseProgram(std::vector<Token> tokens, uint32_t endPos);

/// Renders `body` with `global` holding the variables, `now` the time
/// strftime_now reads. Throws Located, Raised, JsError, std::bad_alloc.
void renderProgram(const std::vector<NodeP> &body, Env &global, std::time_t now,
                   std::string &out);

// The interpreter's helpers (TemplateFilters.cpp).

/// An error at node `nd`'s position.
[[noreturn]] inline void fail(const Node &nd, const std::string &msg) {
  throw Located(nd.pos, msg);
}

void checkSize(const Node &nd, const std::string &out);

bool runTest(const std::string &name, const Value &v, const Value *arg);

bool objectMethod(const std::string &m);

bool stringMethod(const std::string &m);

Value binaryOp(const std::string &op, const Value &l, const Value &r);

Value callMethod(const Value &self, const std::string &name, Array &args);

std::string titleCase(const std::string &s);

std::string capitalize(const std::string &s);

Value split(const std::string &s, const Array &args);

Value replaceMethod(const std::string &s, const Array &args);

Value dictsort(const Value &self, const Array &args);

Value attrPath(const Value &item, const std::string &path);

std::string indentLines(const std::string &s, const std::string &ind, bool first, bool blank);

// Set membership of the JavaScript values (SameValueZero).
bool sameValueZero(const Value &a, const Value &b);

} // namespace hflow::data::tmpl

#endif // HFLOW_RUNTIME_DATA_TEMPLATEDETAIL_H
