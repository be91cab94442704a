// Evaluation of the Jinja subset (jinja.h) with Python/Jinja2 semantics for the values chat
// templates use: JSON values plus Jinja's "undefined".
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/model/tokenizer/jinja.h"
#include "worker/model/tokenizer/jinja_ast.h"
#include "worker/model/tokenizer/jinja_value.h"

namespace lazyrag {
namespace jinja {

absl::StatusOr<std::unique_ptr<Node>> ParseTemplateSource(std::string_view source);

namespace {

class Renderer {
 public:
  explicit Renderer(const Json& context) { scopes_.push_back(context); }

  absl::Status Render(const Node& n, std::string* out) {
    switch (n.type) {
      case Node::Type::kBody:
        for (const auto& c : n.children) {
          if (absl::Status s = Render(*c, out); !s.ok()) return s;
        }
        return absl::OkStatus();
      case Node::Type::kText:
        return Append(n.text, out);
      case Node::Type::kOutput: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        return Append(Str(*v), out);
      }
      case Node::Type::kIf:
        for (size_t i = 0; i < n.conditions.size(); ++i) {
          bool take = n.conditions[i] == nullptr;
          if (!take) {
            auto c = Eval(*n.conditions[i]);
            if (!c.ok()) return c.status();
            take = Truthy(*c);
          }
          if (take) return Render(*n.children[i], out);
        }
        return absl::OkStatus();
      case Node::Type::kSet: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (n.targets.size() == 2) return SetAttribute(n.targets[0], n.targets[1], *v);
        // An undefined value is kept as `discarded`, which Lookup reads back as undefined.
        scopes_.back()[n.targets[0]] =
            v->undefined ? Json(Json::value_t::discarded) : std::move(v->j);
        return absl::OkStatus();
      }
      case Node::Type::kFor:
        return RenderFor(n, out);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Append(const std::string& s, std::string* out) {
    if (out->size() + s.size() > JinjaTemplate::kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: output too long");
    }
    out->append(s);
    return absl::OkStatus();
  }

  absl::Status RenderFor(const Node& n, std::string* out) {
    auto iterable = Eval(*n.expr);
    if (!iterable.ok()) return iterable.status();
    std::vector<Json> items;
    if (n.targets.size() == 2 && !iterable->undefined && iterable->j.is_object()) {
      for (auto it = iterable->j.begin(); it != iterable->j.end(); ++it) {
        items.push_back(Json::array({it.key(), *it}));
      }
    } else {
      auto all = Items(*iterable);
      if (!all.ok()) return all.status();
      items = std::move(*all);
    }
    // The loop's own scope: loop variables, `loop` and sets inside the body.
    auto bind = [&](Json* scope, const Json& item) -> absl::Status {
      if (n.targets.size() == 1) {
        (*scope)[n.targets[0]] = item;
        return absl::OkStatus();
      }
      if (!item.is_array() || item.size() != n.targets.size()) {
        return TypeError("cannot unpack a loop item into two variables");
      }
      for (size_t t = 0; t < n.targets.size(); ++t) (*scope)[n.targets[t]] = item[t];
      return absl::OkStatus();
    };
    if (n.filter != nullptr) {
      std::vector<Json> kept;
      for (const Json& item : items) {
        scopes_.push_back(Json::object());
        absl::Status s = bind(&scopes_.back(), item);
        absl::StatusOr<Value> keep = s.ok() ? Eval(*n.filter) : absl::StatusOr<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return n.else_body ? Render(*n.else_body, out) : absl::OkStatus();
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      if (++iterations_ > JinjaTemplate::kMaxLoopIterations) {
        return absl::ResourceExhaustedError("chat template: too many loop iterations");
      }
      Json scope = Json::object();
      if (absl::Status s = bind(&scope, items[i]); !s.ok()) return s;
      scope["loop"] = {{"index", i + 1},         {"index0", i},
                       {"revindex", length - i}, {"revindex0", length - i - 1},
                       {"first", i == 0},        {"last", i == length - 1},
                       {"length", length}};
      scopes_.push_back(std::move(scope));
      absl::Status s = Render(*n.children[0], out);
      scopes_.pop_back();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // `set ns.attr = v`: changes the namespace object where it lives (an outer scope too), as
  // Jinja's namespace() does from inside a loop.
  absl::Status SetAttribute(const std::string& name, const std::string& attr, const Value& v) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found == it->end()) continue;
      if (!found->is_object()) {
        return TypeError(absl::StrCat("cannot set attribute '", attr, "' of ", name, " (a ",
                                      found->type_name(), ")"));
      }
      (*found)[attr] = v.undefined ? Json(Json::value_t::discarded) : v.j;
      return absl::OkStatus();
    }
    return TypeError(absl::StrCat("'", name, "' is undefined (set ", name, ".", attr, ")"));
  }

  static absl::Status NoKeywords(const Expr& e, std::string_view what) {
    for (const std::string& k : e.kwnames) {
      if (!k.empty()) {
        return Unsupported(absl::StrCat("keyword argument '", k, "' of ", std::string(what)));
      }
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->is_discarded() ? Undefined() : Of(*found);
    }
    return Undefined();
  }

  absl::StatusOr<Value> Attribute(const Value& base, const Json& key) {
    if (base.undefined) return TypeError("attribute of an undefined value");
    const Json& j = base.j;
    if (j.is_object() && key.is_string()) {
      auto it = j.find(key.get<std::string>());
      return it == j.end() || it->is_discarded() ? Undefined() : Of(*it);
    }
    if ((j.is_array() || j.is_string()) && key.is_number_integer()) {
      int64_t i = key.get<int64_t>();
      const int64_t n = j.is_array() ? static_cast<int64_t>(j.size())
                                     : static_cast<int64_t>(j.get_ref<const std::string&>().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined();
      if (j.is_array()) return Of(j[static_cast<size_t>(i)]);
      return Of(std::string(1, j.get_ref<const std::string&>()[static_cast<size_t>(i)]));
    }
    return Undefined();
  }

  absl::StatusOr<Value> Slice(const Value& base, const Expr& e) {
    auto bound = [&](const Expr* x, int64_t dflt) -> absl::StatusOr<int64_t> {
      if (x == nullptr) return dflt;
      auto v = Eval(*x);
      if (!v.ok()) return v.status();
      if (v->undefined || v->j.is_null()) return dflt;
      if (!v->j.is_number_integer()) return TypeError("slice bounds must be integers");
      return v->j.get<int64_t>();
    };
    auto items = Items(base);
    if (!items.ok()) return items.status();
    const int64_t n = static_cast<int64_t>(items->size());
    auto step = bound(e.d.get(), 1);
    if (!step.ok()) return step.status();
    if (*step == 0) return TypeError("slice step cannot be zero");
    auto start = bound(e.b.get(), *step > 0 ? 0 : n - 1);
    auto stop = bound(e.c.get(), *step > 0 ? n : -n - 1);
    if (!start.ok()) return start.status();
    if (!stop.ok()) return stop.status();
    auto clamp = [&](int64_t x) {
      if (x < 0) x += n;
      return *step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t a = e.b ? clamp(*start) : *start;
    const int64_t b = e.c ? clamp(*stop) : (*step > 0 ? n : -1);
    Json out = Json::array();
    std::string text;
    for (int64_t i = a; *step > 0 ? i < b : i > b; i += *step) {
      if (base.j.is_string()) {
        text += (*items)[static_cast<size_t>(i)].get<std::string>();
      } else {
        out.push_back((*items)[static_cast<size_t>(i)]);
      }
    }
    if (base.j.is_string()) return Of(text);
    return Of(std::move(out));
  }

  absl::StatusOr<std::vector<Value>> Args(const Expr& e) {
    std::vector<Value> out;
    for (const auto& a : e.args) {
      auto v = Eval(*a);
      if (!v.ok()) return v.status();
      out.push_back(std::move(*v));
    }
    return out;
  }

  absl::StatusOr<Value> Method(const Value& base, const std::string& name,
                               const std::vector<Value>& args) {
    if (base.undefined) return TypeError(absl::StrCat("method '", name, "' of an undefined value"));
    const Json& j = base.j;
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      if (name == "strip") return Of(StripChars(s, true, true, args));
      if (name == "lstrip") return Of(StripChars(s, true, false, args));
      if (name == "rstrip") return Of(StripChars(s, false, true, args));
      if (name == "upper") return Of(absl::AsciiStrToUpper(s));
      if (name == "lower") return Of(absl::AsciiStrToLower(s));
      if ((name == "startswith" || name == "endswith") && args.size() == 1 &&
          args[0].j.is_string()) {
        const std::string& x = args[0].j.get_ref<const std::string&>();
        const bool start = name == "startswith";
        return Of(s.size() >= x.size() &&
                  s.compare(start ? 0 : s.size() - x.size(), x.size(), x) == 0);
      }
      if (name == "split" && args.size() == 1 && args[0].j.is_string() &&
          !args[0].j.get<std::string>().empty()) {
        Json out = Json::array();
        for (absl::string_view p : absl::StrSplit(s, args[0].j.get<std::string>())) {
          out.push_back(std::string(p));
        }
        return Of(std::move(out));
      }
    }
    if (j.is_object()) {
      if (name == "get" && !args.empty() && args.size() <= 2) {
        auto v = Attribute(base, args[0].j);
        if (!v.ok()) return v;
        if (v->undefined) return args.size() == 2 ? args[1] : Of(nullptr);
        return v;
      }
      if (name == "items" || name == "keys" || name == "values") {
        Json out = Json::array();
        for (auto it = j.begin(); it != j.end(); ++it) {
          if (name == "items") out.push_back(Json::array({it.key(), *it}));
          if (name == "keys") out.push_back(it.key());
          if (name == "values") out.push_back(*it);
        }
        return Of(std::move(out));
      }
    }
    return Unsupported(absl::StrCat("method '", name, "' of a ", j.type_name()));
  }

  absl::StatusOr<Value> Call(const Expr& e) {
    auto args = Args(e);
    if (!args.ok()) return args.status();
    if (e.a == nullptr && e.name == "namespace") {
      Json ns = Json::object();
      for (size_t i = 0; i < args->size(); ++i) {
        if (e.kwnames[i].empty()) return Unsupported("namespace() with positional arguments");
        ns[e.kwnames[i]] = (*args)[i].undefined ? Json(Json::value_t::discarded) : (*args)[i].j;
      }
      return Of(std::move(ns));
    }
    if (absl::Status s = NoKeywords(e, e.name); !s.ok()) return s;
    if (e.a != nullptr) {
      auto base = Eval(*e.a);
      if (!base.ok()) return base;
      return Method(*base, e.name, *args);
    }
    if (e.name == "raise_exception") {
      return absl::FailedPreconditionError(
          absl::StrCat("chat template raised: ", args->empty() ? std::string() : Str((*args)[0])));
    }
    if (e.name == "range" && args->size() == 1 && (*args)[0].j.is_number_integer()) {
      Json out = Json::array();
      const int64_t n = (*args)[0].j.get<int64_t>();
      if (n > JinjaTemplate::kMaxLoopIterations) return TypeError("range too long");
      for (int64_t i = 0; i < n; ++i) out.push_back(i);
      return Of(std::move(out));
    }
    return Unsupported(absl::StrCat("function '", e.name, "'"));
  }

  absl::StatusOr<Value> Filter(const Expr& e) {
    auto base = Eval(*e.a);
    if (!base.ok()) return base;
    auto args = Args(e);
    if (!args.ok()) return args.status();
    if (absl::Status s = NoKeywords(e, "filter " + e.name); !s.ok()) return s;
    const std::string& f = e.name;
    const Value& v = *base;
    if (f == "trim") return Of(StripChars(Str(v), true, true, {}));
    if (f == "length" || f == "count") return Of(Length(v));
    if (f == "upper") return Of(absl::AsciiStrToUpper(Str(v)));
    if (f == "lower") return Of(absl::AsciiStrToLower(Str(v)));
    if (f == "string") return Of(Str(v));
    if (f == "default" || f == "d") {
      if (v.undefined) return args->empty() ? Of(std::string()) : (*args)[0];
      return v;
    }
    if (f == "first" || f == "last") {
      auto items = Items(v);
      if (!items.ok()) return items.status();
      if (items->empty()) return Undefined();
      return Of(f == "first" ? items->front() : items->back());
    }
    if (f == "join") {
      auto items = Items(v);
      if (!items.ok()) return items.status();
      const std::string sep = args->empty() ? "" : Str((*args)[0]);
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        if (i > 0) out += sep;
        out += Str(Of((*items)[i]));
      }
      return Of(out);
    }
    if (f == "tojson" && args->empty()) {
      if (v.undefined) return TypeError("tojson of an undefined value");
      return Of(JsonDump(v.j));
    }
    return Unsupported(absl::StrCat("filter '", f, "'"));
  }

  absl::StatusOr<Value> Test(const Expr& e) {
    auto base = Eval(*e.a);
    if (!base.ok()) return base;
    const Value& v = *base;
    const Json& j = v.j;
    const std::string& t = e.name;
    if (absl::Status s = NoKeywords(e, "test " + t); !s.ok()) return s;
    bool r;
    if (t == "defined") {
      r = !v.undefined;
    } else if (t == "undefined") {
      r = v.undefined;
    } else if (t == "none") {
      r = !v.undefined && j.is_null();
    } else if (t == "string") {
      r = !v.undefined && j.is_string();
    } else if (t == "number") {
      r = !v.undefined && j.is_number();
    } else if (t == "integer") {
      r = !v.undefined && j.is_number_integer();
    } else if (t == "boolean") {
      r = !v.undefined && j.is_boolean();
    } else if (t == "true" || t == "false") {
      r = !v.undefined && j.is_boolean() && j.get<bool>() == (t == "true");
    } else if (t == "mapping") {
      r = !v.undefined && j.is_object();
    } else if (t == "sequence" || t == "iterable") {
      r = !v.undefined && (j.is_array() || j.is_string() || j.is_object());
    } else if ((t == "odd" || t == "even") && !v.undefined && j.is_number_integer()) {
      r = (j.get<int64_t>() % 2 != 0) == (t == "odd");
    } else {
      return Unsupported(absl::StrCat("test '", t, "'"));
    }
    return Of(r != e.negate);
  }

  absl::StatusOr<Value> Binary(const Expr& e) {
    auto av = Eval(*e.a);
    if (!av.ok()) return av;
    auto bv = Eval(*e.b);
    if (!bv.ok()) return bv;
    const Value& a = *av;
    const Value& b = *bv;
    const std::string& op = e.name;
    if (op == "~") return Of(Str(a) + Str(b));
    if (op == "==") return Of(Equal(a, b));
    if (op == "!=") return Of(!Equal(a, b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.undefined) return TypeError("'in' an undefined value");
      if (b.j.is_string()) {
        if (a.undefined || !a.j.is_string()) return TypeError("'in <string>' needs a string");
        found = b.j.get_ref<const std::string&>().find(a.j.get_ref<const std::string&>()) !=
                std::string::npos;
      } else if (b.j.is_object()) {
        found = a.j.is_string() && b.j.contains(a.j.get<std::string>());
      } else if (b.j.is_array()) {
        for (const Json& x : b.j) found = found || Equal(a, Of(x));
      } else {
        return TypeError("'in' needs a string, list or dict");
      }
      return Of(found == (op == "in"));
    }
    if (a.undefined || b.undefined) {
      return TypeError(absl::StrCat("operator '", op, "' on an undefined value"));
    }
    if (op == "+" && a.j.is_string() && b.j.is_string()) {
      return Of(a.j.get<std::string>() + b.j.get<std::string>());
    }
    if (op == "+" && a.j.is_array() && b.j.is_array()) {
      Json out = a.j;
      for (const Json& x : b.j) out.push_back(x);
      return Of(std::move(out));
    }
    if ((op == "<" || op == ">" || op == "<=" || op == ">=") && a.j.is_string() &&
        b.j.is_string()) {
      const int c = a.j.get_ref<const std::string&>().compare(b.j.get_ref<const std::string&>());
      return Of(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    const bool numbers =
        (a.j.is_number() || a.j.is_boolean()) && (b.j.is_number() || b.j.is_boolean());
    if (!numbers) {
      return TypeError(
          absl::StrCat("operator '", op, "' on ", a.j.type_name(), " and ", b.j.type_name()));
    }
    const bool ints = !a.j.is_number_float() && !b.j.is_number_float();
    const double x = a.j.is_boolean() ? a.j.get<bool>() : a.j.get<double>();
    const double y = b.j.is_boolean() ? b.j.get<bool>() : b.j.get<double>();
    const int64_t xi = ints ? (a.j.is_boolean() ? a.j.get<bool>() : a.j.get<int64_t>()) : 0;
    const int64_t yi = ints ? (b.j.is_boolean() ? b.j.get<bool>() : b.j.get<int64_t>()) : 0;
    if (op == "<") return Of(x < y);
    if (op == ">") return Of(x > y);
    if (op == "<=") return Of(x <= y);
    if (op == ">=") return Of(x >= y);
    if (op == "+") return ints ? Of(xi + yi) : Of(x + y);
    if (op == "-") return ints ? Of(xi - yi) : Of(x - y);
    if (op == "*") return ints ? Of(xi * yi) : Of(x * y);
    if (y == 0 && (op == "/" || op == "//" || op == "%")) return TypeError("division by zero");
    if (op == "/") return Of(x / y);
    if (op == "//") {
      if (ints) return Of(static_cast<int64_t>(std::floor(double(xi) / double(yi))));
      return Of(std::floor(x / y));
    }
    if (op == "%") {
      if (ints) {
        int64_t m = xi % yi;
        if (m != 0 && ((m < 0) != (yi < 0))) m += yi;  // Python's sign follows the divisor
        return Of(m);
      }
      return Of(x - y * std::floor(x / y));
    }
    return Unsupported(absl::StrCat("operator '", op, "'"));
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.type) {
      case Expr::Type::kLiteral:
        return Of(e.value);
      case Expr::Type::kName:
        return Lookup(e.name);
      case Expr::Type::kAttr: {
        auto base = Eval(*e.a);
        if (!base.ok()) return base;
        return Attribute(*base, e.name);
      }
      case Expr::Type::kIndex: {
        auto base = Eval(*e.a);
        if (!base.ok()) return base;
        auto key = Eval(*e.b);
        if (!key.ok()) return key;
        if (key->undefined) return TypeError("index is undefined");
        return Attribute(*base, key->j);
      }
      case Expr::Type::kSlice: {
        auto base = Eval(*e.a);
        if (!base.ok()) return base;
        if (base->undefined) return TypeError("slice of an undefined value");
        return Slice(*base, e);
      }
      case Expr::Type::kCall:
        return Call(e);
      case Expr::Type::kFilter:
        return Filter(e);
      case Expr::Type::kTest:
        return Test(e);
      case Expr::Type::kNot: {
        auto v = Eval(*e.a);
        if (!v.ok()) return v;
        return Of(!Truthy(*v));
      }
      case Expr::Type::kNeg: {
        auto v = Eval(*e.a);
        if (!v.ok()) return v;
        if (v->undefined || !v->j.is_number()) return TypeError("unary minus on a non-number");
        if (v->j.is_number_integer()) return Of(-v->j.get<int64_t>());
        return Of(-v->j.get<double>());
      }
      case Expr::Type::kBinary:
        return Binary(e);
      case Expr::Type::kAnd:
      case Expr::Type::kOr: {
        auto a = Eval(*e.a);
        if (!a.ok()) return a;
        // Python: `a and b` is a when a is false, else b; `a or b` is a when a is true.
        if (Truthy(*a) == (e.type == Expr::Type::kOr)) return a;
        return Eval(*e.b);
      }
      case Expr::Type::kTernary: {
        auto c = Eval(*e.b);
        if (!c.ok()) return c;
        if (Truthy(*c)) return Eval(*e.a);
        return e.c ? Eval(*e.c) : Undefined();
      }
      case Expr::Type::kList: {
        Json out = Json::array();
        for (const auto& a : e.args) {
          auto v = Eval(*a);
          if (!v.ok()) return v;
          out.push_back(v->j);
        }
        return Of(std::move(out));
      }
      case Expr::Type::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          auto k = Eval(*e.args[i]);
          if (!k.ok()) return k;
          auto v = Eval(*e.args[i + 1]);
          if (!v.ok()) return v;
          if (!k->j.is_string()) return TypeError("dict keys must be strings");
          out[k->j.get<std::string>()] = v->j;
        }
        return Of(std::move(out));
      }
    }
    return Unsupported("expression");
  }

  std::vector<Json> scopes_;  // innermost last
  int64_t iterations_ = 0;
};

}  // namespace
}  // namespace jinja

JinjaTemplate::JinjaTemplate() = default;
JinjaTemplate::~JinjaTemplate() = default;

absl::StatusOr<std::unique_ptr<JinjaTemplate>> JinjaTemplate::Parse(std::string_view source) {
  auto root = jinja::ParseTemplateSource(source);
  if (!root.ok()) return root.status();
  std::unique_ptr<JinjaTemplate> t(new JinjaTemplate());
  t->root_ = std::move(*root);
  return t;
}

absl::StatusOr<std::string> JinjaTemplate::Render(const Json& context) const {
  if (!context.is_object())
    return absl::InvalidArgumentError("chat template: context not an object");
  std::string out;
  jinja::Renderer r(context);
  if (absl::Status s = r.Render(*root_, &out); !s.ok()) return s;
  return out;
}

}  // namespace lazyrag
