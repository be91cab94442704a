// Recursive-descent parser of the Jinja subset (jinja.h) over the lexer's chunks. Operator
// precedence follows Jinja2's parser: ternary < or < and < not < comparison < + - < ~ < * / // % <
// unary minus < postfix (attribute, index, call) and filters/tests.
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/tokenizer/jinja.h"
#include "worker/model/tokenizer/jinja_ast.h"
#include "worker/model/tokenizer/jinja_lexer.h"

namespace lazyrag {
namespace jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  absl::StatusOr<std::unique_ptr<Node>> ParseTemplate() {
    auto body = std::make_unique<Node>();
    std::string end;
    absl::Status s = ParseBody(body.get(), {}, &end);
    if (!s.ok()) return s;
    return body;
  }

 private:
  // Parses nodes into `body` until a statement whose keyword is in `stops` (left unconsumed in
  // the chunk list: *stop gets the keyword, tokens point after it) or the end.
  absl::Status ParseBody(Node* body, const std::vector<std::string>& stops, std::string* stop) {
    while (chunk_ < chunks_.size()) {
      Chunk& c = chunks_[chunk_];
      if (c.kind == Chunk::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->type = Node::Type::kText;
        n->text = c.text;
        body->children.push_back(std::move(n));
        ++chunk_;
        continue;
      }
      tokens_ = &c.tokens;
      tok_ = 0;
      offset_ = c.offset;
      if (c.kind == Chunk::Kind::kOutput) {
        ++chunk_;
        auto n = std::make_unique<Node>();
        n->type = Node::Type::kOutput;
        auto e = ParseExpr();
        if (!e.ok()) return e.status();
        n->expr = std::move(*e);
        if (absl::Status s = ExpectEnd(); !s.ok()) return s;
        body->children.push_back(std::move(n));
        continue;
      }
      if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected a statement");
      const std::string keyword = Peek().text;
      for (const std::string& s : stops) {
        if (keyword == s) {
          ++tok_;
          ++chunk_;
          *stop = keyword;
          return absl::OkStatus();
        }
      }
      ++tok_;
      ++chunk_;
      absl::Status s;
      if (keyword == "if") {
        s = ParseIf(body);
      } else if (keyword == "for") {
        s = ParseFor(body);
      } else if (keyword == "set") {
        s = ParseSet(body);
      } else if (keyword == "elif" || keyword == "else" || keyword == "endif" ||
                 keyword == "endfor") {
        return Malformed(offset_, absl::StrCat("unexpected '", keyword, "'"));
      } else {
        return absl::UnimplementedError(
            absl::StrCat("chat template: statement '", keyword, "' is not supported"));
      }
      if (!s.ok()) return s;
    }
    if (!stops.empty()) {
      return Malformed(offset_, absl::StrCat("missing '", stops.back(), "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseIf(Node* body) {
    auto n = std::make_unique<Node>();
    n->type = Node::Type::kIf;
    auto cond = ParseExpr();
    if (!cond.ok()) return cond.status();
    if (absl::Status s = ExpectEnd(); !s.ok()) return s;
    n->conditions.push_back(std::move(*cond));
    while (true) {
      auto branch = std::make_unique<Node>();
      std::string stop;
      if (absl::Status s = ParseBody(branch.get(), {"elif", "else", "endif"}, &stop); !s.ok())
        return s;
      n->children.push_back(std::move(branch));
      if (stop == "endif") return Finish(body, std::move(n));
      if (stop == "else") {
        if (absl::Status s = ExpectEnd(); !s.ok()) return s;
        n->conditions.push_back(nullptr);
        auto last = std::make_unique<Node>();
        if (absl::Status s = ParseBody(last.get(), {"endif"}, &stop); !s.ok()) return s;
        n->children.push_back(std::move(last));
        return Finish(body, std::move(n));
      }
      auto c = ParseExpr();  // elif
      if (!c.ok()) return c.status();
      if (absl::Status s = ExpectEnd(); !s.ok()) return s;
      n->conditions.push_back(std::move(*c));
    }
  }

  absl::Status ParseFor(Node* body) {
    auto n = std::make_unique<Node>();
    n->type = Node::Type::kFor;
    do {
      if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected a loop variable");
      n->targets.push_back(Next().text);
    } while (Accept(","));
    if (n->targets.size() > 2) {
      return absl::UnimplementedError("chat template: more than two loop variables");
    }
    if (Peek().kind != Token::Kind::kName || Next().text != "in")
      return Malformed(offset_, "expected 'in'");
    auto iter = ParseOr();  // no ternary: a following `if` filters the loop
    if (!iter.ok()) return iter.status();
    n->expr = std::move(*iter);
    if (Peek().kind == Token::Kind::kName && Peek().text == "if") {
      ++tok_;
      auto f = ParseOr();
      if (!f.ok()) return f.status();
      n->filter = std::move(*f);
    }
    if (Peek().kind == Token::Kind::kName && Peek().text == "recursive")
      return absl::UnimplementedError("chat template: recursive loops are not supported");
    if (absl::Status s = ExpectEnd(); !s.ok()) return s;
    auto loop_body = std::make_unique<Node>();
    std::string stop;
    if (absl::Status s = ParseBody(loop_body.get(), {"else", "endfor"}, &stop); !s.ok()) return s;
    n->children.push_back(std::move(loop_body));
    if (stop == "else") {
      if (absl::Status s = ExpectEnd(); !s.ok()) return s;
      n->else_body = std::make_unique<Node>();
      if (absl::Status s = ParseBody(n->else_body.get(), {"endfor"}, &stop); !s.ok()) return s;
    }
    return Finish(body, std::move(n));
  }

  absl::Status ParseSet(Node* body) {
    auto n = std::make_unique<Node>();
    n->type = Node::Type::kSet;
    if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected a name after set");
    n->targets.push_back(Next().text);
    if (Accept(".")) {  // `set ns.attr = value` (a namespace() object)
      if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected an attribute");
      n->targets.push_back(Next().text);
    }
    if (PeekOp(",")) return absl::UnimplementedError("chat template: tuple assignment");
    if (!Accept("=")) {
      return absl::UnimplementedError("chat template: block assignment ({% set %}...{% endset %})");
    }
    auto e = ParseExpr();
    if (!e.ok()) return e.status();
    n->expr = std::move(*e);
    if (absl::Status s = ExpectEnd(); !s.ok()) return s;
    body->children.push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status Finish(Node* body, std::unique_ptr<Node> n) {
    if (absl::Status s = ExpectEnd(); !s.ok()) return s;
    body->children.push_back(std::move(n));
    return absl::OkStatus();
  }

  const Token& Peek() const { return (*tokens_)[tok_]; }
  const Token& Next() {
    const Token& t = (*tokens_)[tok_];
    if (t.kind != Token::Kind::kEnd) ++tok_;
    return t;
  }
  bool PeekOp(std::string_view op) const {
    return Peek().kind == Token::Kind::kOp && Peek().text == op;
  }
  bool PeekName(std::string_view name) const {
    return Peek().kind == Token::Kind::kName && Peek().text == name;
  }
  bool Accept(std::string_view op) {
    if (!PeekOp(op)) return false;
    ++tok_;
    return true;
  }
  absl::Status Expect(std::string_view op) {
    if (Accept(op)) return absl::OkStatus();
    return Malformed(offset_, absl::StrCat("expected '", std::string(op), "'"));
  }
  absl::Status ExpectEnd() {
    if (Peek().kind == Token::Kind::kEnd) return absl::OkStatus();
    return Malformed(offset_, absl::StrCat("unexpected '", Peek().text, "' in tag"));
  }

  using ExprOr = absl::StatusOr<std::unique_ptr<Expr>>;

  static std::unique_ptr<Expr> Make(Expr::Type type, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->name = std::move(name);
    return e;
  }

  ExprOr ParseExpr() {
    if (++depth_ > kMaxDepth) return Malformed(offset_, "expression nests too deep");
    auto value = ParseOr();
    if (value.ok() && PeekName("if")) {
      ++tok_;
      auto cond = ParseOr();
      if (!cond.ok()) return cond;
      auto t = Make(Expr::Type::kTernary);
      t->a = std::move(*value);
      t->b = std::move(*cond);
      if (PeekName("else")) {
        ++tok_;
        auto other = ParseExpr();
        if (!other.ok()) return other;
        t->c = std::move(*other);
      }
      --depth_;
      return t;
    }
    --depth_;
    return value;
  }

  ExprOr ParseOr() {
    auto left = ParseAnd();
    while (left.ok() && PeekName("or")) {
      ++tok_;
      auto right = ParseAnd();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kOr);
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseAnd() {
    auto left = ParseNot();
    while (left.ok() && PeekName("and")) {
      ++tok_;
      auto right = ParseNot();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kAnd);
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseNot() {
    if (PeekName("not")) {
      ++tok_;
      if (++depth_ > kMaxDepth) return Malformed(offset_, "expression nests too deep");
      auto inner = ParseNot();
      --depth_;
      if (!inner.ok()) return inner;
      auto e = Make(Expr::Type::kNot);
      e->a = std::move(*inner);
      return e;
    }
    return ParseCompare();
  }

  ExprOr ParseCompare() {
    auto left = ParseAdd();
    while (left.ok()) {
      std::string op;
      if (Peek().kind == Token::Kind::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (PeekName("in")) {
        ++tok_;
        op = "in";
      } else if (PeekName("not") && tok_ + 1 < tokens_->size() &&
                 (*tokens_)[tok_ + 1].kind == Token::Kind::kName &&
                 (*tokens_)[tok_ + 1].text == "in") {
        tok_ += 2;
        op = "not in";
      } else {
        break;
      }
      auto right = ParseAdd();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kBinary, op);
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseAdd() {
    auto left = ParseConcat();
    while (left.ok() && (PeekOp("+") || PeekOp("-"))) {
      const std::string op = Next().text;
      auto right = ParseConcat();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kBinary, op);
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseConcat() {
    auto left = ParseMul();
    while (left.ok() && PeekOp("~")) {
      ++tok_;
      auto right = ParseMul();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kBinary, "~");
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseMul() {
    auto left = ParseUnary();
    while (left.ok() && (PeekOp("*") || PeekOp("/") || PeekOp("//") || PeekOp("%"))) {
      const std::string op = Next().text;
      auto right = ParseUnary();
      if (!right.ok()) return right;
      auto e = Make(Expr::Type::kBinary, op);
      e->a = std::move(*left);
      e->b = std::move(*right);
      left = std::move(e);
    }
    return left;
  }

  ExprOr ParseUnary() {
    if (PeekOp("-") || PeekOp("+")) {
      const bool neg = Next().text == "-";
      if (++depth_ > kMaxDepth) return Malformed(offset_, "expression nests too deep");
      auto inner = ParseUnary();
      --depth_;
      if (!inner.ok() || !neg) return inner;
      auto e = Make(Expr::Type::kNeg);
      e->a = std::move(*inner);
      return e;
    }
    auto e = ParsePrimary();
    if (!e.ok()) return e;
    auto p = ParsePostfix(std::move(*e));
    if (!p.ok()) return p;
    return ParseFilters(std::move(*p));
  }

  // Arguments up to `close`. `kwnames` (null: no keyword arguments allowed) gets each
  // argument's keyword, "" for positional ones, which must come first.
  absl::Status ParseArgs(std::string_view close, std::vector<std::unique_ptr<Expr>>* args,
                         std::vector<std::string>* kwnames = nullptr) {
    while (!PeekOp(close)) {
      std::string keyword;
      if (Peek().kind == Token::Kind::kName && tok_ + 1 < tokens_->size() &&
          (*tokens_)[tok_ + 1].kind == Token::Kind::kOp && (*tokens_)[tok_ + 1].text == "=") {
        if (kwnames == nullptr) return Malformed(offset_, "a keyword argument here");
        keyword = Next().text;
        ++tok_;  // '='
      } else if (kwnames != nullptr && !kwnames->empty() && !kwnames->back().empty()) {
        return Malformed(offset_, "a positional argument after a keyword argument");
      }
      if (kwnames != nullptr) kwnames->push_back(keyword);
      auto a = ParseExpr();
      if (!a.ok()) return a.status();
      args->push_back(std::move(*a));
      if (!Accept(",")) break;
    }
    return Expect(close);
  }

  ExprOr ParsePostfix(std::unique_ptr<Expr> e) {
    while (true) {
      if (Accept(".")) {
        if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected an attribute");
        auto a = Make(Expr::Type::kAttr, Next().text);
        a->a = std::move(e);
        e = std::move(a);
      } else if (Accept("[")) {
        std::unique_ptr<Expr> parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (!PeekOp(":") && !PeekOp("]")) {
            auto x = ParseExpr();
            if (!x.ok()) return x;
            parts[n] = std::move(*x);
          }
          if (Accept(":")) {
            slice = true;
            if (++n > 2) return Malformed(offset_, "bad slice");
            continue;
          }
          break;
        }
        if (absl::Status s = Expect("]"); !s.ok()) return s;
        auto x = Make(slice ? Expr::Type::kSlice : Expr::Type::kIndex);
        if (!slice && parts[0] == nullptr) return Malformed(offset_, "empty index");
        x->a = std::move(e);
        x->b = std::move(parts[0]);
        x->c = std::move(parts[1]);
        x->d = std::move(parts[2]);
        e = std::move(x);
      } else if (Accept("(")) {
        if (e->type != Expr::Type::kName && e->type != Expr::Type::kAttr) {
          return Malformed(offset_, "only names and methods can be called");
        }
        auto call = Make(Expr::Type::kCall, e->name);
        if (e->type == Expr::Type::kAttr) call->a = std::move(e->a);
        if (absl::Status s = ParseArgs(")", &call->args, &call->kwnames); !s.ok()) return s;
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprOr ParseFilters(std::unique_ptr<Expr> e) {
    while (true) {
      if (Accept("|")) {
        if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected a filter name");
        auto f = Make(Expr::Type::kFilter, Next().text);
        f->a = std::move(e);
        if (Accept("(")) {
          if (absl::Status s = ParseArgs(")", &f->args, &f->kwnames); !s.ok()) return s;
        }
        e = std::move(f);
      } else if (PeekName("is")) {
        ++tok_;
        auto t = Make(Expr::Type::kTest);
        if (PeekName("not")) {
          ++tok_;
          t->negate = true;
        }
        if (Peek().kind != Token::Kind::kName) return Malformed(offset_, "expected a test name");
        t->name = Next().text;
        t->a = std::move(e);
        if (Accept("(")) {
          if (absl::Status s = ParseArgs(")", &t->args, &t->kwnames); !s.ok()) return s;
        } else if (Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt) {
          auto arg = ParsePrimary();  // `is divisibleby 3`, `is equalto 'x'`
          if (!arg.ok()) return arg;
          t->args.push_back(std::move(*arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprOr ParsePrimary() {
    const Token& t = Peek();
    switch (t.kind) {
      case Token::Kind::kString: {
        auto e = Make(Expr::Type::kLiteral);
        std::string s = Next().value.get<std::string>();
        while (Peek().kind == Token::Kind::kString) s += Next().value.get<std::string>();
        e->value = std::move(s);
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        auto e = Make(Expr::Type::kLiteral);
        e->value = Next().value;
        return e;
      }
      case Token::Kind::kName: {
        const std::string name = Next().text;
        auto e = Make(Expr::Type::kLiteral);
        if (name == "true" || name == "True") {
          e->value = true;
        } else if (name == "false" || name == "False") {
          e->value = false;
        } else if (name == "none" || name == "None") {
          e->value = nullptr;
        } else {
          e = Make(Expr::Type::kName, name);
        }
        return e;
      }
      case Token::Kind::kOp:
        break;
      case Token::Kind::kEnd:
        return Malformed(offset_, "unexpected end of tag");
    }
    if (++depth_ > kMaxDepth) return Malformed(offset_, "expression nests too deep");
    ExprOr out = Malformed(offset_, absl::StrCat("unexpected '", t.text, "'"));
    if (Accept("(")) {
      out = ParseExpr();
      if (out.ok() && PeekOp(",")) {
        return absl::UnimplementedError("chat template: tuples are not supported");
      }
      if (out.ok()) {
        if (absl::Status s = Expect(")"); !s.ok()) out = s;
      }
    } else if (Accept("[")) {
      auto e = Make(Expr::Type::kList);
      absl::Status s = ParseArgs("]", &e->args);
      out = s.ok() ? ExprOr(std::move(e)) : ExprOr(s);
    } else if (Accept("{")) {
      auto e = Make(Expr::Type::kDict);
      absl::Status s;
      while (s.ok() && !PeekOp("}")) {
        auto k = ParseExpr();
        if (!k.ok()) {
          s = k.status();
          break;
        }
        s = Expect(":");
        if (!s.ok()) break;
        auto v = ParseExpr();
        if (!v.ok()) {
          s = v.status();
          break;
        }
        e->args.push_back(std::move(*k));
        e->args.push_back(std::move(*v));
        if (!Accept(",")) break;
      }
      if (s.ok()) s = Expect("}");
      out = s.ok() ? ExprOr(std::move(e)) : ExprOr(s);
    }
    --depth_;
    return out;
  }

  static constexpr int kMaxDepth = 200;
  std::vector<Chunk> chunks_;
  size_t chunk_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t tok_ = 0;
  size_t offset_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Node>> ParseTemplateSource(std::string_view source) {
  std::vector<Chunk> chunks;
  if (absl::Status s = Lex(source, &chunks); !s.ok()) return s;
  Parser parser(std::move(chunks));
  return parser.ParseTemplate();
}

}  // namespace jinja
}  // namespace lazyrag
