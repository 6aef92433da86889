//===- MLIRGen.cpp - AST to the hflow dialect ------------------------------===//

#include "MLIRGen.h"

#include "hflow/HflowOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SHA256.h"

#include <map>

using namespace mlir;
using namespace mlir::hflow;

namespace {

class Generator {
public:
  Generator(MLIRContext &ctx, const ::hflow::ast::Program &p)
      : ctx_(ctx), prog_(p), b_(&ctx) {}

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
                     bw(c.interBandwidth));
    }
    for (const auto &m : prog_.models) {
      Type dtype = m.dtype == ::hflow::ast::DType::F32    ? b_.getF32Type()
                   : m.dtype == ::hflow::ast::DType::BF16 ? b_.getBF16Type()
                                                          : b_.getF16Type();
      auto op = ModelOp::create(b_, loc(m.nameLoc), m.name, m.arch, m.layers,
                                m.hidden, m.heads, m.kvHeads, m.ffn, m.vocab,
                                dtype, IntegerAttr());
      op.setParams(op.computeParamCount());
    }
    for (const auto &r : prog_.roles) {
      auto kind = static_cast<RoleKind>(r.kind);
      FlatSymbolRefAttr model =
          r.model.empty() ? FlatSymbolRefAttr()
                          : FlatSymbolRefAttr::get(&ctx_, r.model);
      StringAttr rule = r.rule.empty() ? StringAttr() : b_.getStringAttr(r.rule);
      SmallVector<NamedAttribute> options;
      for (const auto &[key, value] : r.numbers)
        options.push_back(b_.getNamedAttr(
            key, key == "top_k" || key == "warmup"
                     ? Attribute(b_.getI64IntegerAttr(static_cast<int64_t>(value)))
                     : Attribute(b_.getF64FloatAttr(value))));
      for (const auto &[key, value] : r.strings)
        options.push_back(b_.getNamedAttr(key, b_.getStringAttr(value)));
      RoleOp::create(b_, loc(r.nameLoc), b_.getStringAttr(r.name),
                     RoleKindAttr::get(&ctx_, kind), model, rule,
                     layout(r.train), layout(r.generate), DenseI64ArrayAttr(),
                     options.empty() ? DictionaryAttr()
                                     : b_.getDictionaryAttr(options));
    }
    for (const auto &p : prog_.places) {
      SmallVector<Attribute> roles;
      for (const auto &[name, l] : p.roles)
        roles.push_back(FlatSymbolRefAttr::get(&ctx_, name));
      PlaceOp::create(b_, loc(p.loc), b_.getArrayAttr(roles),
                      FlatSymbolRefAttr::get(&ctx_, p.mesh),
                      b_.getI64IntegerAttr(p.lo), b_.getI64IntegerAttr(p.hi));
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
          t.checkpointDir.empty() ? StringAttr() : b_.getStringAttr(t.checkpointDir));
    }
    return module;
  }

private:
  Location loc(const ::hflow::ast::SourceLoc &l) {
    return FileLineColLoc::get(&ctx_, l.file, l.line, l.col);
  }

  /// An unwritten dp is 0: the placement pass infers it from the devices.
  LayoutAttr layout(const ::hflow::ast::Layout &l) {
    return LayoutAttr::get(&ctx_, l.explicitDp ? l.dp : 0, l.tp, l.pp);
  }

  Attribute constant(const ::hflow::ast::Expr &e) {
    using K = ::hflow::ast::Expr::Kind;
    switch (e.kind) {
    case K::Int: return b_.getI64IntegerAttr(e.intValue);
    case K::Float: return b_.getF64FloatAttr(e.floatValue);
    case K::String:
    case K::Name: return b_.getStringAttr(e.text);
    default: return b_.getUnitAttr();
    }
  }

  void flow(const ::hflow::ast::FlowDecl &f) {
    SmallVector<Attribute> argNames;
    for (const auto &p : f.params)
      argNames.push_back(b_.getStringAttr(p.name));
    auto op = FlowOp::create(b_, loc(f.nameLoc), f.name,
                             b_.getArrayAttr(argNames));
    Block *body = new Block();
    op.getBody().push_back(body);
    std::map<std::string, Value> scope;
    for (const auto &p : f.params)
      scope[p.name] = body->addArgument(
          BatchType::get(&ctx_, static_cast<BatchKind>(p.kind)), loc(p.loc));
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(body);
    for (const auto &s : f.body) {
      const auto &e = *s.value;
      SmallVector<Value> inputs;
      SmallVector<NamedAttribute> kwargs;
      for (const auto &a : e.args) {
        if (a.key.empty())
          inputs.push_back(scope.at(a.value->text));
        else
          kwargs.push_back(b_.getNamedAttr(a.key, constant(*a.value)));
      }
      Type resultType;
      if (s.resultKind)
        resultType = BatchType::get(&ctx_, static_cast<BatchKind>(*s.resultKind));
      // Sorted, so the plan's attrs are deterministic whatever the source order.
      DictionaryAttr args =
          kwargs.empty() ? DictionaryAttr() : b_.getDictionaryAttr(kwargs);
      auto call = CallOp::create(
          b_, loc(e.loc), resultType, FlatSymbolRefAttr::get(&ctx_, e.receiver),
          b_.getStringAttr(e.text), inputs, args,
          s.name.empty() ? StringAttr() : b_.getStringAttr(s.name));
      if (!s.name.empty() && call.getResult())
        scope[s.name] = call.getResult();
    }
  }

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
