// The syntax tree of the Jinja subset (jinja.h); shared by the parser and the renderer only.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"

namespace lazyrag::jinja {

struct Expr {
  enum class Type {
    kLiteral,  // value
    kName,     // name
    kAttr,     // a.name
    kIndex,    // a[b]
    kSlice,    // a[b:c:d]; null children are omitted bounds
    kCall,     // a(args...) where a is a name or an attribute (method)
    kFilter,   // a | name(args...)
    kTest,     // a is [not] name(args...)   (negate)
    kNot,      // not a
    kNeg,      // -a
    kBinary,   // a op b
    kAnd,
    kOr,
    kTernary,  // a if b else c (c may be null)
    kList,     // [args...]
    kDict,     // {args[0]: args[1], ...}
  };
  Type type = Type::kLiteral;
  Json value;        // kLiteral
  std::string name;  // kName, kAttr, kCall (when a is null: global function), kFilter, kTest, op
  bool negate = false;
  std::unique_ptr<Expr> a, b, c, d;
  std::vector<std::unique_ptr<Expr>> args;
  // kCall, kFilter, kTest: the keyword of each argument ("" for positional ones).
  std::vector<std::string> kwnames;
};

struct Node {
  enum class Type { kBody, kText, kOutput, kIf, kFor, kSet };
  Type type = Type::kBody;
  std::string text;                               // kText
  std::unique_ptr<Expr> expr;                     // kOutput, kFor (iterable), kSet (value)
  std::vector<std::unique_ptr<Node>> children;    // kBody; kFor: body; kIf: one kBody per branch
  std::vector<std::unique_ptr<Expr>> conditions;  // kIf: one per branch (null: else)
  std::unique_ptr<Expr> filter;                   // kFor: `if` condition
  std::unique_ptr<Node> else_body;                // kFor
  // kFor: loop variables; kSet: the name, or {namespace, attribute} for `set ns.attr = ...`.
  std::vector<std::string> targets;
};

}  // namespace lazyrag::jinja
