//===- MLIRGen.cpp - AST to the hflow dialect ------------------------------===//

#include "compiler/mlirgen/MLIRGen.h"

#include "dialects/hflow/HflowOps.h"

#include "runtime/schema/BuiltinTable.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SHA256.h"

#include <cmath>
#include <map>

using namespace mlir;
using namespace mlir::hflow;

namespace {

class Generator {
public:
  Generator(MLIRContext &ctx, const ::hflow::ast::Program &p)
      : ctx_(ctx), prog_(p), b_(&ctx) {}

  /// A model declaration as an hflow.model op (its parameter count derived).
  void model(const ::hflow::ast::ModelDecl &m) {
    Type dtype = m.dtype == ::hflow::ast::DType::F32    ? b_.getF32Type()
                 : m.dtype == ::hflow::ast::DType::BF16 ? b_.getBF16Type()
                                                        : b_.getF16Type();
    auto op = ModelOp::create(b_, loc(m.nameLoc), m.name, m.arch, m.layers,
                              m.hidden, m.heads, m.kvHeads, m.ffn, m.vocab,
                              dtype, IntegerAttr(), m.tieEmbeddings, m.qkvBias,
                              m.ropeTheta != 10000
                                  ? b_.getF64FloatAttr(m.ropeTheta)
                                  : FloatAttr(),
                              m.normEps != 1e-5 ? b_.getF64FloatAttr(m.normEps)
                                                : FloatAttr(),
                              m.headDim > 0 ? b_.getI64IntegerAttr(m.headDim)
                                            : IntegerAttr(),
                              m.qkNorm,
                              m.ropeScaling.size() == 4 || m.ropeScaling.size() == 8
                                  ? b_.getDenseF64ArrayAttr(m.ropeScaling)
                                  : DenseF64ArrayAttr(),
                              m.slidingWindow > 0 ? b_.getI64IntegerAttr(m.slidingWindow)
                                                  : IntegerAttr(),
                              IntegerAttr(), IntegerAttr(), IntegerAttr(), false,
                              FloatAttr(), false, IntegerAttr(), IntegerAttr(), false,
                              IntegerAttr(), IntegerAttr(), FloatAttr(), IntegerAttr(),
                              IntegerAttr(), IntegerAttr(), IntegerAttr(), IntegerAttr(), false);
    if (!m.hfDir.empty())
      op->setAttr("hf_dir", b_.getStringAttr(m.hfDir));
    if (m.moe.experts > 0) {
      op.setExpertsAttr(b_.getI64IntegerAttr(m.moe.experts));
      op.setExpertsPerTokenAttr(b_.getI64IntegerAttr(m.moe.expertsPerToken));
      op.setExpertFfnAttr(b_.getI64IntegerAttr(m.moe.expertFfn));
      op.setNormTopkProb(m.moe.normTopk);
      op.setRouterAuxLossCoefAttr(b_.getF64FloatAttr(m.moe.routerAuxCoef));
      op.setRouterAuxLoss(m.moe.routerAuxLoss);
      if (m.moe.sigmoid) { // DeepSeek-V3's mixture
        if (m.moe.sharedExperts > 0)
          op.setSharedExpertsAttr(b_.getI64IntegerAttr(m.moe.sharedExperts));
        if (m.moe.denseLayers > 0)
          op.setDenseLayersAttr(b_.getI64IntegerAttr(m.moe.denseLayers));
        op.setSigmoidRouter(true);
        op.setExpertGroupsAttr(b_.getI64IntegerAttr(m.moe.groups));
        op.setTopkGroupsAttr(b_.getI64IntegerAttr(m.moe.topkGroups));
        op.setRoutedScalingAttr(b_.getF64FloatAttr(m.moe.routedScaling));
      }
    }
    if (m.mla.kvLoraRank > 0) { // DeepSeek's latent attention
      if (m.mla.qLoraRank > 0)
        op.setQLoraRankAttr(b_.getI64IntegerAttr(m.mla.qLoraRank));
      op.setKvLoraRankAttr(b_.getI64IntegerAttr(m.mla.kvLoraRank));
      op.setQkNopeHeadDimAttr(b_.getI64IntegerAttr(m.mla.qkNopeDim));
      op.setQkRopeHeadDimAttr(b_.getI64IntegerAttr(m.mla.qkRopeDim));
      op.setVHeadDimAttr(b_.getI64IntegerAttr(m.mla.vHeadDim));
      op.setRopeInterleave(m.mla.interleave);
    }
    op.setParams(op.computeParamCount());
  }

  OwningOpRef<ModuleOp> run() {
    OwningOpRef<ModuleOp> module =
        ModuleOp::create(FileLineColLoc::get(&ctx_, prog_.file, 1, 1));
    auto bytes = llvm::ArrayRef<uint8_t>(
        reinterpret_cast<const uint8_t *>(prog_.source.data()),
        prog_.source.size());
    std::array<uint8_t, 32> sha = llvm::SHA256::hash(bytes);
    (*module)->setAttr("hflow.source_file", b_.getStringAttr(prog_.file));
    (*module)->setAttr("hflow.source_sha256",
                       b_.getStringAttr(llvm::toHex(sha, /*LowerCase=*/true)));
    b_.setInsertionPointToEnd(module->getBody());

    for (const auto &d : prog_.devices)
      DeviceOp::create(b_, loc(d.nameLoc), b_.getStringAttr(d.name),
                       b_.getStringAttr(d.kind), b_.getF64FloatAttr(d.memoryBytes),
                       b_.getF64FloatAttr(d.bf16Flops),
                       b_.getF64FloatAttr(d.fp32Flops),
                       b_.getF64FloatAttr(d.memBandwidth));
    for (const auto &c : prog_.clusters) {
      auto bw = [&](double v) {
        return v > 0 ? b_.getF64FloatAttr(v) : FloatAttr();
      };
      MeshOp::create(b_, loc(c.nameLoc), b_.getStringAttr(c.name),
                     b_.getStringAttr(c.device), b_.getI64IntegerAttr(c.nodes),
                     b_.getI64IntegerAttr(c.perNode), bw(c.intraBandwidth),
                     bw(c.interBandwidth), bw(c.pcieBandwidth), bw(c.hostMemory));
    }
    for (const auto &m : prog_.models)
      model(m);
    for (const auto &r : prog_.roles) {
      auto kind = static_cast<RoleKind>(r.kind);
      FlatSymbolRefAttr model =
          r.model.empty() ? FlatSymbolRefAttr()
                          : FlatSymbolRefAttr::get(&ctx_, r.model);
      StringAttr rule = r.rule.empty() ? StringAttr() : b_.getStringAttr(r.rule);
      SmallVector<NamedAttribute> options;
      for (const auto &[key, value] : r.numbers)
        options.push_back(b_.getNamedAttr(
            key, key == "routing_replay" ? Attribute(b_.getBoolAttr(value != 0))
                 : key == "top_k" || key == "warmup"
                     ? Attribute(b_.getI64IntegerAttr(static_cast<int64_t>(value)))
                     : Attribute(b_.getF64FloatAttr(value))));
      for (const auto &[key, value] : r.strings)
        options.push_back(b_.getNamedAttr(key, b_.getStringAttr(value)));
      RoleOp::create(b_, loc(r.nameLoc), b_.getStringAttr(r.name),
                     RoleKindAttr::get(&ctx_, kind), model, rule,
                     layout(r.train), layout(r.generate), DenseI64ArrayAttr(),
                     options.empty() ? DictionaryAttr()
                                     : b_.getDictionaryAttr(options),
                     DenseI64ArrayAttr());
    }
    for (const auto &p : prog_.places) {
      if (p.isAuto) {
        std::string mesh = p.mesh;
        if (mesh.empty() && !prog_.clusters.empty())
          mesh = prog_.clusters.front().name;
        PlaceAutoOp::create(b_, loc(p.loc), FlatSymbolRefAttr::get(&ctx_, mesh));
        continue;
      }
      SmallVector<Attribute> roles;
      for (const auto &[name, l] : p.roles)
        roles.push_back(FlatSymbolRefAttr::get(&ctx_, name));
      PlaceOp::create(b_, loc(p.loc), b_.getArrayAttr(roles),
                      FlatSymbolRefAttr::get(&ctx_, p.mesh),
                      b_.getI64IntegerAttr(p.lo), b_.getI64IntegerAttr(p.hi),
                      p.phase.empty() ? StringAttr() : b_.getStringAttr(p.phase));
    }
    for (const auto &f : prog_.flows)
      flow(f);
    for (const auto &t : prog_.trains) {
      auto opt = [&](int64_t v) {
        return v > 0 ? b_.getI64IntegerAttr(v) : IntegerAttr();
      };
      TrainOp::create(
          b_, loc(t.loc), FlatSymbolRefAttr::get(&ctx_, t.flow),
          b_.getStringAttr(t.data), b_.getI64IntegerAttr(t.batch),
          b_.getI64IntegerAttr(t.samples),
          b_.getI64IntegerAttr(t.minibatch > 0 ? t.minibatch : t.batch),
          b_.getI64IntegerAttr(t.seed), opt(t.steps), opt(t.epochs),
          opt(t.checkpointEvery),
          t.checkpointDir.empty() ? StringAttr() : b_.getStringAttr(t.checkpointDir),
          opt(t.promptLen), opt(t.microBatch), opt(t.offPolicy),
          t.promptKey.empty() ? StringAttr() : b_.getStringAttr(t.promptKey),
          t.answerKey.empty() ? StringAttr() : b_.getStringAttr(t.answerKey),
          t.staleness >= 0 ? b_.getI64IntegerAttr(t.staleness) : IntegerAttr(),
          t.stalenessBound >= 0 ? b_.getI64IntegerAttr(t.stalenessBound) : IntegerAttr(),
          t.partialHorizon > 0 ? b_.getI64IntegerAttr(t.partialHorizon) : IntegerAttr(),
          t.stream ? b_.getUnitAttr() : UnitAttr());
    }
    return module;
  }

private:
  Location loc(const ::hflow::ast::SourceLoc &l) {
    return FileLineColLoc::get(&ctx_, l.file, l.line, l.col);
  }

  /// An unwritten dp is 0: the placement pass infers it from the devices
  /// (or fsdp, for a bare `fsdp`).
  LayoutAttr layout(const ::hflow::ast::Layout &l) {
    if (l.isAuto)
      return LayoutAttr::getAuto(&ctx_);
    bool sharded = l.fsdpAll || l.fsdp > 1;
    // dp counts every data-parallel rank, ep's among them: ep(2) * dp(2)
    // is dp = 4, ep = 2.
    int64_t dp = l.explicitDp ? l.dp * l.ep : sharded ? 1 : 0;
    return LayoutAttr::get(&ctx_, dp, l.tp, l.pp, l.fsdpAll ? 0 : l.fsdp, l.sp,
                           l.cp, l.ep, l.fold);
  }

  /// A folded constant: an integer when integral (max_tokens: 2 * 8).
  Attribute folded(double c) {
    return c == std::floor(c) && std::fabs(c) < 9.0e15
               ? Attribute(b_.getI64IntegerAttr(static_cast<int64_t>(c)))
               : Attribute(b_.getF64FloatAttr(c));
  }

  Attribute constant(const ::hflow::ast::Expr &e) {
    using K = ::hflow::ast::Expr::Kind;
    if ((e.kind == K::Binary || e.kind == K::Neg) && e.constant)
      return folded(*e.constant);
    switch (e.kind) {
    case K::Int: return b_.getI64IntegerAttr(e.intValue);
    case K::Float: return b_.getF64FloatAttr(e.floatValue);
    case K::String:
    case K::Name: return b_.getStringAttr(e.text);
    default: return b_.getUnitAttr();
    }
  }

  using Scope = std::map<std::string, Value>;

  Type batchType(int kind) {
    return BatchType::get(&ctx_, static_cast<BatchKind>(kind));
  }

  /// Emits the ops computing a batch-valued expression Sema has typed.
  Value value(const ::hflow::ast::Expr &e, Scope &scope) {
    using K = ::hflow::ast::Expr::Kind;
    switch (e.kind) {
    case K::Name: return scope.at(e.text);
    case K::Field:
      // The second result (`.returns`, `.scores`) under its field's name;
      // the first result's field is the value itself.
      return scope.count(e.receiver + "." + e.text) ? scope.at(e.receiver + "." + e.text)
                                                    : scope.at(e.receiver);
    case K::MethodCall: return methodCall(e, scope, "");
    case K::Call: return builtin(e, scope, "").front();
    case K::Neg:
      return BuiltinOp::create(b_, loc(e.loc), TypeRange{batchType(*e.batchKind)},
                               "neg", ValueRange{value(*e.lhs, scope)},
                               DictionaryAttr(), FloatAttr(), false, FloatAttr(),
                               StringAttr())
          .getResults()
          .front();
    case K::Binary: return binary(e, scope);
    default: return Value();
    }
  }

  /// `a op b`; a constant operand becomes the op's scalar, and `a - c * b`
  /// folds the constant into `scale_rhs`.
  Value binary(const ::hflow::ast::Expr &e, Scope &scope) {
    const char *name = ::hflow::builtins::opName(e.op);
    Type type = batchType(*e.batchKind);
    SmallVector<Value> inputs;
    FloatAttr scalar, scaleRhs;
    bool scalarLhs = false;
    if (e.lhs->constant) {
      scalar = b_.getF64FloatAttr(*e.lhs->constant);
      scalarLhs = true;
      inputs.push_back(value(*e.rhs, scope));
    } else if (e.rhs->constant) {
      scalar = b_.getF64FloatAttr(*e.rhs->constant);
      inputs.push_back(value(*e.lhs, scope));
    } else {
      inputs.push_back(value(*e.lhs, scope));
      const ::hflow::ast::Expr &r = *e.rhs;
      // score - 0.01 * kl: one op, as the runtime computes it.
      if ((e.op == '+' || e.op == '-') && r.kind == ::hflow::ast::Expr::Kind::Binary &&
          r.op == '*' && (r.lhs->constant || r.rhs->constant)) {
        scaleRhs = b_.getF64FloatAttr(r.lhs->constant ? *r.lhs->constant
                                                      : *r.rhs->constant);
        inputs.push_back(value(r.lhs->constant ? *r.rhs : *r.lhs, scope));
      } else {
        inputs.push_back(value(r, scope));
      }
    }
    return BuiltinOp::create(b_, loc(e.loc), TypeRange{type}, name, inputs,
                             DictionaryAttr(), scalar, scalarLhs, scaleRhs,
                             StringAttr())
        .getResults()
        .front();
  }

  DictionaryAttr kwargs(const ::hflow::ast::Expr &e, Scope &scope) {
    SmallVector<NamedAttribute> kw;
    for (const auto &a : e.args) {
      if (a.key.empty())
        continue;
      Attribute v = constant(*a.value);
      // A `let` constant passed by name.
      if (a.value->kind == ::hflow::ast::Expr::Kind::Name &&
          constants_.count(a.value->text)) {
        // An integral constant stays an integer (max_tokens: len).
        v = folded(constants_.at(a.value->text));
      }
      kw.push_back(b_.getNamedAttr(a.key, v));
    }
    // Sorted, so the plan's attrs are deterministic whatever the source order.
    return kw.empty() ? DictionaryAttr() : b_.getDictionaryAttr(kw);
  }

  SmallVector<Value> positional(const ::hflow::ast::Expr &e, Scope &scope) {
    SmallVector<Value> inputs;
    for (const auto &a : e.args)
      if (a.key.empty())
        inputs.push_back(value(*a.value, scope));
    return inputs;
  }

  Value methodCall(const ::hflow::ast::Expr &e, Scope &scope,
                   const std::string &name) {
    SmallVector<Value> inputs = positional(e, scope);
    Type resultType;
    if (e.batchKind)
      resultType = batchType(*e.batchKind);
    auto call = CallOp::create(
        b_, loc(e.loc), resultType, FlatSymbolRefAttr::get(&ctx_, e.receiver),
        b_.getStringAttr(e.text), inputs, kwargs(e, scope),
        name.empty() ? StringAttr() : b_.getStringAttr(name));
    return call.getResult();
  }

  ValueRange builtin(const ::hflow::ast::Expr &e, Scope &scope,
                     const std::string &name) {
    SmallVector<Value> inputs = positional(e, scope);
    SmallVector<Type> types{batchType(*e.batchKind)};
    const auto *bi = ::hflow::builtins::findBuiltin(e.text);
    if (bi && bi->fields.any())
      types.push_back(batchType(int(bi->fields.secondKind)));
    auto op = BuiltinOp::create(b_, loc(e.loc), types, e.text, inputs,
                                kwargs(e, scope), FloatAttr(), false, FloatAttr(),
                                name.empty() ? StringAttr() : b_.getStringAttr(name));
    return op.getResults();
  }

  void flow(const ::hflow::ast::FlowDecl &f) {
    SmallVector<Attribute> argNames;
    for (const auto &p : f.params)
      argNames.push_back(b_.getStringAttr(p.name));
    auto op = FlowOp::create(b_, loc(f.nameLoc), f.name,
                             b_.getArrayAttr(argNames));
    Block *body = new Block();
    op.getBody().push_back(body);
    Scope scope;
    constants_.clear();
    for (const auto &p : f.params)
      scope[p.name] = body->addArgument(
          BatchType::get(&ctx_, static_cast<BatchKind>(p.kind)), loc(p.loc));
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(body);
    using K = ::hflow::ast::Expr::Kind;
    for (const auto &s : f.body) {
      const auto &e = *s.value;
      if (e.constant) { // let beta = 0.01
        constants_[s.name] = *e.constant;
        continue;
      }
      if (e.kind == K::MethodCall) {
        if (Value v = methodCall(e, scope, s.name); v && !s.name.empty())
          scope[s.name] = v;
        continue;
      }
      if (e.kind == K::Call) {
        ValueRange rs = builtin(e, scope, s.name);
        scope[s.name] = rs.front();
        if (rs.size() == 2)
          scope[s.name + "." + std::string(
                                   ::hflow::builtins::findBuiltin(e.text)->fields.second)] = rs[1];
        continue;
      }
      Value v = value(e, scope);
      if (e.kind == K::Name || e.kind == K::Field) {
        // `let a2 = adv`: another name for the same value (and its second
        // result).
        if (e.kind == K::Name)
          for (const char *f : {".returns", ".scores"})
            if (scope.count(e.text + f))
              scope[s.name + f] = scope.at(e.text + f);
      } else if (auto def = v.getDefiningOp<BuiltinOp>()) {
        def.setNameAttr(b_.getStringAttr(s.name)); // the op this let created
      }
      scope[s.name] = v;
    }
  }

  std::map<std::string, double> constants_; // the flow's `let` constants
  MLIRContext &ctx_;
  const ::hflow::ast::Program &prog_;
  OpBuilder b_;
};

} // namespace

OwningOpRef<ModuleOp> (::hflow::mlirGen)(MLIRContext &context,
                                         const ::hflow::ast::Program &program) {
  context.getOrLoadDialect<HflowDialect>();
  OwningOpRef<ModuleOp> module = Generator(context, program).run();
  if (failed(verify(*module)))
    return nullptr;
  return module;
}
