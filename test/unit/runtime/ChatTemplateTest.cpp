//===- ChatTemplateTest.cpp - hflow::data::ChatTemplate -------------------===//
//
// Hand-written cases for the chat-template renderer. The expected strings of
// kRenderCases are what @huggingface/jinja 0.5.x renders for the same template
// and variables (the reference ChatTemplate matches byte for byte); the
// corpus check against whole Hugging Face templates is
// test/integration/Inputs/chat_template_oracle.mjs.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/ChatTemplate.h"

#include <gtest/gtest.h>

#include <ctime>
#include <string>
#include <thread>
#include <vector>

using hflow::data::ChatTemplate;
using hflow::data::ChatTemplateError;
using json = nlohmann::ordered_json;

namespace {

struct RenderCase {
  const char *name;
  const char *source;
  const char *vars; // JSON object
  const char *expected;
};

// clang-format off
const RenderCase kRenderCases[] = {
  // Text, preprocessing and whitespace control.
  {"text", R"~(hello
)~", R"~({})~", R"~(hello)~"},
  {"only_one_trailing_newline_dropped", R"~(a

)~", R"~({})~", R"~(a
)~"},
  {"dash_strips_both_sides", R"~(a  {{- "b" -}}  c)~", R"~({})~", R"~(abc)~"},
  {"lstrip_trim_blocks", R"~(  {% if true %}
x
  {% endif %}
y)~", R"~({})~", R"~(x
y)~"},
  {"expression_keeps_newline", R"~({{ 'a' }}
b)~", R"~({})~", R"~(a
b)~"},
  {"comments", R"~(a {# c #} b|a {#- c -#} b)~", R"~({})~", R"~(a  b|ab)~"},
  {"generation_tags_dropped", R"~({% generation %}x{% endgeneration %}y)~", R"~({})~", R"~(xy)~"},
  // Literals and how values render.
  {"numbers", R"~({{ 1 + 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1.5 * 2 }})~", R"~({})~",
   R"~(3 3.5 2.0 3 -1 1024 1.0 0.30000000000000004 3.0)~"},
  {"concat", R"~({{ "a" ~ 1 ~ true }} {{ "a" + 1.0 }} {{ "x" + [1, "b"] }})~", R"~({})~", R"~(a1true a1 x1,b)~"},
  {"render_values", R"~([{{ none }}][{{ true }}][{{ [1, "a", none, 2.0] }}][{{ {"a": 1, "b": [true]} }}])~", R"~({})~",
   R"~([][true][[1, "a", null, 2]][{"a": 1, "b": [true]}])~"},
  {"string_escapes", R"~({{ 'it\'s\t"q"\n' ~ "\u00e9\x41" }})~", R"~({})~", "it's\t\"q\"\n\xc3\xa9" "A"},
  {"adjacent_strings", R"~({{ "a" 'b' }})~", R"~({})~", R"~(ab)~"},
  {"int_float_vars", R"~({{ i }} {{ f }} {{ g }} {{ i + f }})~", R"~({"i": 3, "f": 2.0, "g": 2.5})~", R"~(3 2 2.5 5)~"},
  // Statements.
  {"if_elif_else", R"~({% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %})~", R"~({})~",
   R"~(one,two,many,)~"},
  {"loop_variables", R"~({% for x in "abc".split("b") + ["z"] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %})~", R"~({})~",
   R"~(1032truefalse3|2121falsefalse3|3210falsetrue3|)~"},
  {"loop_else", R"~({% for x in [] %}x{% else %}empty{% endfor %})~", R"~({})~", R"~(empty)~"},
  {"loop_filter", R"~({% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ x }}{{ loop.index }}{% endfor %})~", R"~({})~", R"~(2142)~"},
  {"loop_items_and_keys", R"~({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %})~", R"~({"d": {"b": 1, "a": 2}})~",
   R"~(b=1;a=2;ba)~"},
  {"break_continue", R"~({% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %})~", R"~({})~",
   R"~(13)~"},
  {"set_and_scope", R"~({% set y = 1 %}{% for x in [1] %}{% set y = 2 %}{{ y }}{% endfor %}{{ y }})~", R"~({})~", R"~(21)~"},
  {"namespace", R"~({% set ns = namespace(c=0, s='') %}{% for x in [1, 2] %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }})~", R"~({})~", R"~(3)~"},
  {"set_block", R"~({% set x %}a{{ 1 }}{% endset %}[{{ x }}])~", R"~({})~", R"~([a1])~"},
  {"set_tuple", R"~({% set a, b = [1, 2] %}{{ b }}{{ a }})~", R"~({})~", R"~(21)~"},
  {"macro", R"~({% macro m(a, b='d') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, b=2) }})~", R"~({})~", R"~(1-d|1-2)~"},
  {"filter_block", R"~({% filter upper %}abc{% endfilter %})~", R"~({})~", R"~(ABC)~"},
  {"ternary", R"~({{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }})~", R"~({"x": 0})~", R"~(ny)~"},
  // Operators.
  {"in_not_in", R"~({{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'cat' }}{{ x in y }})~", R"~({})~",
   R"~(truetruetruetruefalse)~"},
  {"and_or_values", R"~({{ 0 or 'b' }}{{ 'a' and 'b' }}{{ [] or 'e' }})~", R"~({})~", R"~(bbe)~"},
  {"loose_equality_and_identity", R"~({% set a = {"x": 1} %}{% set b = {"x": 1} %}{{ a == b }}{{ a == a }}{{ 1 == 1.0 }}{{ missing == none }}{{ '1' == 1 }})~", R"~({})~",
   R"~(falsetruetruetruetrue)~"},
  // Member access and slices.
  {"member_access", R"~({{ m.role }}{{ m['content'] }}{{ l[0] }}{{ l[-1] }}{{ l.length }}{{ "héllo".length }})~",
   R"~({"m": {"role": "user", "content": "hi"}, "l": [5, 6, 7]})~", R"~(userhi5735)~"},
  {"slices", R"~({{ l[1:] }}{{ l[-2:] }}{{ l[::-1] }}{{ l[:-1] }}{{ l[::2] }}{{ "abc😀"[::-1] }}{{ "abcdef"[1:3] }})~", R"~({"l": [1, 2, 3, 4]})~",
   R"~([2, 3, 4][3, 4][4, 3, 2, 1][1, 2, 3][1, 3]😀cbabc)~"},
  // String methods (JavaScript semantics: strip ignores its argument).
  {"string_methods", R"~([{{ "  a b  ".strip() }}][{{ "\n\n x\n".lstrip("\n") }}][{{ " x \n".rstrip() }}][{{ "hello wörld_x".title() }}][{{ "hELLO".capitalize() }}][{{ "abc".upper() }}{{ "ÀBC".lower() }}])~", R"~({})~",
   R"~([a b][x
][ x][Hello WöRld_x][HELLO][ABCàbc])~"},
  {"split", R"~({{ "a,b,,c".split(",") }}{{ " a b  c ".split() }}{{ "a,b,c".split(",", 1) }})~", R"~({})~",
   R"~(["a", "b", "", "c"]["a", "b", "c"]["a", "b,c"])~"},
  {"startswith_replace", R"~({{ "abc".startswith("ab") }}{{ "abc".endswith(("x", "bc")) }}{{ "aXbXc".replace("X", "-") }}{{ "aaa".replace("a", "b", 2) }})~", R"~({})~",
   R"~(truetruea-b-cbba)~"},
  {"dict_methods", R"~({{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') }}{{ d.keys() }}{{ d.values() }})~", R"~({"d": {"a": 1, "b": "x"}})~",
   R"~(1dflt["a", "b"][1, "x"])~"},
  // Filters.
  {"filters_strings", R"~([{{ "  x  " | trim }}][{{ "ab" | upper }}][{{ "AB" | lower }}][{{ "a b" | title }}][{{ "ab" | capitalize }}][{{ "😀ab" | length }}][{{ "a\nb\n\nc" | indent(2) }}][{{ "a\nb" | indent(first=true) }}][{{ "x-y" | replace("-", "+") }}])~", R"~({})~",
   R"~([x][AB][ab][A B][Ab][4][a
  b

  c][    a
    b][x+y])~"},
  {"filters_lists", R"~({{ l | length }}{{ l | first }}{{ l | last }}{{ l | join(", ") }}{{ l | reverse | list }}{{ l | sort }}{{ l | unique }}{{ l | join }})~", R"~({"l": [3, 1, 3]})~",
   R"~(3333, 1, 3[3, 1, 3][1, 3, 3][3, 1]313)~"},
  {"filters_numbers", R"~({{ -3 | abs }}{{ "42" | int }}{{ "x" | int }}{{ "2.5" | float }}{{ 3 | string }}{{ 2.7 | int }}{{ "x" | int(7) }})~", R"~({})~",
   R"~(34202.5327)~"},
  {"default_filter", R"~({{ missing | default("d") }}{{ "" | default("e") }}{{ "" | default("f", true) }}{{ none | default("g") }})~", R"~({})~",
   R"~(df)~"},
  {"selectattr_map", R"~({{ ms | selectattr("role", "equalto", "user") | map(attribute="content") | join("+") }}|{{ ms | rejectattr("role", "equalto", "user") | length }}|{{ ms | selectattr("tool_calls", "undefined") | length }}|{{ ms | selectattr("x") | length }})~",
   R"~({"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "x": 1}, {"role": "user", "content": "c"}]})~",
   R"~(a+c|1|0|1)~"},
  {"items_filter_dictsort", R"~({{ d | items }}{{ d | dictsort }}{{ d | length }})~", R"~({"d": {"b": 2, "a": 1}})~",
   R"~([["b", 2], ["a", 1]][["a", 1], ["b", 2]]2)~"},
  {"tojson", R"~({{ v | tojson }}
{{ v | tojson(indent=2) }}
{{ "é\n\"" | tojson }}{{ "é😀" | tojson(ensure_ascii=true) }}{{ missing | tojson }}{{ 2.0 | tojson }})~",
   R"~({"v": {"a": [1, {"b": null}], "c": {}, "d": [], "e": "x"}})~",
   R"~({"a": [1, {"b": null}], "c": {}, "d": [], "e": "x"}
{
  "a": [
    1,
    {
      "b": null
    }
  ],
  "c": {},
  "d": [],
  "e": "x"
}
"é\n\"""\u00e9\ud83d\ude00"null2)~"},
  {"js_key_order", R"~({{ d | tojson }})~", R"~({"d": {"b": 1, "2": 2, "1": 3}})~", R"~({"1": 3, "2": 2, "b": 1})~"},
  {"array_string_filter", R"~({{ [1, "a", missing] | string }})~", R"~({})~", R"~([1, "a", undefined])~"},
  // Tests.
  {"tests", R"~({{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ x is number }}{{ d is mapping }}{{ s is iterable }}{{ d is sequence }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ x is odd }}{{ x is even }}{{ n is not none }}{{ s is lower }}{{ s is upper }})~",
   R"~({"x": 3, "n": null, "s": "ab", "d": {}, "t": true})~",
   R"~(truetruetruetruetruetruetruetruetruetruefalsetruefalsefalsetruefalse)~"},
  // Undefined values: render as nothing, attributes of them are undefined,
  // but arithmetic on them fails (see the error tests).
  {"undefined_behaviour", R"~([{{ missing }}][{{ missing.attr.deeper }}][{% if missing %}t{% else %}f{% endif %}][{{ missing is defined }}][{{ m.nope }}])~", R"~({"m": {}})~",
   R"~([][][f][false][])~"},
  {"range", R"~({{ range(3) }}{{ range(1, 7, 2) | join(",") }})~", R"~({})~", R"~([0, 1, 2]1,3,5)~"},
  {"bos_and_messages", R"~({{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %})~",
   R"~({"bos_token": "<s>", "messages": [{"role": "user", "content": " hi 😀 "}], "add_generation_prompt": true})~",
   R"~(<s><user>hi 😀<assistant>)~"},
};
// clang-format on

std::string renderCase(const RenderCase &c) {
  return ChatTemplate::parse(c.source, c.name).render(json::parse(c.vars));
}

// "origin:LINE:COL: ..." -> the message of the thrown error.
std::string parseError(const std::string &source) {
  try {
    ChatTemplate::parse(source, "t");
  } catch (const ChatTemplateError &e) {
    return e.what();
  }
  return "(no error)";
}

std::string renderError(const std::string &source, const std::string &vars = "{}") {
  ChatTemplate t = ChatTemplate::parse(source, "t");
  try {
    t.render(json::parse(vars));
  } catch (const ChatTemplateError &e) {
    return e.what();
  }
  return "(no error)";
}

bool startsWith(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

} // namespace

TEST(ChatTemplate, RenderCasesMatchTheReference) {
  for (const RenderCase &c : kRenderCases) {
    std::string got;
    try {
      got = renderCase(c);
    } catch (const std::exception &e) {
      ADD_FAILURE() << c.name << ": threw " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected) << c.name;
  }
}

TEST(ChatTemplate, SyntaxErrorsAreLocated) {
  EXPECT_EQ(parseError("ab\n{% if x %}\ny"), "t:2:1: unclosed 'if' block (reached the end of the template)");
  EXPECT_EQ(parseError("{{ x + }}"), "t:1:8: unexpected '}}' in an expression");
  EXPECT_EQ(parseError("x\n  {{ 'abc }}"), "t:2:6: unterminated string literal");
  EXPECT_EQ(parseError("{% for x in y %}{% endif %}"), "t:1:17: unexpected '{% endif %}' (no open block it belongs to)");
  EXPECT_TRUE(startsWith(parseError("{{ a ! b }}"), "t:1:6: unexpected character '!'")) << parseError("{{ a ! b }}");
  EXPECT_EQ(parseError("{% if x %}\n{%- endfor %}"), "t:2:1: unexpected '{% endfor %}' (no open block it belongs to)");
  EXPECT_EQ(parseError("{# never closed"), "t:1:1: missing end of comment tag '#}'");
}

TEST(ChatTemplate, UnsupportedConstructsAreRefused) {
  EXPECT_EQ(parseError("a\n {{ x | wordcount }}"), "t:2:9: unsupported filter 'wordcount'");
  EXPECT_EQ(parseError("{{ x | round }}"), "t:1:8: unsupported filter 'round'");
  EXPECT_EQ(parseError("{{ x | default }}"), "t:1:8: unsupported: filter 'default' without an argument list");
  EXPECT_EQ(parseError("{{ x | trim() }}"), "t:1:8: unsupported: filter 'trim' with arguments");
  EXPECT_EQ(parseError("{{ x | tojson(sort_keys=true) }}"), "t:1:8: unsupported: tojson(sort_keys=...)");
  EXPECT_EQ(parseError("{% include 'x' %}"), "t:1:4: unsupported statement 'include'");
  EXPECT_EQ(parseError("{% call m() %}{% endcall %}"), "t:1:4: unsupported statement '{% call %}'");
  EXPECT_EQ(parseError("{{ x is divisibleby }}"), "t:1:9: unsupported test 'divisibleby'");
  EXPECT_EQ(parseError("{{ '{}'.format(1) }}"), "t:1:9: unsupported method 'format'");
  EXPECT_EQ(parseError("{{ x.rsplit(',') }}"), "t:1:6: unsupported method 'rsplit'");
  EXPECT_EQ(parseError("{{ cycler(1) }}"), "t:1:4: unsupported function 'cycler'");
  EXPECT_EQ(parseError("{% break %}"), "t:1:4: 'break' outside a for loop");
  EXPECT_EQ(parseError("{{ f(*xs) }}"), "t:1:6: unsupported: argument unpacking");
  EXPECT_EQ(parseError("{{ xs | map('upper') }}"), "t:1:9: unsupported: 'map' without attribute=");
  EXPECT_EQ(parseError("{{ xs | selectattr('a', 'sameas') }}"), "t:1:25: unsupported test 'sameas'");
  EXPECT_EQ(parseError("{% macro m() %}{{ varargs }}{% endmacro %}"),
            "t:1:1: unsupported in macros: varargs, kwargs and caller");
}

TEST(ChatTemplate, RaiseExceptionIsLocated) {
  const char *src = "{% if messages[0].role != 'user' %}\n"
                    "  {{- raise_exception('Conversation must start with a user message') }}\n"
                    "{% endif %}ok";
  EXPECT_EQ(renderError(src, R"({"messages": [{"role": "assistant"}]})"),
            "t:2:7: template raised: Conversation must start with a user message");
  EXPECT_EQ(ChatTemplate::parse(src, "t").render(json::parse(R"({"messages": [{"role": "user"}]})")), "ok");
}

TEST(ChatTemplate, RuntimeErrorsAreLocated) {
  // Undefined values fail in arithmetic and in most filters, as in the reference.
  EXPECT_EQ(renderError("{{ missing + 'x' }}"), "t:1:12: Cannot perform operation + on undefined values");
  EXPECT_EQ(renderError("\n{{ missing | length }}"), "t:2:14: Cannot apply filter \"length\" to type: UndefinedValue");
  EXPECT_EQ(renderError("{{ none ~ 'x' }}"), "t:1:9: Cannot perform operation on null values");
  EXPECT_EQ(renderError("{{ 'a' in none }}"), "t:1:8: Cannot perform operation on null values");
  EXPECT_EQ(renderError("{{ 'a' < 'b' }}"), "t:1:8: Unknown operator \"<\" between StringValue and StringValue");
  EXPECT_EQ(renderError("{% for c in 'abc' %}{% endfor %}"),
            "t:1:13: Expected iterable or object type in for loop: got StringValue");
  EXPECT_EQ(renderError("{{ x['upper']() }}", R"({"x": 1})"), "t:1:5: Cannot call something that is not a function: got UndefinedValue");
  EXPECT_EQ(renderError("{% set x.y = 1 %}", R"({"x": {}})"), "t:1:8: cannot assign attribute on non-namespace object");
  EXPECT_EQ(renderError("{{ l[0] }}"), "t:1:5: Cannot access property with non-string: got IntegerValue");
  EXPECT_EQ(renderError("{{ x }}", R"({"true": 1})"), "t: render variable 'true' is already declared (a built-in name)");
}

TEST(ChatTemplate, StrftimeNowUsesTheGivenTime) {
  ChatTemplate t = ChatTemplate::parse("{{ strftime_now('%d %b %Y|%B|%m %H:%M %%') }}", "t");
  hflow::data::ChatTemplateRenderOptions opt;
  opt.now = 1721980800; // 2024-07-26 08:00 UTC
  std::tm tm{};
  localtime_r(&opt.now, &tm);
  char want[128];
  std::strftime(want, sizeof want, "%d %b %Y|%B|%m %H:%M %%", &tm);
  EXPECT_EQ(t.render(json::object(), opt), want);
}

TEST(ChatTemplate, CopiesShareAndRenderConcurrently) {
  ChatTemplate t = ChatTemplate::parse(
      "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ n }}", "t");
  ChatTemplate copy = t;
  ChatTemplate moved = std::move(copy);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      json vars = {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"n", i}};
      std::string want = "user:x;" + std::to_string(i);
      bool all = true;
      for (int k = 0; k < 200; ++k)
        all = all && (i % 2 ? moved : t).render(vars) == want;
      ok[i] = all;
    });
  for (auto &th : threads)
    th.join();
  for (int i = 0; i < 8; ++i)
    EXPECT_TRUE(ok[i]) << i;
  EXPECT_EQ(moved.origin(), "t");
}

TEST(ChatTemplate, ConfigHelpers) {
  json plain = json::parse(R"({"chat_template": "{{ x }}", "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})");
  EXPECT_EQ(hflow::data::chatTemplateFromConfig(plain), "{{ x }}");
  EXPECT_EQ(hflow::data::specialTokenFromConfig(plain, "bos_token"), "<s>");
  EXPECT_EQ(hflow::data::specialTokenFromConfig(plain, "eos_token"), "</s>");
  EXPECT_TRUE(hflow::data::specialTokenFromConfig(plain, "pad_token").is_null());
  json list = json::parse(R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(hflow::data::chatTemplateFromConfig(list), "D");
  EXPECT_THROW(hflow::data::chatTemplateFromConfig(json::object()), ChatTemplateError);
}
