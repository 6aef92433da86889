//===- TemplateInterp.cpp - the tree-walking interpreter: statements and expressions ---===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <utility>

namespace hflow::data::tmpl {

/// A filter's argument: positional `i`, else keyword `k`, else `d`.
static Value argOr(const Array &pos, const ObjData &kw, size_t i, const char *k, const Value &d) {
  if (i < pos.size())
    return pos[i];
  if (const Value *x = kw.find(k))
    return *x;
  return d;
}

class Interp {
public:
  explicit Interp(std::time_t now) : now_(now) {}

  void execBlock(const std::vector<NodeP> &body, Env &env, std::string &out) {
    for (auto &st : body)
      if (st)
        exec(*st, env, out);
  }

private:
  std::time_t now_;
  int depth_ = 0;
  int renderDepth_ = 0;
  uint64_t steps_ = 0;

  /// One more statement or expression evaluated at `nd`, one level deeper:
  /// refused past the render's limits (kMaxTemplateSteps, kMaxRenderDepth).
  struct Step {
    Interp &in;
    Step(Interp &interp, const Node &nd) : in(interp) {
      if (++in.steps_ > kMaxTemplateSteps)
        fail(nd, "the template ran " + std::to_string(kMaxTemplateSteps) +
                     " steps without finishing (the limit): a loop too long for a prompt, "
                     "or one that does not end");
      if (++in.renderDepth_ > kMaxRenderDepth) {
        --in.renderDepth_;
        fail(nd, "the template nests its evaluation deeper than " +
                     std::to_string(kMaxRenderDepth) + " levels (the limit)");
      }
    }
    ~Step() { --in.renderDepth_; }
  };
  void exec(const Node &nd, Env &env, std::string &out) {
    Step step(*this, nd);
    switch (nd.k) {
    case NK::Text:
      out += nd.s;
      checkSize(nd, out);
      return;
    case NK::Output: {
      Value v = eval(*nd.x, env);
      if (v.t != VT::Null && v.t != VT::Undefined)
        out += located(*nd.x, [&] { return toStr(v); });
      checkSize(nd, out);
      return;
    }
    case NK::If:
      if (truthy(eval(*nd.x, env)))
        execBlock(nd.a, env, out);
      else
        execBlock(nd.b, env, out);
      return;
    case NK::For:
      execFor(nd, env, out);
      return;
    case NK::Set:
      execSet(nd, env);
      return;
    case NK::Macro:
      env.set(nd.s, mkFunc(FuncData::Macro, nd.s, Value(), &nd));
      return;
    case NK::Break:
      throw BreakSignal();
    case NK::Continue:
      throw ContinueSignal();
    case NK::FilterBlock: {
      std::string body;
      execBlock(nd.a, env, body);
      Value v = applyFilter(mkStr(body), *nd.x, env);
      if (v.t != VT::Null && v.t != VT::Undefined)
        out += located(nd, [&] { return toStr(v); });
      checkSize(nd, out);
      return;
    }
    default:
      fail(nd, "internal error: expression in statement position");
    }
  }

  template <typename F> auto located(const Node &nd, F &&f) -> decltype(f()) {
    try {
      return f();
    } catch (const JsError &e) {
      throw Located(nd.pos, e.what());
    }
  }

  void execSet(const Node &nd, Env &env) {
    Value rhs;
    if (nd.y) {
      rhs = eval(*nd.y, env);
    } else {
      std::string body;
      execBlock(nd.a, env, body);
      rhs = mkStr(body);
    }
    const Node &tgt = *nd.x;
    if (tgt.k == NK::Ident) {
      env.set(tgt.s, rhs);
    } else if (tgt.k == NK::TupleLit) {
      if (!rhs.isArray())
        fail(nd, std::string("Cannot unpack non-iterable type in set: ") + typeName(rhs));
      if (rhs.a->size() != tgt.a.size())
        fail(nd, std::string("Too ") + (tgt.a.size() > rhs.a->size() ? "few" : "many") +
                     " items to unpack in set");
      for (size_t i = 0; i < tgt.a.size(); ++i)
        env.set(tgt.a[i]->s, (*rhs.a)[i]);
    } else {
      Value obj = eval(*tgt.x, env);
      if (obj.t != VT::Namespace)
        fail(*tgt.x, "cannot assign attribute on non-namespace object");
      obj.o->set(tgt.y->s, rhs);
    }
  }

  void execFor(const Node &nd, Env &env, std::string &out) {
    Env scope(&env);
    Value iterable = eval(*nd.x, scope);
    if (!(iterable.isArray() || iterable.isObject()))
      fail(*nd.x, std::string("Expected iterable or object type in for loop: got ") + typeName(iterable));
    Array all;
    if (iterable.isObject()) {
      for (auto &kv : iterable.o->items)
        all.push_back(mkStr(kv.first));
    } else {
      all = *iterable.a;
    }
    auto bind = [&](Env &e, const Value &cur) {
      if (!nd.flag) {
        e.set(nd.a[0]->s, cur);
        return;
      }
      if (cur.t != VT::Array)
        fail(nd, std::string("Cannot unpack non-iterable type: ") + typeName(cur));
      if (cur.a->size() != nd.a.size())
        fail(nd, std::string("Too ") + (nd.a.size() > cur.a->size() ? "few" : "many") + " items to unpack");
      for (size_t j = 0; j < nd.a.size(); ++j)
        e.set(nd.a[j]->s, (*cur.a)[j]);
    };
    Array items;
    for (auto &cur : all) {
      Step step(*this, nd); // an iteration is a step, even with an empty body
      if (nd.y) {
        Env loopScope(&scope);
        bind(loopScope, cur);
        if (!truthy(eval(*nd.y, loopScope)))
          continue;
      }
      items.push_back(cur);
    }
    bool noIteration = true;
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      Step step(*this, nd);
      auto loop = std::make_shared<ObjData>();
      loop->items.emplace_back("index", mkInt(double(i + 1)));
      loop->items.emplace_back("index0", mkInt(double(i)));
      loop->items.emplace_back("revindex", mkInt(double(len - i)));
      loop->items.emplace_back("revindex0", mkInt(double(len - i - 1)));
      loop->items.emplace_back("first", mkBool(i == 0));
      loop->items.emplace_back("last", mkBool(i == len - 1));
      loop->items.emplace_back("length", mkInt(double(len)));
      loop->items.emplace_back("previtem", i > 0 ? items[i - 1] : mkUndef());
      loop->items.emplace_back("nextitem", i + 1 < len ? items[i + 1] : mkUndef());
      scope.set("loop", mkObj(loop));
      bind(scope, items[i]);
      size_t mark = out.size();
      try {
        execBlock(nd.b, scope, out);
      } catch (const ContinueSignal &) {
        out.resize(mark);
        continue;
      } catch (const BreakSignal &) {
        out.resize(mark);
        break;
      }
      noIteration = false;
    }
    if (noIteration)
      execBlock(nd.c, scope, out);
  }

  // Positional values, then a KeywordArgumentsValue when there are keywords
  // (the calling convention of @huggingface/jinja).
  Array evalArgs(const std::vector<NodeP> &args, Env &env, bool alwaysKw = false) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(args, env, pos, kw);
    if (!kw->items.empty() || alwaysKw)
      pos.push_back(mkObj(kw, VT::KwArgs));
    return pos;
  }
  void splitArgs(const std::vector<NodeP> &args, Env &env, Array &pos, std::shared_ptr<ObjData> &kw) {
    kw = std::make_shared<ObjData>();
    for (auto &a : args)
      if (a->k != NK::Kwarg)
        pos.push_back(eval(*a, env));
    for (auto &a : args)
      if (a->k == NK::Kwarg)
        kw->items.emplace_back(a->s, eval(*a->x, env));
  }

public:
  Value eval(const Node &nd, Env &env) {
    Step step(*this, nd);
    switch (nd.k) {
    case NK::IntLit: return mkInt(nd.n);
    case NK::FloatLit: return mkFloat(nd.n);
    case NK::StrLit: return mkStr(nd.s);
    case NK::Ident: return env.lookup(nd.s);
    case NK::ArrayLit:
    case NK::TupleLit: {
      Array a;
      for (auto &e : nd.a)
        a.push_back(eval(*e, env));
      return mkArr(std::move(a), nd.k == NK::ArrayLit ? VT::Array : VT::Tuple);
    }
    case NK::ObjectLit: {
      auto o = std::make_shared<ObjData>();
      for (size_t i = 0; i < nd.a.size(); ++i) {
        Value k = eval(*nd.a[i], env);
        if (k.t != VT::String)
          fail(*nd.a[i], std::string("Object keys must be strings: got ") + typeName(k));
        o->set(k.str(), eval(*nd.b[i], env));
      }
      return mkObj(o);
    }
    case NK::Member: return evalMember(nd, env);
    case NK::Call: return evalCall(nd, env);
    case NK::Binary: return evalBinary(nd, env);
    case NK::Unary: {
      Value v = eval(*nd.x, env);
      if (nd.s == "not")
        return mkBool(!truthy(v));
      double sign = nd.s == "-" ? -1 : 1;
      if (v.isNumber() || v.t == VT::Bool) {
        double x = v.t == VT::Bool ? (v.b ? 1 : 0) : v.n;
        return v.t == VT::Float ? mkFloat(sign * x) : mkInt(sign * x);
      }
      fail(nd, "Unknown operator \"" + nd.s + "\" for " + typeName(v));
    }
    case NK::Filter: {
      Value v = eval(*nd.x, env);
      return applyFilter(v, nd, env);
    }
    case NK::Test: {
      Value v = eval(*nd.x, env);
      bool r = located(nd, [&] { return runTest(nd.s, v, nullptr); });
      return mkBool(nd.flag ? !r : r);
    }
    case NK::Select: {
      if (!truthy(eval(*nd.y, env)))
        return mkUndef();
      return eval(*nd.x, env);
    }
    case NK::Ternary:
      return truthy(eval(*nd.x, env)) ? eval(*nd.y, env) : eval(*nd.z, env);
    default:
      fail(nd, "internal error: statement in expression position");
    }
  }

private:
  Value evalMember(const Node &nd, Env &env) {
    Value obj = eval(*nd.x, env);
    if (nd.y->k == NK::Slice)
      return evalSlice(obj, *nd.y, env);
    Value prop = eval(*nd.y, env);
    auto needString = [&] {
      if (prop.t != VT::String)
        fail(nd, std::string("Cannot access property with non-string: got ") + typeName(prop));
    };
    if (obj.isAttrContainer()) {
      needString();
      if (const Value *v = obj.o->find(prop.str()))
        return *v;
      if (obj.isObject() && objectMethod(prop.str()))
        return mkFunc(FuncData::Method, prop.str(), obj);
      return mkUndef();
    }
    if (obj.isArray() || obj.t == VT::String) {
      if (prop.t == VT::Int) {
        if (obj.t == VT::String) {
          auto u = toUtf16(obj.str());
          double idx = prop.n < 0 ? prop.n + double(u.size()) : prop.n;
          if (!(idx >= 0 && idx < double(u.size())))
            return mkUndef();
          std::string out;
          appendUtf8(out, u[size_t(idx)]);
          return mkStr(out);
        }
        double idx = prop.n < 0 ? prop.n + double(obj.a->size()) : prop.n;
        if (!(idx >= 0 && idx < double(obj.a->size())))
          return mkUndef();
        return (*obj.a)[size_t(idx)];
      }
      if (prop.t == VT::String) {
        if (prop.str() == "length")
          return mkInt(double(obj.t == VT::String ? utf16Length(obj.str()) : obj.a->size()));
        if (obj.t == VT::String && stringMethod(prop.str()))
          return mkFunc(FuncData::Method, prop.str(), obj);
        return mkUndef();
      }
      fail(nd, std::string("Cannot access property with non-string/non-number: got ") + typeName(prop));
    }
    needString();
    return mkUndef();
  }

  Value evalSlice(const Value &obj, const Node &sl, Env &env) {
    if (!(obj.isArray() || obj.t == VT::String))
      fail(sl, "Slice object must be an array or string");
    Value parts[3];
    const Node *ns[3] = {sl.x.get(), sl.y.get(), sl.z.get()};
    const char *names[3] = {"start", "stop", "step"};
    for (int i = 0; i < 3; ++i) {
      if (ns[i])
        parts[i] = eval(*ns[i], env);
      if (!(parts[i].t == VT::Int || parts[i].t == VT::Undefined))
        fail(sl, std::string("Slice ") + names[i] + " must be numeric or undefined");
    }
    auto indices = [&](double len) {
      std::vector<size_t> idx;
      double step = parts[2].t == VT::Int ? parts[2].n : 1;
      bool hasStart = parts[0].t == VT::Int, hasStop = parts[1].t == VT::Int;
      double start, stop;
      if (step >= 0) {
        start = hasStart ? parts[0].n : 0;
        start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
        stop = hasStop ? parts[1].n : len;
        stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
        if (step == 0)
          return idx;
        for (double i = start; i < stop; i += step)
          idx.push_back(size_t(i));
      } else {
        start = hasStart ? parts[0].n : len - 1;
        start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
        stop = hasStop ? parts[1].n : -1;
        stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
        for (double i = start; i > stop; i += step)
          idx.push_back(size_t(i));
      }
      return idx;
    };
    if (obj.isArray()) {
      Array out;
      for (size_t i : indices(double(obj.a->size())))
        out.push_back((*obj.a)[i]);
      return mkArr(std::move(out));
    }
    std::u32string cps = toU32(obj.str());
    std::u32string out;
    for (size_t i : indices(double(cps.size())))
      out += cps[i];
    return mkStr(toUtf8(out));
  }

  Value evalBinary(const Node &nd, Env &env) {
    Value l = eval(*nd.x, env);
    const std::string &op = nd.s;
    if (op == "and")
      return truthy(l) ? eval(*nd.y, env) : l;
    if (op == "or")
      return truthy(l) ? l : eval(*nd.y, env);
    Value r = eval(*nd.y, env);
    return located(nd, [&] { return binaryOp(op, l, r); });
  }

  Value evalCall(const Node &nd, Env &env) {
    Array args = evalArgs(nd.a, env);
    Value fn = eval(*nd.x, env);
    if (fn.t != VT::Function)
      fail(nd, std::string("Cannot call something that is not a function: got ") + typeName(fn));
    const FuncData &f = *fn.f;
    if (f.kind == FuncData::Macro)
      return callMacro(nd, *f.macro, args, env);
    if (f.kind == FuncData::Method)
      return located(nd, [&] { return callMethod(f.receiver, f.name, args); });
    // Globals.
    if (f.name == "raise_exception") {
      std::string msg;
      if (!args.empty()) {
        const Value &a = args[0];
        msg = (a.t == VT::Undefined || a.t == VT::Null) ? "" : rawStr(a);
      }
      throw Raised{nd.pos, msg};
    }
    return located(nd, [&] { return callGlobal(f.name, args); });
  }

  Value callGlobal(const std::string &name, Array &args) {
    if (name == "namespace") {
      std::shared_ptr<ObjData> kw;
      if (!args.empty() && args.back().t == VT::KwArgs) {
        kw = args.back().o;
        args.pop_back();
      }
      if (args.size() > 1)
        throw JsError("namespace expected at most 1 argument, got " + std::to_string(args.size()));
      auto o = std::make_shared<ObjData>();
      if (args.size() == 1) {
        const Value &src = args[0];
        if (src.isObject()) {
          for (auto &kv : src.o->items)
            o->set(kv.first, kv.second);
        } else if (src.isArray()) {
          for (auto &pair : *src.a) {
            Array vals;
            if (pair.isArray()) {
              vals = *pair.a;
            } else if (pair.t == VT::String) {
              for (char32_t c : toU32(pair.str())) {
                std::string cs;
                appendUtf8(cs, c);
                vals.push_back(mkStr(cs));
              }
            }
            if (vals.size() != 2)
              throw JsError("namespace expected an object or an iterable of [key, value] pairs");
            if (vals[0].t != VT::String)
              throw JsError("namespace keys must be strings");
            o->set(vals[0].str(), vals[1]);
          }
        } else {
          throw JsError(std::string("'") + typeName(src) + "' object is not iterable");
        }
      }
      if (kw)
        for (auto &kv : kw->items)
          o->set(kv.first, kv.second);
      return mkObj(o, VT::Namespace);
    }
    if (name == "range") {
      auto num = [&](size_t i, double dflt, bool &present) {
        present = i < args.size() && args[i].t != VT::KwArgs;
        if (!present)
          return dflt;
        if (!args[i].isNumber())
          throw JsError("range() arguments must be numbers");
        return args[i].n;
      };
      bool p0, p1, p2;
      double start = num(0, 0, p0), stop = num(1, 0, p1), step = num(2, 1, p2);
      if (!p0)
        throw JsError("range() expects at least one argument");
      if (!p1) {
        stop = start;
        start = 0;
      }
      if (step == 0)
        throw JsError("range() step must not be zero");
      Array out;
      if (step > 0) {
        for (double i = start; i < stop; i += step) {
          out.push_back(mkNumber(i));
          if (out.size() >= 1000000)
            throw JsError("range() of more than 1,000,000 numbers (the limit)");
        }
      } else {
        for (double i = start; i > stop; i += step) {
          out.push_back(mkNumber(i));
          if (out.size() >= 1000000)
            throw JsError("range() of more than 1,000,000 numbers (the limit)");
        }
      }
      return mkArr(std::move(out));
    }
    if (name == "strftime_now") {
      if (args.empty() || args[0].t != VT::String)
        throw JsError("strftime_now() expects a format string");
      return mkStr(strftimeNow(args[0].str()));
    }
    throw JsError("unknown function '" + name + "'");
  }

  std::string strftimeNow(const std::string &fmt) const {
    std::time_t t = now_ ? now_ : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    static const char *longM[] = {"January", "February", "March", "April", "May", "June", "July",
                                  "August", "September", "October", "November", "December"};
    static const char *shortM[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    auto pad2 = [](int v) {
      char b[16];
      std::snprintf(b, sizeof b, "%02d", v);
      return std::string(b);
    };
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] == '%' && i + 1 < fmt.size()) {
        char c = fmt[i + 1];
        std::string rep;
        bool known = true;
        switch (c) {
        case 'Y': rep = std::to_string(tm.tm_year + 1900); break;
        case 'm': rep = pad2(tm.tm_mon + 1); break;
        case 'd': rep = pad2(tm.tm_mday); break;
        case 'b': rep = shortM[tm.tm_mon]; break;
        case 'B': rep = longM[tm.tm_mon]; break;
        case 'H': rep = pad2(tm.tm_hour); break;
        case 'M': rep = pad2(tm.tm_min); break;
        case '%': rep = "%"; break;
        default: known = false;
        }
        if (known) {
          out += rep;
          ++i;
          continue;
        }
      }
      out += fmt[i];
    }
    return out;
  }

  Value callMacro(const Node &call, const Node &macro, Array &args, Env &env) {
    if (++depth_ > 200) {
      --depth_;
      fail(call, "macro recursion too deep");
    }
    Env scope(&env);
    std::shared_ptr<ObjData> kw = std::make_shared<ObjData>();
    if (!args.empty() && args.back().t == VT::KwArgs) {
      kw = std::make_shared<ObjData>(*args.back().o);
      args.pop_back();
    }
    std::vector<const Node *> pending;
    for (size_t i = 0; i < macro.a.size(); ++i) {
      const Node &p = *macro.a[i];
      Value v;
      bool have = i < args.size();
      if (have)
        v = args[i];
      if (!have) {
        for (auto it = kw->items.begin(); it != kw->items.end(); ++it)
          if (it->first == p.s) {
            v = it->second;
            have = true;
            kw->items.erase(it);
            break;
          }
      }
      if (!have && p.k == NK::Kwarg)
        pending.push_back(&p);
      scope.set(p.s, v);
    }
    if (!kw->items.empty())
      fail(call, "macro '" + macro.s + "' takes no keyword argument '" + kw->items[0].first + "'");
    if (args.size() > macro.a.size())
      fail(call, "macro '" + macro.s + "' takes not more than " + std::to_string(macro.a.size()) +
                     " argument(s)");
    for (const Node *p : pending)
      scope.set(p->s, eval(*p->x, scope));
    std::string out;
    execBlock(macro.b, scope, out);
    --depth_;
    return mkStr(out);
  }

  /// The filter tojson(indent=, ensure_ascii=, separators=).
  Value filterToJson(const Value &v, const Node &f, Env &env) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    return located(f, [&] {
      JsonOpts o;
      if (const Value *ind = kw->find("indent")) {
        if (!(ind->t == VT::Int || ind->t == VT::Null))
          throw JsError("If set, indent must be a number");
        if (ind->t == VT::Int) {
          if (ind->n < 0 || ind->n > 1000)
            throw JsError("indent out of range");
          o.indent = int(ind->n);
        }
      }
      if (const Value *ea = kw->find("ensure_ascii")) {
        if (ea->t != VT::Bool)
          throw JsError("If set, ensure_ascii must be a boolean");
        o.ensureAscii = ea->b;
      }
      if (const Value *sp = kw->find("separators")) {
        if (sp->isArray()) {
          if (sp->a->size() != 2 || (*sp->a)[0].t != VT::String || (*sp->a)[1].t != VT::String)
            throw JsError("separators must be a tuple of two strings");
          o.hasSeparators = true;
          o.itemSep = (*sp->a)[0].str();
          o.keySep = (*sp->a)[1].str();
        } else if (sp->t != VT::Null) {
          throw JsError("If set, separators must be a tuple of two strings");
        }
      }
      return mkStr(toJson(v, o, 0, true));
    });

  }

  /// The filter join(separator).
  Value filterJoin(const Value &v, const Node &f, Env &env) {
    if (!(v.t == VT::String || v.isArray()))
      fail(f, "Cannot apply filter \"join\" to type: " + std::string(typeName(v)));
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    Value sep = !pos.empty() ? pos[0] : kw->find("separator") ? *kw->find("separator") : mkStr("");
    if (sep.t != VT::String)
      fail(f, "separator must be a string");
    return located(f, [&] {
      std::string out;
      if (v.t == VT::String) {
        bool first = true;
        for (char32_t c : toU32(v.str())) {
          if (!first)
            out += sep.str();
          first = false;
          appendUtf8(out, c);
        }
      } else {
        for (size_t i = 0; i < v.a->size(); ++i) {
          if (i)
            out += sep.str();
          const Value &e = (*v.a)[i];
          if (e.t != VT::Null && e.t != VT::Undefined)
            out += rawStr(e);
        }
      }
      return mkStr(out);
    });

  }

  /// The filter int(default) and float(default).
  Value filterNumber(const Value &v, const Node &f, Env &env) {
    const std::string &name = f.s;
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    bool isInt = name == "int";
    Value dflt = !pos.empty() ? pos[0] : kw->find("default") ? *kw->find("default") : (isInt ? mkInt(0) : mkFloat(0));
    if (v.t == VT::String) {
      double x = isInt ? jsParseInt(v.str()) : jsParseFloat(v.str());
      if (std::isnan(x))
        return dflt;
      return isInt ? mkInt(x) : mkFloat(x);
    }
    if (v.isNumber())
      return v;
    if (v.t == VT::Bool)
      return isInt ? mkInt(v.b ? 1 : 0) : mkFloat(v.b ? 1 : 0);
    fail(f, "Cannot apply filter \"" + name + "\" to type: " + typeName(v));

  }

  /// The filter default(value, boolean).
  Value filterDefault(const Value &v, const Node &f, Env &env) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    Value dflt = !pos.empty() ? pos[0] : mkStr("");
    Value boolean = pos.size() > 1 ? pos[1] : kw->find("boolean") ? *kw->find("boolean") : mkBool(false);
    if (boolean.t != VT::Bool)
      fail(f, "`default` filter flag must be a boolean");
    if (v.t == VT::Undefined || (boolean.b && !truthy(v)))
      return dflt;
    return v;

  }

  /// The filter sort(reverse, case_sensitive, attribute) of an array.
  Value filterSort(const Value &v, const Node &f, Env &env) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    auto opt = [&](size_t i, const char *k, Value d) { return argOr(pos, *kw, i, k, d); };
    Value rev = opt(0, "reverse", mkBool(false));
    if (rev.t != VT::Bool)
      fail(f, "reverse must be a boolean");
    Value cs = opt(1, "case_sensitive", mkBool(false));
    if (cs.t != VT::Bool)
      fail(f, "case_sensitive must be a boolean");
    Value attr = opt(2, "attribute", mkNull());
    if (!(attr.t == VT::String || attr.t == VT::Int || attr.t == VT::Null))
      fail(f, "attribute must be a string, integer, or null");
    return located(f, [&] {
      auto key = [&](const Value &item) {
        if (attr.t == VT::Null)
          return item;
        return attrPath(item, attr.t == VT::Int ? jsNumber(attr.n) : attr.str());
      };
      Array out = *v.a;
      std::stable_sort(out.begin(), out.end(), [&](const Value &a, const Value &b) {
        int r = compareValues(key(a), key(b), cs.b);
        return (rev.b ? -r : r) < 0;
      });
      return mkArr(std::move(out));
    });

  }

  /// The filter selectattr and rejectattr(attribute, test, argument) of an array of objects.
  Value filterSelectAttr(const Value &v, const Node &f, Env &env) {
    const std::string &name = f.s;
    bool select = name == "selectattr";
    for (auto &it : *v.a)
      if (!it.isAttrContainer())
        fail(f, "`" + name + "` can only be applied to array of objects");
    std::string attr = f.a[0]->s;
    std::string test = f.a.size() > 1 ? f.a[1]->s : "";
    Value arg = f.a.size() > 2 ? mkStr(f.a[2]->s) : mkUndef();
    return located(f, [&] {
      Array out;
      for (auto &it : *v.a) {
        const Value *a = it.o->find(attr);
        bool r = false;
        if (a)
          r = test.empty() ? truthy(*a) : runTest(test, *a, &arg);
        if (select ? r : !r)
          out.push_back(it);
      }
      return mkArr(std::move(out));
    });

  }

  /// The filter map(attribute=, default=) of an array of objects.
  Value filterMap(const Value &v, const Node &f, Env &env) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    const Value *attr = kw->find("attribute");
    if (!attr || attr->t != VT::String)
      fail(f, "attribute must be a string");
    const Value *dflt = kw->find("default");
    Array out;
    for (auto &it : *v.a) {
      if (!it.isAttrContainer())
        fail(f, "items in map must be an object");
      Value x = attrPath(it, attr->str());
      out.push_back(x.t == VT::Undefined ? (dflt ? *dflt : mkUndef()) : x);
    }
    return mkArr(std::move(out));

  }

  /// The filter indent(width, first, blank) of a string.
  Value filterIndent(const Value &v, const Node &f, Env &env) {
    Array pos;
    std::shared_ptr<ObjData> kw;
    splitArgs(f.a, env, pos, kw);
    auto opt = [&](size_t i, const char *k, Value d) { return argOr(pos, *kw, i, k, d); };
    Value width = opt(0, "width", mkInt(4));
    if (width.t != VT::Int)
      fail(f, "width must be a number");
    if (width.n < 0 || width.n > 100000)
      fail(f, "width out of range");
    bool first = truthy(opt(1, "first", mkBool(false)));
    bool blank = truthy(opt(2, "blank", mkBool(false)));
    return mkStr(indentLines(v.str(), std::string(size_t(width.n), ' '), first, blank));

  }

  Value applyFilter(const Value &v, const Node &f, Env &env) {
    const std::string &name = f.s;
    if (!f.flag)
      return located(f, [&] { return plainFilter(v, name); });
    // With an argument list.
    if (name == "tojson")
      return filterToJson(v, f, env);
    if (name == "join")
      return filterJoin(v, f, env);
    if (name == "int" || name == "float")
      return filterNumber(v, f, env);
    if (name == "default")
      return filterDefault(v, f, env);
    if (v.isArray()) {
      if (name == "sort")
        return filterSort(v, f, env);
      if (name == "selectattr" || name == "rejectattr")
        return filterSelectAttr(v, f, env);
      if (name == "map")
        return filterMap(v, f, env);
      fail(f, "Unknown ArrayValue filter: " + name);
    }
    if (v.t == VT::String) {
      if (name == "indent")
        return filterIndent(v, f, env);
      if (name == "replace") {
        Array args = evalArgs(f.a, env, /*alwaysKw=*/true);
        return located(f, [&] { return replaceMethod(v.str(), args); });
      }
      fail(f, "Unknown StringValue filter: " + name);
    }
    if (v.isObject()) {
      if (objectMethod(name)) {
        Array args = evalArgs(f.a, env);
        return located(f, [&] { return callMethod(v, name, args); });
      }
      fail(f, "Unknown ObjectValue filter: " + name);
    }
    fail(f, "Cannot apply filter \"" + name + "\" to type: " + typeName(v));
  }

  Value plainFilter(const Value &v, const std::string &name) {
    if (name == "safe")
      return v;
    if (name == "tojson")
      return mkStr(toJson(v, JsonOpts(), 0, true));
    if (v.isArray()) {
      const Array &a = *v.a;
      if (name == "list") return v;
      if (a.empty() && (name == "first" || name == "last"))
        throw JsError("'" + name + "' of an empty list");
      if (name == "first") return a.front();
      if (name == "last") return a.back();
      if (name == "length") return mkInt(double(a.size()));
      if (name == "reverse") return mkArr(Array(a.rbegin(), a.rend()));
      if (name == "sort") {
        Array out = a;
        std::stable_sort(out.begin(), out.end(),
                         [](const Value &x, const Value &y) { return compareValues(x, y, false) < 0; });
        return mkArr(std::move(out));
      }
      if (name == "join") {
        std::string out;
        for (auto &e : a)
          if (e.t != VT::Null && e.t != VT::Undefined)
            out += rawStr(e);
        return mkStr(out);
      }
      if (name == "string") return mkStr(toJson(v, JsonOpts(), 0, false));
      if (name == "unique") {
        Array out;
        for (auto &e : a) {
          bool seen = false;
          for (auto &o : out)
            if (sameValueZero(o, e)) {
              seen = true;
              break;
            }
          if (!seen)
            out.push_back(e);
        }
        return mkArr(std::move(out));
      }
      throw JsError("Unknown ArrayValue filter: " + name);
    }
    if (v.t == VT::String) {
      const std::string &s = v.str();
      if (name == "length") return mkInt(double(utf16Length(s)));
      if (name == "upper") return mkStr(jsCase(s, true));
      if (name == "lower") return mkStr(jsCase(s, false));
      if (name == "title") return mkStr(titleCase(s));
      if (name == "capitalize") return mkStr(capitalize(s));
      if (name == "trim") return mkStr(trimBoth(s));
      if (name == "indent") return mkStr(indentLines(s, "    ", false, false));
      if (name == "join" || name == "string") return v;
      if (name == "int") {
        double x = jsParseInt(s);
        return mkInt(std::isnan(x) ? 0 : x);
      }
      if (name == "float") {
        double x = jsParseFloat(s);
        return mkFloat(std::isnan(x) ? 0 : x);
      }
      throw JsError("Unknown StringValue filter: " + name);
    }
    if (v.isNumber()) {
      if (name == "abs") return v.t == VT::Int ? mkInt(std::fabs(v.n)) : mkFloat(std::fabs(v.n));
      if (name == "int") return mkInt(std::floor(v.n));
      if (name == "float") return mkFloat(v.n);
      if (name == "string") return mkStr(toStr(v));
      throw JsError("Unknown NumericValue filter: " + name);
    }
    if (v.isObject()) {
      if (name == "items" || objectMethod(name)) {
        Array none;
        return callMethod(v, name, none);
      }
      if (name == "length") return mkInt(double(v.o->items.size()));
      throw JsError("Unknown ObjectValue filter: " + name);
    }
    if (v.t == VT::Bool) {
      if (name == "bool") return v;
      if (name == "int") return mkInt(v.b ? 1 : 0);
      if (name == "float") return mkFloat(v.b ? 1 : 0);
      if (name == "string") return mkStr(v.b ? "true" : "false");
      throw JsError("Unknown BooleanValue filter: " + name);
    }
    throw JsError("Cannot apply filter \"" + name + "\" to type: " + typeName(v));
  }

};

void renderProgram(const std::vector<NodeP> &body, Env &global, std::time_t now,
                   std::string &out) {
  Interp interp(now);
  interp.execBlock(body, global, out);
}

} // namespace hflow::data::tmpl
