//===- SemaValues.cpp - checks of a single value ----------------------------===//
//
// What every checker asks of one literal: an integer, a number in a range,
// a fraction, a quantity with its unit, a boolean, a dtype.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"

namespace hflow::frontend::detail {

bool SemaBase::positiveInt(const Expr &v, int64_t &out, const std::string &what,
               bool allowZero) {
  if (v.kind != Expr::Kind::Int) {
    diags_.error(v.loc, what + " must be an integer");
    return false;
  }
  if (v.intValue < (allowZero ? 0 : 1)) {
    diags_.error(v.loc, what + (allowZero ? " must not be negative, got "
                                          : " must be positive, got ") +
                            std::to_string(v.intValue));
    return false;
  }
  out = v.intValue;
  return true;
}

bool SemaBase::quantity(const ast::Arg *a, units::Kind kind, double &out,
            const std::string &what) {
  const Expr &v = *a->value;
  if (v.kind == Expr::Kind::Int || v.kind == Expr::Kind::Float) {
    diags_.error(v.loc, what + " needs a unit: it is " + units::kindName(kind));
    return false;
  }
  if (v.kind != Expr::Kind::Quantity) {
    diags_.error(v.loc, what + " must be " + units::kindName(kind));
    return false;
  }
  auto unit = units::parseUnit(v.unit);
  if (!unit) {
    diags_.error(v.loc, "unknown unit '" + v.unit +
                            "'; sizes: B, KB, MB, GB, TB, KiB..TiB; "
                            "bandwidths: GB/s, Gbps, ...; rates: TFLOPS, ...");
    return false;
  }
  if (unit->kind != kind) {
    diags_.error(v.loc, what + " must be " + units::kindName(kind) + ", but '" +
                            v.text + "' is " + units::kindName(unit->kind));
    return false;
  }
  if (!(v.floatValue > 0)) {
    diags_.error(v.loc, what + " must be positive");
    return false;
  }
  out = v.floatValue * unit->factor;
  return true;
}

bool SemaBase::boolArg(const Expr &v, const std::string &what, bool &out) {
  if (v.kind == Expr::Kind::Name && (v.text == "true" || v.text == "false")) {
    out = v.text == "true";
    return true;
  }
  diags_.error(v.loc, what + " must be true or false");
  return false;
}

bool SemaBase::dtypeArg(const Expr &v, ast::DType &out) {
  if (v.kind == Expr::Kind::Name && v.text == "f32")
    out = ast::DType::F32;
  else if (v.kind == Expr::Kind::Name && v.text == "bf16")
    out = ast::DType::BF16;
  else if (v.kind == Expr::Kind::Name && v.text == "f16")
    out = ast::DType::F16;
  else {
    diags_.error(v.loc, "dtype must be one of f32, bf16, f16");
    return false;
  }
  return true;
}

bool SemaBase::number(const Expr &v, const std::string &what, double lo, double hi,
          bool integer, double &out) {
  bool isNum = v.kind == Expr::Kind::Int ||
               (!integer && v.kind == Expr::Kind::Float);
  double x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
  if (!isNum) {
    diags_.error(v.loc, what + (integer ? " must be an integer"
                                        : " must be a number"));
    return false;
  }
  if (lo == 0 && hi < 0 && x < 0) {
    diags_.error(v.loc, what + " must not be negative, got " + v.text);
    return false;
  }
  if (x < lo || (hi >= 0 && x > hi)) {
    std::ostringstream range;
    range << what << " must be in [" << lo << ", ";
    if (hi >= 0)
      range << hi;
    else
      range << "inf";
    range << "], got " << v.text;
    diags_.error(v.loc, range.str());
    return false;
  }
  out = x;
  return true;
}

bool SemaBase::unitFraction(const Expr &v, const std::string &what, double &out) {
  if (v.kind != Expr::Kind::Int && v.kind != Expr::Kind::Float) {
    diags_.error(v.loc, what + " must be a number");
    return false;
  }
  const double x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
  if (!(x > 0 && x <= 1)) {
    diags_.error(v.loc, what + " must be in (0, 1], got " + v.text);
    return false;
  }
  out = x;
  return true;
}

} // namespace hflow::frontend::detail
