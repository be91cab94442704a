// A small subset of Jinja2, enough to render the chat templates that GGUF files carry in
// `tokenizer.chat_template`, the way Hugging Face transformers renders them
// (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True).
//
// Supported: text; {{ expr }}; {% if %}/{% elif %}/{% else %}/{% endif %};
// {% for x in expr [if cond] %} (also `for k, v in ...`) with {% else %} and `loop.index`,
// `index0`, `revindex`, `revindex0`, `first`, `last`, `length`; {% set name = expr %} (scoped to
// the enclosing loop body, as in Jinja) and `namespace(k=v, ...)` with {% set ns.k = expr %}
// (seen outside the loop); comments; whitespace control `{%-`, `-%}`, `{{-`, `-}}`,
// `{#-`, `-#}` and `+` to opt out of lstrip_blocks. Expressions: string, integer, float, boolean
// and none literals, lists, dicts; names; `a.b`, `a[b]`, slices `a[i:j:k]`; `+ - * / // %`, `~`;
// comparisons, `in`, `not in`, `and`, `or`, `not`; `x if c else y`; tests `is [not] defined`,
// `undefined`, `none`, `string`, `number`, `integer`, `mapping`, `sequence`, `iterable`,
// `boolean`, `true`, `false`, `odd`, `even`; filters `trim`, `length`/`count`, `upper`, `lower`,
// `string`, `first`, `last`, `default`/`d`, `join`, `tojson`; string methods `strip`, `lstrip`,
// `rstrip`, `upper`, `lower`, `startswith`, `endswith`, `split`; dict methods `get`, `items`,
// `keys`, `values`; globals `raise_exception(message)`, `range(n)` and `namespace`. Keyword
// arguments only for namespace(). String methods and `trim` strip ASCII white space as Python
// does (\x1c-\x1f included) but keep non-ASCII white space.
//
// Errors: Parse gives UNIMPLEMENTED for syntax outside the subset (macro, call, block set, ...)
// and INVALID_ARGUMENT for malformed templates; Render gives UNIMPLEMENTED for an unsupported
// filter, test, method or function reached at run time, FAILED_PRECONDITION for
// raise_exception (its message included), INVALID_ARGUMENT for type errors and undefined
// attribute access. Rendering is bounded: RESOURCE_EXHAUSTED past kMaxOutputBytes or
// kMaxLoopIterations. Never throws.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/json.h"

namespace lazyrag {

namespace jinja {
struct Node;
}  // namespace jinja

class JinjaTemplate {
 public:
  static constexpr size_t kMaxOutputBytes = size_t(1) << 20;
  static constexpr int64_t kMaxLoopIterations = 100000;

  static absl::StatusOr<std::unique_ptr<JinjaTemplate>> Parse(std::string_view source);
  ~JinjaTemplate();

  // Renders with `context` (a JSON object: its members are the template's variables, e.g.
  // messages, add_generation_prompt, bos_token, eos_token). Thread-safe (const).
  absl::StatusOr<std::string> Render(const Json& context) const;

 private:
  JinjaTemplate();
  std::unique_ptr<jinja::Node> root_;
};

}  // namespace lazyrag
