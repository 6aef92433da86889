//===- PrintReshardPlan.cpp - show every planned transfer of weights -------===//

#include "compiler/planner/Memory.h"
#include "compiler/planner/RoleReshard.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWPRINTRESHARDPLAN
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
namespace rs = ::hflow::reshard;
using ::hflow::planner::formatBytes;

namespace {

std::string locString(Location loc) {
  if (auto flc = dyn_cast<FileLineColLoc>(loc))
    return llvm::formatv("{0}:{1}:{2}", flc.getFilename().getValue(),
                         flc.getLine(), flc.getColumn())
        .str();
  return "";
}

/// "123,456,789 B (123.46 MB)".
std::string exact(int64_t bytes) {
  std::string digits = std::to_string(bytes), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out + " B (" + formatBytes(static_cast<double>(bytes)) + ")";
}

std::string rankRange(ArrayRef<int64_t> ranks) {
  if (ranks.empty())
    return "none";
  bool contiguous = ranks.back() - ranks.front() + 1 == (int64_t)ranks.size();
  if (contiguous)
    return ranks.size() == 1 ? std::to_string(ranks.front())
                             : std::to_string(ranks.front()) + "-" +
                                   std::to_string(ranks.back());
  std::string out;
  for (int64_t r : ranks)
    out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

struct Entry {
  ReshardOp op;
  RoleOp role;
  ModelOp model;
  rs::Plan plan; // wire bytes
  ::hflow::planner::WireType wire;
  std::optional<double> seconds;
  int64_t hybridFlow = -1;
  std::string flow, call;
};

/// The source name of a flow value ("rollout", "adv.returns", ...).
std::string valueName(Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    auto flow = dyn_cast<FlowOp>(arg.getOwner()->getParentOp());
    if (flow && flow.getArgNames() && arg.getArgNumber() < flow.getArgNames()->size())
      return cast<StringAttr>((*flow.getArgNames())[arg.getArgNumber()]).str();
    return "arg" + std::to_string(arg.getArgNumber());
  }
  Operation *def = v.getDefiningOp();
  std::string base;
  if (auto call = dyn_cast<CallOp>(def); call && call.getNameAttr())
    base = call.getNameAttr().str();
  else if (auto b = dyn_cast<BuiltinOp>(def); b && b.getNameAttr())
    base = b.getNameAttr().str();
  else
    base = def->getName().getStringRef().str() + " result";
  if (cast<OpResult>(v).getResultNumber() == 1)
    base += ".returns";
  return base;
}

/// The sums over every reshard of the program (wire bytes; `uncompressed`
/// in the weights' own types).
struct Totals {
  int64_t bytes = 0, naive = 0, uncompressed = 0;
  std::optional<double> seconds = 0.0; // none if any reshard has no estimate
  explicit Totals(const std::vector<Entry> &entries) {
    for (const Entry &e : entries) {
      bytes += e.plan.totalBytes;
      naive += e.plan.naiveBytes;
      uncompressed += e.wire.uncompressed(e.plan.totalBytes);
      if (e.seconds && seconds)
        *seconds += *e.seconds;
      else
        seconds.reset();
    }
    if (entries.empty())
      seconds.reset();
  }
};

struct PrintReshardPlanPass
    : public mlir::hflow::impl::HflowPrintReshardPlanBase<PrintReshardPlanPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (format != "text" && format != "json") {
      module.emitError() << "hflow-print-reshard-plan: format must be text or "
                            "json, not '" << format << "'";
      return signalPassFailure();
    }
    ::hflow::placement::Calibration cal;
    std::string calError;
    if (!::hflow::planner::calibrationFromOption(calibration, cal, calError)) {
      module.emitError() << "hflow-print-reshard-plan: " << calError;
      return signalPassFailure();
    }
    std::vector<Entry> entries;
    for (FlowOp flow : module.getOps<FlowOp>())
      for (ReshardOp op : flow.getOps<ReshardOp>()) {
        Entry e;
        e.op = op;
        e.role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(op, op.getRoleAttr());
        if (!e.role)
          continue;
        e.model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(e.role,
                                                              e.role.getModelAttr());
        auto plan = ::hflow::planner::planRoleReshard(e.role);
        if (!plan) {
          op.emitError() << "no reshard plan for role '" << op.getRole()
                         << "' (is it placed?)";
          return signalPassFailure();
        }
        e.plan = std::move(*plan);
        e.wire = ::hflow::planner::wireTypeOf(e.role, e.model);
        e.seconds = ::hflow::planner::estimateSeconds(e.plan, e.role, cal);
        // HybridFlow's formula is for an actor switching layouts on its own
        // devices, not for one generating apart.
        e.hybridFlow = e.role.getGenerateRanks()
                           ? -1
                           : rs::hybridFlowBytesPerRank(
                                 ::hflow::planner::toLayout(e.role.getTrain()),
                                 ::hflow::planner::toLayout(e.role.getGenerate()),
                                 e.plan.modelBytes);
        e.flow = flow.getSymName().str();
        e.call = locString(op.getLoc());
        entries.push_back(std::move(e));
      }
    for (FlowOp flow : module.getOps<FlowOp>())
      for (BatchReshardOp op : flow.getOps<BatchReshardOp>())
        batches_.push_back(op);
    auto file = module->getAttrOfType<StringAttr>("hflow.source_file");
    std::string program = file ? file.str() : "<mlir>";
    if (format == "json")
      printJson(entries, program);
    else
      printText(entries, program);
    llvm::outs().flush();
  }

  std::vector<BatchReshardOp> batches_;

  void printText(std::vector<Entry> &entries, const std::string &program) {
    auto &os = llvm::outs();
    os << "hflow reshard plan for " << program << ": " << entries.size()
       << (entries.size() == 1 ? " reshard" : " reshards") << "\n";
    int n = 0;
    for (Entry &e : entries) {
      const rs::Plan &p = e.plan;
      auto from = ::hflow::planner::toLayout(e.role.getTrain());
      auto to = ::hflow::planner::toLayout(e.role.getGenerate());
      os << "\n[" << ++n << "] " << e.op.getRole() << " weights, "
         << e.op.getFrom() << " -> " << e.op.getTo() << " (flow " << e.flow
         << ", before the call at " << e.call << ")\n";
      const bool apart = static_cast<bool>(e.role.getGenerateRanks());
      if (apart) {
        os << "    layouts      " << from.str() << " on ranks "
           << rankRange(*e.role.getRanks()) << " -> " << to.str() << " on ranks "
           << rankRange(*e.role.getGenerateRanks()) << " (generation apart)\n";
        os << "    assignment   none to choose (the generation ranks hold nothing "
              "beforehand)\n";
      } else {
        os << "    layouts      " << from.str() << " -> " << to.str() << " on ranks "
           << rankRange(*e.role.getRanks()) << "\n";
        os << "    assignment   "
           << (static_cast<int64_t>(p.assignment.size()) <=
                       ::hflow::planner::kMaxOptimalAssignment
                   ? "optimal (Hungarian over the ranks' overlaps)"
                   : "identity (more than 8192 ranks: not optimised)")
           << "\n";
      }
      // The model and the memory in the weights' own type; everything that
      // travels in the wire type.
      const auto &w = e.wire;
      os << "    model        " << exact(w.uncompressed(p.modelBytes)) << ", "
         << e.model.computeParamCount() << " parameters\n";
      os << "    wire         " << w.wire;
      if (w.compressed())
        os << " (compressed from " << w.weights << ": "
           << formatBytes(double(p.totalBytes)) << " instead of "
           << formatBytes(double(w.uncompressed(p.totalBytes))) << ")\n";
      else
        os << " (the weights' own dtype)\n";
      os << "    transfers    " << p.transfers.size() << ":";
      for (const rs::Collective &c : p.collectives) {
        if (c.kind == rs::Collective::AllGather)
          os << " all-gather in " << c.groups
             << (c.groups == 1 ? " group of " : " groups of ") << c.groupSize
             << " ranks (" << formatBytes(double(c.bytes)) << ")";
        else
          os << " point-to-point x" << c.transfers << " ("
             << formatBytes(double(c.bytes)) << ")";
      }
      os << "\n";
      os << "    total        " << exact(p.totalBytes) << "\n";
      os << "    per rank     at most " << exact(p.maxRecvPerRank)
         << " received, " << exact(p.maxSendPerRank) << " sent\n";
      os << "    across nodes " << exact(p.crossNodeBytes) << "\n";
      os << "    lower bound  " << exact(p.lowerBound)
         << (p.totalBytes == p.lowerBound ? " (met)" : " (NOT met)") << "\n";
      os << "    naive        " << exact(p.naiveBytes)
         << (apart ? " (every generation rank receives the whole model)\n"
                   : " (every rank gathers the whole model, as DeepSpeed-Chat)\n");
      os << "    HybridFlow   ";
      if (e.hybridFlow >= 0)
        os << exact(e.hybridFlow)
           << " per rank ((tp - t_g p_g) / (t_g p_g tp) M)\n";
      else
        os << "n/a for these layouts\n";
      os << "    memory       at most " << exact(w.uncompressed(p.maxExtraPerRank))
         << " extra per rank (target shard "
         << formatBytes(double(w.uncompressed(p.maxTargetShard))) << ")\n";
      os << "    est. time    ";
      if (e.seconds)
        os << llvm::formatv("{0:F2} ms", *e.seconds * 1e3) << "\n";
      else
        os << "n/a (the mesh gives no link bandwidths: intra:, inter:)\n";
    }
    int64_t batchBytes = 0, batchNaive = 0;
    for (BatchReshardOp b : batches_) {
      batchBytes += b.getBytes();
      batchNaive += b.getNaive();
    }
    os << "\nbatches: " << batches_.size()
       << (batches_.size() == 1 ? " move, " : " moves, ") << exact(batchBytes)
       << " per step (naive " << formatBytes(double(batchNaive)) << ")\n";
    for (BatchReshardOp b : batches_) {
      os << "  " << valueName(b.getValue()) << " ("
         << stringifyBatchKind(cast<BatchType>(b.getValue().getType()).getKind())
         << "): " << b.getFrom() << " -> " << b.getTo() << ": " << exact(b.getBytes())
         << " in " << b.getTransfers() << (b.getTransfers() == 1 ? " transfer" : " transfers")
         << ", at most " << formatBytes(double(b.getMaxRecv())) << " per rank"
         << (b.getBytes() == b.getLowerBound() ? ", lower bound met" : ", ABOVE the lower bound")
         << ", naive " << formatBytes(double(b.getNaive())) << "\n";
    }
    Totals t(entries);
    os << "\ntotal: " << entries.size()
       << (entries.size() == 1 ? " reshard, " : " reshards, ") << exact(t.bytes)
       << " moved per step (naive " << formatBytes(double(t.naive));
    if (t.uncompressed != t.bytes)
      os << ", uncompressed " << formatBytes(double(t.uncompressed));
    os << ")";
    if (t.seconds)
      os << llvm::formatv(", est. {0:F2} ms", *t.seconds * 1e3);
    os << "\n";
  }

  void printJson(std::vector<Entry> &entries, const std::string &program) {
    llvm::json::OStream j(llvm::outs(), 2);
    auto layout = [&](llvm::StringRef key, const rs::Layout &l) {
      j.attributeObject(key, [&] {
        for (const auto &[name, value] : ::hflow::layout::kNamedDegrees)
          j.attribute(name, l.*value);
        if (l.fold)
          j.attribute("fold", l.fold);
      });
    };
    j.object([&] {
      j.attribute("program", program);
      j.attributeArray("reshards", [&] {
        for (Entry &e : entries) {
          const rs::Plan &p = e.plan;
          j.object([&] {
            j.attribute("role", e.op.getRole().str());
            j.attribute("what", "weights");
            j.attribute("flow", e.flow);
            j.attribute("loc", e.call);
            j.attribute("from_phase", e.op.getFrom().str());
            j.attribute("to_phase", e.op.getTo().str());
            layout("from", ::hflow::planner::toLayout(e.role.getTrain()));
            layout("to", ::hflow::planner::toLayout(e.role.getGenerate()));
            ArrayRef<int64_t> ranks = *e.role.getRanks();
            j.attributeArray("ranks", [&] {
              for (int64_t r : ranks)
                j.value(r);
            });
            j.attributeArray("generate_ranks", [&] {
              if (auto g = e.role.getGenerateRanks())
                for (int64_t r : *g)
                  j.value(r);
            });
            j.attribute("model_bytes", e.wire.uncompressed(p.modelBytes));
            j.attribute("dtype", e.wire.weights);
            j.attribute("bytes_per_element", e.wire.weightsBytes);
            j.attribute("wire_dtype", e.wire.wire);
            j.attribute("wire_bytes_per_element", e.wire.wireBytes);
            j.attribute("uncompressed_bytes", e.wire.uncompressed(p.totalBytes));
            j.attribute("transfers", static_cast<int64_t>(p.transfers.size()));
            j.attributeArray("collectives", [&] {
              for (const rs::Collective &c : p.collectives)
                j.object([&] {
                  j.attribute("kind", c.kind == rs::Collective::AllGather
                                          ? "all_gather"
                                          : "point_to_point");
                  j.attribute("groups", c.groups);
                  j.attribute("group_size", c.groupSize);
                  j.attribute("transfers", c.transfers);
                  j.attribute("bytes", c.bytes);
                });
            });
            j.attribute("total_bytes", p.totalBytes);
            j.attribute("max_recv_bytes_per_rank", p.maxRecvPerRank);
            j.attribute("max_send_bytes_per_rank", p.maxSendPerRank);
            j.attribute("cross_node_bytes", p.crossNodeBytes);
            j.attribute("lower_bound_bytes", p.lowerBound);
            j.attribute("naive_bytes", p.naiveBytes);
            if (e.hybridFlow >= 0)
              j.attribute("hybridflow_bytes_per_rank", e.hybridFlow);
            else
              j.attribute("hybridflow_bytes_per_rank", llvm::json::Value(nullptr));
            j.attribute("max_extra_bytes_per_rank",
                        e.wire.uncompressed(p.maxExtraPerRank));
            j.attribute("max_target_shard_bytes", e.wire.uncompressed(p.maxTargetShard));
            if (e.seconds)
              j.attribute("estimated_seconds", *e.seconds);
            else
              j.attribute("estimated_seconds", llvm::json::Value(nullptr));
          });
        }
      });
      int64_t batchBytes = 0;
      j.attributeArray("batches", [&] {
        for (BatchReshardOp b : batches_) {
          batchBytes += b.getBytes();
          j.object([&] {
            j.attribute("value", valueName(b.getValue()));
            j.attribute("kind", stringifyBatchKind(
                                    cast<BatchType>(b.getValue().getType()).getKind()));
            j.attribute("from", b.getFrom().str());
            j.attribute("to", b.getTo().str());
            j.attribute("bytes", b.getBytes());
            j.attribute("lower_bound_bytes", b.getLowerBound());
            j.attribute("naive_bytes", b.getNaive());
            j.attribute("max_recv_bytes_per_rank", b.getMaxRecv());
            j.attribute("transfers", b.getTransfers());
          });
        }
      });
      Totals t(entries);
      j.attributeObject("totals", [&] {
        j.attribute("reshards", static_cast<int64_t>(entries.size()));
        j.attribute("batch_moves", static_cast<int64_t>(batches_.size()));
        j.attribute("batch_bytes", batchBytes);
        j.attribute("bytes", t.bytes);
        j.attribute("naive_bytes", t.naive);
        j.attribute("uncompressed_bytes", t.uncompressed);
        if (t.seconds)
          j.attribute("estimated_seconds", *t.seconds);
        else
          j.attribute("estimated_seconds", llvm::json::Value(nullptr));
      });
    });
    llvm::outs() << "\n";
  }
};

} // namespace
