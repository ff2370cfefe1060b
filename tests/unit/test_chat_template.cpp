// Chat templates: real templates (tests/data/chat_templates, from the trl
// package's copies of what model repositories ship, and its training
// versions with {% generation %} blocks) rendered by ztrain's engine must
// give transformers' apply_chat_template text byte for byte, and the
// training versions its assistant spans (golden.json,
// tools/make_chat_template_golden.py); without the blocks, the answers
// are what each assistant turn adds to its prompt; a model directory's
// template is found where transformers looks; broken templates are
// ConfigErrors naming the file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support.h"
#include "text/chat_template.h"
#include "ztrain/error.h"

namespace {

using namespace ztrain;
using text::ChatMessage;
using text::ChatTemplate;
using text::ChatTemplateSource;

const std::filesystem::path kDir =
    std::filesystem::path(ZTRAIN_TEST_SOURCE_DIR) / "tests/data/chat_templates";

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list)
    out.push_back({m.at("role"), m.at("content"),
                   m.contains("tool_calls") ? m.at("tool_calls").dump() : std::string()});
  return out;
}

ChatTemplate template_of(const nlohmann::ordered_json& c) {
  ChatTemplateSource source{
      read(kDir / c.at("template").get<std::string>()), c.at("template"), {}, {}};
  for (const auto& [k, v] : c.at("special_tokens").items()) source.special_tokens[k] = v;
  for (const auto& [k, v] : c.at("variables").items()) source.variables[k] = v;
  return ChatTemplate(std::move(source));
}

// A case's tools as apply_chat_template was given them (empty: none).
std::string tools_of(const nlohmann::ordered_json& c) {
  return c.contains("tools") ? c.at("tools").dump() : std::string();
}

const nlohmann::ordered_json& golden() {
  static const nlohmann::ordered_json g = nlohmann::ordered_json::parse(read(kDir / "golden.json"));
  return g;
}

}  // namespace

TEST_CASE("fourteen real chat templates render transformers' text byte for byte") {
  const auto& cases = golden().at("cases");
  REQUIRE(cases.size() == 96);
  std::size_t templates = 0;
  std::string last;
  for (const auto& c : cases) {
    CAPTURE(c.at("template").get<std::string>());
    CAPTURE(c.at("add_generation_prompt").get<bool>());
    const ChatTemplate t = template_of(c);
    CHECK(t.render(messages_of(c.at("messages")), c.at("add_generation_prompt"), tools_of(c)) ==
          c.at("text").get<std::string>());
    if (c.at("template") != last) ++templates, last = c.at("template");
  }
  CHECK(templates == 14);
}

// trl's training templates mark the answers with {% generation %}: the
// spans are transformers' return_assistant_tokens_mask's, byte for byte
// (whatever each template puts in them: Qwen2.5's leading newline,
// DeepSeek's <｜Assistant｜>, Phi-3's closing end-of-text as a span of its
// own).
TEST_CASE("{% generation %} blocks give transformers' assistant spans") {
  std::size_t checked = 0;
  for (const auto& c : golden().at("cases")) {
    if (!c.contains("answers") || c.at("add_generation_prompt").get<bool>()) continue;
    CAPTURE(c.at("template").get<std::string>());
    const text::RenderedChat r =
        template_of(c).render_with_answers(messages_of(c.at("messages")), tools_of(c));
    CHECK(r.text == c.at("text").get<std::string>());
    std::vector<std::string> answers;
    for (const auto& [begin, end] : r.answers) answers.push_back(r.text.substr(begin, end - begin));
    CHECK(answers == c.at("answers").get<std::vector<std::string>>());
    ++checked;
  }
  CHECK(checked == 6 * 3 + 2);  // Qwen's two take tools
}

// Each answer is the assistant turn's content and what the template closes
// it with, and nothing of the prompt: the text before it is the golden
// prompt render (with the generation prompt), the text through it the
// golden render of the conversation so far.
TEST_CASE("the answers are what each assistant turn adds to the prompt before it") {
  const auto& cases = golden().at("cases");
  std::size_t checked = 0;
  for (std::size_t i = 0; i + 1 < cases.size(); i += 2) {
    const auto& whole = cases[i];
    const auto& prompt = cases[i + 1];
    REQUIRE_FALSE(whole.at("add_generation_prompt").get<bool>());
    REQUIRE(prompt.at("add_generation_prompt").get<bool>());
    CAPTURE(whole.at("template").get<std::string>());
    // Templates with {% generation %} say where their answers are (above);
    // DeepSeek-R1's generation prompt opens a <think> block its rendered
    // conversations never hold, so its prompt does not begin them: refused
    // (its training template marks the answers instead).
    if (whole.contains("answers")) continue;
    if (whole.at("template") == "deepseek_r1_distill.jinja") {
      CHECK(test::message_of<ConfigError>([&] {
              template_of(whole).render_with_answers(messages_of(whole.at("messages")));
            }).find("is not where the template renders the conversation before it") !=
            std::string::npos);
      continue;
    }
    ++checked;
    const auto messages = messages_of(whole.at("messages"));
    const text::RenderedChat r = template_of(whole).render_with_answers(messages, tools_of(whole));
    CHECK(r.text == whole.at("text").get<std::string>());
    std::size_t assistants = 0;
    for (const auto& m : messages) assistants += m.role == "assistant";
    REQUIRE(r.answers.size() == assistants);
    // The last answer: after the golden prompt, to the end of the text;
    // it holds the turn's content (trimmed: Llama 3's templates trim it)
    // and nothing of the user's turn before it.
    const std::string p = prompt.at("text");
    CHECK(r.answers.back().first == p.size());
    CHECK(r.answers.back().second == r.text.size());
    const std::string answer = r.text.substr(r.answers.back().first);
    const std::string content = messages.back().content;
    CHECK(answer.find(content.substr(2, content.size() - 4)) != std::string::npos);
    CHECK(answer.find(messages[messages.size() - 2].content) == std::string::npos);
    for (std::size_t a = 1; a < r.answers.size(); ++a)
      CHECK(r.answers[a - 1].second < r.answers[a].first);
    // A turn that only calls a tool: its answer is the rendered call,
    // nothing of the question before it or the result after it.
    for (std::size_t m = 0, a = 0; m < messages.size(); ++m) {
      if (messages[m].role != "assistant") continue;
      const auto [begin, end] = r.answers[a++];
      if (messages[m].tool_calls.empty()) continue;
      const std::string call = r.text.substr(begin, end - begin);
      CHECK(call.find("\"get_weather\"") != std::string::npos);
      CHECK(call.find("Weather in Paris?") == std::string::npos);
      CHECK(call.find("21}") == std::string::npos);
    }
  }
  CHECK(checked == 7 * 3 + 4);  // Llama 3.1, 3.2, Qwen2.5 and Qwen3 take tools
}

// A template that does not render tools (Llama 3.0's, Phi-3's) must not
// train a conversation without them: refused, naming the function.
TEST_CASE("tools a template renders nowhere are refused, not dropped") {
  for (const auto& c : golden().at("cases")) {
    if (!c.contains("tools") || c.at("add_generation_prompt").get<bool>()) continue;
    for (const std::string name : {"llama3.jinja", "phi3.jinja"}) {
      nlohmann::ordered_json other = c;
      other["template"] = name;
      CAPTURE(name);
      const std::string why = test::message_of<ConfigError>([&] {
        template_of(other).render_with_answers(messages_of(c.at("messages")), tools_of(c));
      });
      CAPTURE(why);
      CHECK(why.find("does not render the conversation's tools or tool calls ('get_") !=
            std::string::npos);
    }
    return;
  }
  FAIL("no golden case has tools");
}

TEST_CASE("a model directory's template: chat_template.jinja, or tokenizer_config.json's") {
  test::TempDir dir;
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",)"
      << R"( "chat_template": [{"name": "tool_use", "template": "tools"},)"
      << R"( {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}]})";
  const std::vector<ChatMessage> chat{{"user", "hi"}, {"assistant", "yo"}};
  CHECK(ChatTemplate::from_model_dir(dir.path()).render(chat, false) ==
        "<s>[user]hi</s>[assistant]yo</s>");
  std::ofstream(dir / "chat_template.jinja")
      << "{% for m in messages %}{{ m.content }}|{% endfor %}";
  const ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  CHECK(t.render(chat, false) == "hi|yo|");
  CHECK(t.where() == (dir / "chat_template.jinja").string());
}

TEST_CASE("broken templates and answers a template does not delimit are ConfigErrors") {
  const auto make = [](const std::string& text) { return ChatTemplate({text, "t.jinja", {}, {}}); };
  CHECK(test::message_of<ConfigError>([&] {
          make("{% for m in messages %}");
        }).find("t.jinja: the chat template cannot be parsed") != std::string::npos);
  const std::vector<ChatMessage> chat{{"user", "hi"}, {"assistant", "yo"}};
  CHECK(test::message_of<ConfigError>([&] {
          make("{{ raise_exception('only system turns') }}").render(chat, false);
        }).find("only system turns") != std::string::npos);
  // An earlier answer rewritten once later turns follow (its content
  // dropped, as templates drop old reasoning).
  const std::vector<ChatMessage> two{
      {"user", "a"}, {"assistant", "yo"}, {"user", "b"}, {"assistant", "ok"}};
  CHECK(test::message_of<ConfigError>([&] {
          make(
              "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[old]"
              "{% else %}{{ m.content }}{% endif %}|{% endfor %}")
              .render_with_answers(two);
        }).find("message 2 (an assistant turn)") != std::string::npos);
  // Phi-3's end-of-text after the last turn only stays out of the first
  // answer.
  const text::RenderedChat phi = make(
                                     "{% for m in messages %}{{ m.content }}|{% endfor %}"
                                     "{% if not add_generation_prompt %}<eot>{% endif %}")
                                     .render_with_answers(two);
  CHECK(phi.text == "a|yo|b|ok|<eot>");
  REQUIRE(phi.answers.size() == 2);
  CHECK(phi.text.substr(phi.answers[0].first, phi.answers[0].second - phi.answers[0].first) ==
        "yo|");
  CHECK(phi.text.substr(phi.answers[1].first) == "ok|<eot>");
  CHECK(test::message_of<ConfigError>([&] {
          make("{% generation %}{% for m in messages %}{{ m.content }}{% endfor %}")
              .render_with_answers(chat);
        }).find("t.jinja: a {% generation %} block of the chat template is not closed") !=
        std::string::npos);
  CHECK(test::message_of<DataError>([&] {
          make(
              "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
              "{% endfor %}")
              .render({{"user",
                        "a\xEE\x80\x80"
                        "b"}},
                      false);
        }).find("message 1 holds U+E000 or U+E001") != std::string::npos);
  test::TempDir dir;
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  CHECK(test::message_of<ConfigError>([&] {
          ChatTemplate::from_model_dir(dir.path());
        }).find("has no chat_template") != std::string::npos);
}
