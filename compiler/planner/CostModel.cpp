//===- CostModel.cpp - analytic time and memory model for RL placement -----===//
//
// docs/placement.md documents every formula here. Never throws (built with
// -fno-exceptions under LLVM's options).
//
//===----------------------------------------------------------------------===//
#include "CostModel.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

namespace hflow::placement {

namespace rs = ::hflow::reshard;

const char *kindName(RoleKind k) {
  switch (k) {
  case RoleKind::Actor: return "Actor";
  case RoleKind::Critic: return "Critic";
  case RoleKind::Reference: return "Reference";
  case RoleKind::RewardModel: return "RewardModel";
  }
  return "?";
}

const char *stageName(int s) {
  switch (s) {
  case kGenerate: return "generate";
  case kPrepare: return "prepare";
  case kTrain: return "train";
  }
  return "?";
}

int64_t paramCount(const ModelShape &m) {
  const int64_t h = m.hidden, v = m.vocab, f = m.ffn;
  const int64_t headDim = h / std::max<int64_t>(m.heads, 1);
  const int64_t kv = m.kvHeads * headDim;
  int64_t perLayer = 2 * h + h * h + 2 * h * kv + h * h + 3 * h * f;
  if (m.qkvBias)
    perLayer += h + 2 * kv;
  return v * h + m.layers * perLayer + h + (m.tieEmbeddings ? 0 : h * v);
}

double peakFlops(const Device &dev, int64_t dtypeBytes) {
  return dtypeBytes >= 4 ? dev.fp32Flops : dev.bf16Flops;
}

//===----------------------------------------------------------------------===//
// Calibration file
//===----------------------------------------------------------------------===//

namespace {
const CalibrationKey kCalFields[] = {
    {"trainFlopsPerParamToken", &Calibration::trainFlopsPerParamToken, 1e-9, 1e3},
    {"forwardFlopsPerParamToken", &Calibration::forwardFlopsPerParamToken, 1e-9, 1e3},
    {"trainEfficiency", &Calibration::trainEfficiency, 1e-9, 1},
    {"forwardEfficiency", &Calibration::forwardEfficiency, 1e-9, 1},
    {"prefillEfficiency", &Calibration::prefillEfficiency, 1e-9, 1},
    {"decodeComputeEfficiency", &Calibration::decodeComputeEfficiency, 1e-9, 1},
    {"decodeBandwidthEfficiency", &Calibration::decodeBandwidthEfficiency, 1e-9, 1},
    {"decodeStepOverhead", &Calibration::decodeStepOverhead, 0, 1e3},
    {"linkEfficiency", &Calibration::linkEfficiency, 1e-9, 1},
    {"alphaIntra", &Calibration::alphaIntra, 0, 1e3},
    {"alphaInter", &Calibration::alphaInter, 0, 1e3},
    {"memoryFraction", &Calibration::memoryFraction, 1e-9, 1},
    {"epochs", &Calibration::epochs, 1, 1e6},
};
/// The key of the raw measurements' sub-object.
const char kMeasuredKey[] = "measured";

std::string shortNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
/// "(0, 1]" for the keys that must be positive, "[0, 1000]" otherwise.
std::string rangeText(const CalibrationKey &k) {
  return (k.min == 1e-9 ? std::string("(0") : "[" + shortNumber(k.min)) + ", " +
         shortNumber(k.max) + "]";
}

struct JsonReader {
  const std::string &s;
  size_t i = 0;
  std::string err;
  explicit JsonReader(const std::string &text) : s(text) {}
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
  }
  bool fail(const std::string &m) {
    if (err.empty())
      err = m + " at offset " + std::to_string(i);
    return false;
  }
  bool expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c)
      return fail(std::string("expected '") + c + "'");
    ++i;
    return true;
  }
  bool str(std::string &out) {
    ws();
    if (i >= s.size() || s[i] != '"')
      return fail("expected a string key");
    ++i;
    out.clear();
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\') {
        if (i >= s.size())
          return fail("unterminated escape");
        char e = s[i++];
        switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        default: return fail("unsupported escape in a key");
        }
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return fail("control character in a string");
      } else {
        out += c;
      }
    }
    if (i >= s.size())
      return fail("unterminated string");
    ++i;
    return true;
  }
  bool number(double &out) {
    ws();
    // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    size_t b = i;
    if (i < s.size() && s[i] == '-')
      ++i;
    auto digits = [&] {
      size_t d = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9')
        ++i;
      return i - d;
    };
    size_t intDigits = digits();
    if (intDigits == 0)
      return fail("expected a number");
    if (intDigits > 1 && s[b + (s[b] == '-')] == '0')
      return fail("leading zero in a number");
    if (i < s.size() && s[i] == '.') {
      ++i;
      if (digits() == 0)
        return fail("expected digits after '.'");
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-'))
        ++i;
      if (digits() == 0)
        return fail("expected an exponent");
    }
    std::string tok = s.substr(b, i - b);
    char *end = nullptr;
    out = std::strtod(tok.c_str(), &end);
    if (!end || *end != '\0' || !std::isfinite(out))
      return fail("number out of range");
    return true;
  }
  /// The "measured" object: {"name": number, ...}, any names, each once.
  bool measured() {
    std::set<std::string> names;
    if (!expect('{'))
      return false;
    ws();
    if (i < s.size() && s[i] == '}') {
      ++i;
      return true;
    }
    for (;;) {
      std::string key;
      double v = 0;
      ws();
      size_t at = i;
      if (!str(key) || !expect(':'))
        return false;
      if (!names.insert(key).second) {
        i = at;
        return fail("duplicate key \"measured." + key + "\"");
      }
      if (!number(v))
        return false;
      ws();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      return expect('}');
    }
  }
};
} // namespace

const CalibrationKey *calibrationKeys(size_t &count) {
  count = sizeof(kCalFields) / sizeof(kCalFields[0]);
  return kCalFields;
}

const CalibrationKey *findCalibrationKey(const std::string &name) {
  for (const CalibrationKey &k : kCalFields)
    if (name == k.name)
      return &k;
  return nullptr;
}

bool loadCalibrationFile(const std::string &path, Calibration &out,
                         std::string &error) {
  const std::string who = "calibration " + path + ": ";
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    error = who + "cannot read: " + std::strerror(errno);
    return false;
  }
  std::string text;
  char buf[4096];
  size_t n;
  // Calibration files are a few hundred bytes; refuse anything huge.
  constexpr size_t kMaxBytes = size_t(1) << 20;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= kMaxBytes)
    text.append(buf, n);
  const bool readError = std::ferror(f) != 0;
  const int readErrno = errno;
  std::fclose(f);
  if (readError) {
    error = who + "cannot read: " + std::strerror(readErrno);
    return false;
  }
  if (text.size() > kMaxBytes) {
    error = who + "larger than 1 MiB: not a calibration file";
    return false;
  }
  std::string err;
  if (!loadCalibration(text, out, err)) {
    const std::string prefix = "calibration: ";
    error = who + (err.compare(0, prefix.size(), prefix) == 0
                       ? err.substr(prefix.size())
                       : err);
    return false;
  }
  error.clear();
  return true;
}

bool loadCalibration(const std::string &jsonText, Calibration &out,
                     std::string &error) {
  Calibration c = out;
  JsonReader r(jsonText);
  std::set<std::string> seen;
  auto done = [&](bool ok) {
    if (!ok) {
      error = "calibration: " + r.err;
      return false;
    }
    out = c;
    error.clear();
    return true;
  };
  if (!r.expect('{'))
    return done(false);
  r.ws();
  if (r.i < jsonText.size() && jsonText[r.i] == '}') {
    ++r.i;
  } else {
    for (;;) {
      std::string key;
      double v = 0;
      if (!r.str(key) || !r.expect(':'))
        return done(false);
      r.ws();
      size_t at = r.i;
      if (key == kMeasuredKey) {
        if (!seen.insert(key).second) {
          r.i = at;
          r.fail("duplicate key \"" + key + "\"");
          return done(false);
        }
        if (!r.measured())
          return done(false);
      } else {
        const CalibrationKey *f = findCalibrationKey(key);
        if (!f) {
          r.i = at;
          r.fail("unknown key \"" + key + "\"");
          return done(false);
        }
        if (!r.number(v))
          return done(false);
        if (!seen.insert(key).second) {
          r.i = at;
          r.fail("duplicate key \"" + key + "\"");
          return done(false);
        }
        if (v < f->min || v > f->max) {
          r.i = at;
          r.fail("\"" + key + "\" = " + shortNumber(v) + " is outside " +
                 rangeText(*f));
          return done(false);
        }
        c.*(f->field) = v;
      }
      r.ws();
      if (r.i < jsonText.size() && jsonText[r.i] == ',') {
        ++r.i;
        continue;
      }
      if (!r.expect('}'))
        return done(false);
      break;
    }
  }
  r.ws();
  if (r.i != jsonText.size()) {
    r.fail("trailing characters after the object");
    return done(false);
  }
  return done(true);
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

RoleMemory roleMemory(const RoleSpec &role, const Layout &train,
                      const Layout *gen, const Workload &w) {
  RoleMemory m;
  const ModelShape &ms = role.model;
  const double P = static_cast<double>(paramCount(ms));
  const double b = static_cast<double>(role.dtypeBytes);
  const double L = static_cast<double>(ms.layers);
  const double h = static_cast<double>(ms.hidden);
  const double V = static_cast<double>(ms.vocab);
  const double headDim = h / static_cast<double>(ms.heads);
  const double kvHeads = static_cast<double>(ms.kvHeads);
  const bool trains = role.trains();

  const double S = static_cast<double>(
      std::max<int64_t>(train.fsdp * train.tp * train.pp, 1));
  m.weights = P * b / S;
  if (trains) {
    m.grads = P * b / S;
    m.optimizer = P * (b >= 4 ? 8 : 12) / S;
  }
  const double tp = static_cast<double>(std::max<int64_t>(train.tp, 1));
  const double pp = static_cast<double>(std::max<int64_t>(train.pp, 1));
  const double tokens = double(w.microBatch) * double(w.seqLen()) /
                        double(train.sp * train.cp);
  m.activations = tokens * h * 34 * (b / 2) / tp + tokens * V * 4 / tp;
  if (trains)
    m.activations += tokens * h * b * (L / pp);

  if (role.kind == RoleKind::Actor && gen) {
    const double tpg = static_cast<double>(std::max<int64_t>(gen->tp, 1));
    const double ppg = static_cast<double>(std::max<int64_t>(gen->pp, 1));
    const double dpg = static_cast<double>(std::max<int64_t>(gen->dp * gen->fsdp, 1));
    m.genWeights = P * b / (tpg * ppg);
    const double seqs = std::ceil(double(w.batch) * double(w.n) / dpg);
    m.kvCache = 2 * (L / ppg) * std::max(1.0, kvHeads / tpg) * headDim * b *
                seqs * double(w.seqLen());
  }
  return m;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

namespace {
double bw(bool inter, const Mesh &mesh, const Calibration &cal) {
  return (inter ? mesh.interBw : mesh.intraBw) * cal.linkEfficiency;
}
double alpha(bool inter, const Calibration &cal) {
  return inter ? cal.alphaInter : cal.alphaIntra;
}
} // namespace

double allReduceSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal) {
  if (n <= 1)
    return 0;
  const double k = double(n - 1);
  return 2 * k / double(n) * bytes / bw(inter, mesh, cal) + 2 * k * alpha(inter, cal);
}

double allGatherSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal) {
  if (n <= 1)
    return 0;
  const double k = double(n - 1);
  return k / double(n) * bytes / bw(inter, mesh, cal) + k * alpha(inter, cal);
}

double reduceScatterSeconds(double bytes, int64_t n, bool inter,
                            const Mesh &mesh, const Calibration &cal) {
  return allGatherSeconds(bytes, n, inter, mesh, cal);
}

double p2pSeconds(double bytes, bool inter, const Mesh &mesh,
                  const Calibration &cal) {
  return bytes / bw(inter, mesh, cal) + alpha(inter, cal);
}

bool spansNodes(int64_t span, int64_t setDevices, const Mesh &mesh) {
  // A set of at most one node lies inside one node; a larger set is whole
  // nodes, and a group of `span` consecutive ranks (aligned to its span)
  // crosses a node boundary exactly when it is longer than a node.
  if (setDevices <= mesh.perNode)
    return false;
  return span > mesh.perNode;
}

//===----------------------------------------------------------------------===//
// Stage times
//===----------------------------------------------------------------------===//

namespace {
struct Dims {
  double P, w, L, h, seq;
};
Dims dimsOf(const RoleSpec &role, const Workload &w) {
  return {double(paramCount(role.model)), double(role.dtypeBytes),
          double(role.model.layers), double(role.model.hidden),
          double(w.seqLen())};
}
double ceilDiv(double a, double b) { return std::ceil(a / b); }
} // namespace

TimeBreakdown trainSeconds(const RoleSpec &role, const Layout &l,
                           int64_t setDevices, const Device &dev,
                           const Mesh &mesh, const Workload &w,
                           const Calibration &cal) {
  TimeBreakdown out;
  const Dims d = dimsOf(role, w);
  const double t = double(l.tp), p = double(l.pp), dp = double(l.dp);
  const double m = double(std::max<int64_t>(w.microBatch, 1));
  const double steps = double(w.optimizerSteps());
  // Sequences of one data-parallel replica per optimizer step, and its
  // micro-batches.
  const double q = ceilDiv(double(w.sequences()), steps * dp);
  const double M = ceilDiv(q, m);
  const double mbTokens = m * d.seq;
  const double peak = peakFlops(dev, role.dtypeBytes);
  // One micro-batch through one pipeline stage.
  const double tauCompute =
      cal.trainFlopsPerParamToken * d.P * mbTokens / (t * p * peak * cal.trainEfficiency);
  const double act = mbTokens * d.h * d.w;
  double tauComm = 0;
  if (l.tp > 1) // 2 all-reduces forward, 2 backward per layer (Megatron)
    tauComm += 4 * (d.L / p) * allReduceSeconds(act, l.tp, false, mesh, cal);
  if (l.pp > 1) // activations forward, their gradients backward
    tauComm += 2 * p2pSeconds(act, spansNodes(setDevices, setDevices, mesh), mesh, cal);
  const double slots = M + p - 1; // pipeline: (M + p - 1) micro-batch slots
  double grad = 0;
  if (l.dp > 1)
    grad = allReduceSeconds(d.P * d.w / (t * p), l.dp,
                            spansNodes(l.tp * l.dp, setDevices, mesh), mesh, cal);
  const double reps = cal.epochs * steps;
  out.compute = reps * slots * tauCompute;
  out.comm = reps * (slots * tauComm + grad);
  return out;
}

TimeBreakdown forwardSeconds(const RoleSpec &role, const Layout &l,
                             int64_t setDevices, const Device &dev,
                             const Mesh &mesh, const Workload &w,
                             const Calibration &cal) {
  TimeBreakdown out;
  const Dims d = dimsOf(role, w);
  const double t = double(l.tp), p = double(l.pp), dp = double(l.dp);
  const double m = double(std::max<int64_t>(w.microBatch, 1));
  const double q = ceilDiv(double(w.sequences()), dp);
  const double M = ceilDiv(q, m);
  const double mbTokens = m * d.seq;
  const double peak = peakFlops(dev, role.dtypeBytes);
  const double tauCompute = cal.forwardFlopsPerParamToken * d.P * mbTokens /
                            (t * p * peak * cal.forwardEfficiency);
  const double act = mbTokens * d.h * d.w;
  double tauComm = 0;
  if (l.tp > 1)
    tauComm += 2 * (d.L / p) * allReduceSeconds(act, l.tp, false, mesh, cal);
  if (l.pp > 1)
    tauComm += p2pSeconds(act, spansNodes(setDevices, setDevices, mesh), mesh, cal);
  const double slots = M + p - 1;
  out.compute = slots * tauCompute;
  out.comm = slots * tauComm;
  return out;
}

GenTime generateSeconds(const RoleSpec &role, const Layout &gen,
                        int64_t setDevices, const Device &dev, const Mesh &mesh,
                        const Workload &w, const Calibration &cal) {
  GenTime out;
  const Dims d = dimsOf(role, w);
  const ModelShape &ms = role.model;
  const double t = double(gen.tp), p = double(gen.pp);
  const double b = ceilDiv(double(w.sequences()), double(gen.dp));
  const double sp = double(w.promptLen), sr = double(w.responseLen);
  const double peak = peakFlops(dev, role.dtypeBytes);
  const bool ppInter = spansNodes(setDevices, setDevices, mesh);

  // Prefill: compute bound; the p stages run one after another for one batch.
  const double prefillAct = b * sp * d.h * d.w;
  out.prefill = cal.forwardFlopsPerParamToken * d.P * b * sp / (t * peak * cal.prefillEfficiency);
  if (gen.tp > 1)
    out.prefill += 2 * d.L * allReduceSeconds(prefillAct, gen.tp, false, mesh, cal);
  if (gen.pp > 1)
    out.prefill += (p - 1) * p2pSeconds(prefillAct, ppInter, mesh, cal);

  // Decode: step j (0-based) reads the weights of its TP shard (all stages,
  // in turn) and the KV cache of s_p + j tokens per sequence, or is compute
  // bound, whichever is slower.
  const double headDim = d.h / double(ms.heads);
  const double kvTok = 2 * d.L * std::max(1.0, double(ms.kvHeads) / t) * headDim * d.w;
  const double bwEff = dev.memBandwidth * cal.decodeBandwidthEfficiency;
  const double memBase = d.P * d.w / t / bwEff;        // weights
  const double memSlope = b * kvTok / bwEff;            // per context token
  const double compute = 2 * d.P * b / (t * peak * cal.decodeComputeEfficiency);
  // Steps j in [0, j0) are compute bound: memBase + memSlope (sp + j) < compute.
  double j0 = 0;
  if (compute > memBase + memSlope * sp)
    j0 = memSlope > 0 ? std::min(sr, std::ceil((compute - memBase) / memSlope - sp))
                      : sr;
  j0 = std::max(0.0, std::min(sr, j0));
  const double k = sr - j0; // memory-bound steps j0 .. sr-1
  const double sumCtx = k * sp + (j0 + sr - 1) * k / 2; // sum of (sp + j)
  double decode = j0 * compute + k * memBase + memSlope * sumCtx;
  double perStep = cal.decodeStepOverhead;
  if (gen.tp > 1)
    perStep += 2 * d.L * allReduceSeconds(b * d.h * d.w, gen.tp, false, mesh, cal);
  if (gen.pp > 1)
    perStep += (p - 1) * p2pSeconds(b * d.h * d.w, ppInter, mesh, cal);
  out.decode = decode + sr * perStep;
  return out;
}

//===----------------------------------------------------------------------===//
// Weight transition
//===----------------------------------------------------------------------===//

TransitionInstance transitionInstance(const Layout &train, const Layout &gen,
                                      int64_t setDevices, const Mesh &mesh) {
  TransitionInstance in{train, gen, mesh.perNode};
  const int64_t rpn = mesh.perNode;
  const int64_t genMp = gen.tp * gen.pp;
  int64_t dp = train.dp;
  if (train.fsdp != 1 || gen.fsdp != 1 || train.sp * train.cp * gen.sp * gen.cp != 1)
    return in;
  if (train.pp == 1) {
    // Every rank's generation shard lies inside its own tp group (when
    // t_g p_g divides t): one tp group is the whole pattern.
    dp = 1;
  } else if (setDevices > rpn && (train.tp * train.dp) % rpn == 0) {
    // Stage blocks are whole nodes: one node per stage keeps the pattern
    // and the link class of every transfer.
    dp = rpn / train.tp;
  }
  const int64_t n = train.tp * train.pp * dp;
  if (dp < 1 || n % genMp != 0 || n > setDevices)
    return in;
  in.train.dp = dp;
  in.gen.dp = n / genMp;
  return in;
}

double transitionSecondsOn(const RoleSpec &role, const TransitionInstance &in,
                           const Mesh &mesh, const Calibration &cal) {
  const Layout &a = in.train, &b = in.gen;
  if (a.tp == b.tp && a.pp == b.pp && a.fsdp == b.fsdp && a.sp == b.sp &&
      a.cp == b.cp && a.dp == b.dp)
    return 0;
  rs::Options opts;
  opts.bytesPerElement = role.wireBytes > 0 ? role.wireBytes : role.dtypeBytes;
  opts.ranksPerNode = in.ranksPerNode;
  rs::Plan plan = rs::planWeights(rs::llamaParams(role.model), a, b,
                                  role.model.layers, opts);
  if (plan.totalBytes == 0)
    return 0;
  const int64_t n = a.size();
  // Bytes per (receiver, sender) pair.
  std::map<std::pair<int, int>, int64_t> pair;
  for (const rs::Transfer &t : plan.transfers)
    pair[{t.dst, t.src}] += t.bytes;
  struct Load {
    double intraBytes = 0, interBytes = 0;
    int64_t intraPeers = 0, interPeers = 0;
  };
  std::vector<Load> recv(static_cast<size_t>(n));
  for (auto &[k, bytes] : pair) {
    bool same = k.first / in.ranksPerNode == k.second / in.ranksPerNode;
    Load &l = recv[static_cast<size_t>(k.first)];
    (same ? l.intraBytes : l.interBytes) += double(bytes);
    ++(same ? l.intraPeers : l.interPeers);
  }
  double worst = 0;
  for (const Load &l : recv) {
    double ti = l.intraPeers ? l.intraBytes / (mesh.intraBw * cal.linkEfficiency) +
                                   cal.alphaIntra * double(l.intraPeers)
                             : 0;
    double te = l.interPeers ? l.interBytes / (mesh.interBw * cal.linkEfficiency) +
                                   cal.alphaInter * double(l.interPeers)
                             : 0;
    worst = std::max(worst, std::max(ti, te));
  }
  return worst;
}

double transitionSeconds(const RoleSpec &role, const Layout &train,
                         const Layout &gen, int64_t setDevices,
                         const Mesh &mesh, const Calibration &cal) {
  return transitionSecondsOn(role, transitionInstance(train, gen, setDevices, mesh),
                             mesh, cal);
}

} // namespace hflow::placement
