//===- hflow-tokenize: what the model will see, from the command line ------===//
//
//   hflow-tokenize TOKENIZER info
//   hflow-tokenize TOKENIZER encode [--bos] [--time]     < lines > lines
//   hflow-tokenize TOKENIZER decode [--keep-special] [--stream] < lines > lines
//   hflow-tokenize TOKENIZER render [--tokenize] [--keep-going] < lines > lines
//
// TOKENIZER is what hflow-run's --tokenizer takes: "byte", a tokenizer.json,
// a SentencePiece .model, or a Hugging Face model directory. JSON lines in,
// JSON lines out, one output line per input line. See docs/data.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/ChatTemplate.h"
#include "runtime/data/Conversation.h"
#include "runtime/data/Prompt.h"
#include "runtime/data/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

const char *kUsage =
    "usage: hflow-tokenize TOKENIZER COMMAND [options] < in.jsonl > out.jsonl\n"
    "\n"
    "TOKENIZER: \"byte\", a tokenizer.json, a SentencePiece .model file, or a\n"
    "Hugging Face model directory (its tokenizer.json, else tokenizer.model),\n"
    "as hflow-run --tokenizer takes it.\n"
    "\n"
    "Commands (JSON lines on standard input, one JSON line out per line in):\n"
    "  info      no input; one line: vocabulary size, BOS/EOS/PAD and stop ids,\n"
    "            whether there is a chat template\n"
    "  encode    in: a JSON string, or {\"text\": ...}; out: {\"ids\": [...]}\n"
    "              --bos   prepend BOS when the tokenizer adds one (what the\n"
    "                      runtime does with a plain-text prompt)\n"
    "              --time  print the bytes, seconds and MB/s spent in encoding\n"
    "                      (not in JSON) to standard error\n"
    "  decode    in: an array of ids, or {\"ids\": [...]}; out: {\"text\": ...}\n"
    "              --keep-special  render special tokens as their text\n"
    "              --stream        also {\"pieces\": [...]}: the text as a\n"
    "                              streaming decoder emits it, token by token\n"
    "  render    in: {\"messages\": [{\"role\": ..., \"content\": ...}, ...],\n"
    "            \"add_generation_prompt\": true, ...}: every key is a template\n"
    "            variable; bos_token and eos_token default to the tokenizer's.\n"
    "            out: {\"text\": ...} rendered with tokenizer_config.json's\n"
    "            chat_template\n"
    "              --tokenize    also {\"ids\": [...]} (encoded as the runtime\n"
    "                            encodes a chat prompt: no BOS is added, the\n"
    "                            template writes it)\n"
    "              --keep-going  a line the template fails on (its\n"
    "                            raise_exception, a bad message) gives\n"
    "                            {\"error\": ...} and the next lines are\n"
    "                            rendered; the exit status is still 1\n"
    "  episode   in: {\"messages\": [...the prompt's chat...], \"turns\": [\n"
    "            {\"assistant\": TEXT}, {\"assistant_chars\": TEXT} (encoded a\n"
    "            character at a time), {\"assistant_cut\": TEXT} (no stop\n"
    "            token) or {\"assistant_ids\": [...]}, {\"role\": \"tool\",\n"
    "            \"content\": TEXT} or {\"environment\": [messages]}, ...]}: a\n"
    "            multi-turn episode built\n"
    "            turn by turn as a rollout builds it (runtime/data/\n"
    "            Conversation.h): the model's turns appended as sampled (an\n"
    "            assistant TEXT is encoded, then \"stop\"'s ids or the first\n"
    "            stop id), the others as the template renders them.\n"
    "            out: {\"ids\": [...], \"trained\": [0|1, ...], \"generated\":\n"
    "            [[...], ...], \"messages\": [...], \"drifts\": N, \"text\": the\n"
    "            ids decoded with special tokens, \"states\": [{\"messages\",\n"
    "            \"text\", \"appended\" (the turn's text), \"drifts\"} at the\n"
    "            start and after each environment turn]}\n"
    "\n"
    "Exit status: 0 on success; 1 when the tokenizer cannot be loaded or an\n"
    "input line is bad (the error names its line; lines before it are\n"
    "written); 2 on bad arguments.\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename J = json> J parseLine(const std::string &line, size_t lineNo) {
  try {
    return J::parse(line);
  } catch (const json::exception &e) { // parse errors and number overflow (out_of_range)
    std::string m = e.what();
    auto p = m.find("] ");
    throw LineError("<stdin>:" + std::to_string(lineNo) + ": not valid JSON: " +
                    (p == std::string::npos ? m : m.substr(p + 2)));
  }
}

/// Calls fn(J, lineNo) for every non-blank line of standard input (J:
/// json, or ordered_json where the keys' order matters).
template <typename J = json, typename Fn> void forEachLine(Fn fn) {
  std::string line;
  size_t lineNo = 0;
  while (std::getline(std::cin, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos)
      continue;
    fn(parseLine<J>(line, lineNo), lineNo);
  }
}

std::string where(size_t lineNo) { return "<stdin>:" + std::to_string(lineNo) + ": "; }

std::vector<int64_t> idsOf(const json &j, size_t lineNo) {
  const json *a = &j;
  if (j.is_object()) {
    if (!j.contains("ids"))
      throw LineError(where(lineNo) + "no field 'ids'");
    a = &j["ids"];
  }
  if (!a->is_array())
    throw LineError(where(lineNo) + "expected an array of token ids or {\"ids\": [...]}");
  std::vector<int64_t> ids;
  for (const json &x : *a) {
    if (!x.is_number_integer())
      throw LineError(where(lineNo) + "token ids must be integers (got " + x.dump() + ")");
    ids.push_back(x.get<int64_t>());
  }
  return ids;
}

/// The flags of the commands (kUsage).
struct Flags {
  bool bos = false, time = false, keepSpecial = false, stream = false, tokenize = false,
       keepGoing = false;
};

/// info: the tokenizer's name, sizes, special ids, whether it has a template.
int runInfo(const hflow::data::Tokenizer &tokr) {
  const hflow::data::Tokenizer *tok = &tokr;
  ordered_json j;
  j["name"] = tok->name();
  j["vocab_size"] = tok->vocabSize();
  j["bos_id"] = tok->bosId();
  j["eos_id"] = tok->eosId();
  j["pad_id"] = tok->padId();
  j["stop_ids"] = tok->stopIds();
  j["chat_template"] = !tok->chatTemplate().empty();
  std::cout << j.dump() << "\n";
  return 0;
}

/// encode: each line's ids (--bos: BOS first; --time: the rate).
int runEncode(const hflow::data::Tokenizer &tokr, const Flags &f) {
  const hflow::data::Tokenizer *tok = &tokr;
  double secs = 0;
  size_t bytes = 0;
  forEachLine([&](const json &j, size_t lineNo) {
    std::string text;
    if (j.is_string())
      text = j.get<std::string>();
    else if (j.is_object() && j.contains("text") && j["text"].is_string())
      text = j["text"].get<std::string>();
    else
      throw LineError(where(lineNo) + "expected a JSON string or {\"text\": \"...\"}");
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> ids = tok->encode(text);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes += text.size();
    if (f.bos && tok->bosId() >= 0)
      ids.insert(ids.begin(), tok->bosId());
    std::cout << json{{"ids", ids}}.dump() << "\n";
  });
  if (f.time)
    std::fprintf(stderr, "hflow-tokenize: encoded %zu bytes in %.3f s: %.2f MB/s\n",
                 bytes, secs, secs > 0 ? bytes / secs / 1e6 : 0.0);
  return 0;
}

/// decode: each line's text (--keep-special; --stream: the pieces too).
int runDecode(const hflow::data::Tokenizer &tokr, const Flags &f) {
  const hflow::data::Tokenizer *tok = &tokr;
  forEachLine([&](const json &j, size_t lineNo) {
    std::vector<int64_t> ids = idsOf(j, lineNo);
    ordered_json out;
    out["text"] = f.keepSpecial ? tok->decodeKeepSpecial(ids) : tok->decode(ids);
    if (f.stream) {
      hflow::data::StreamDecoder sd(*tok);
      ordered_json pieces = ordered_json::array();
      for (int64_t id : ids)
        pieces.push_back(sd.push(id));
      pieces.push_back(sd.finish());
      out["pieces"] = pieces;
    }
    // The byte tokenizer may give invalid UTF-8: say so rather than crash.
    std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
  });
  return 0;
}

/// render: each line's chat through the tokenizer's template (--tokenize:
/// its ids too; --keep-going: a failing line reported, the rest rendered).
int runRender(const hflow::data::Tokenizer &tokr, const std::string &spec, const Flags &f) {
  const hflow::data::Tokenizer *tok = &tokr;
  std::string source = tok->chatTemplate();
  if (source.empty())
    throw std::runtime_error("tokenizer '" + spec +
                             "' has no chat template (tokenizer_config.json's "
                             "chat_template)");
  hflow::data::ChatTemplate tmpl = hflow::data::ChatTemplate::parse(
      source, hflow::data::PromptEncoder::templateOrigin(*tok));
  size_t failed = 0;
  // The variables keep the line's key order: a template's tojson writes
  // dicts in it, as Python and JavaScript do.
  forEachLine<ordered_json>([&](const ordered_json &j, size_t lineNo) {
    if (!j.is_object())
      throw LineError(where(lineNo) + "expected an object with 'messages'");
    ordered_json vars = j;
    for (const char *k : {"bos_token", "eos_token", "pad_token", "unk_token"})
      if (!vars.contains(k) && !tok->specialTokenText(k).empty())
        vars[k] = tok->specialTokenText(k);
    std::string text;
    try {
      text = tmpl.render(vars);
    } catch (const hflow::data::ChatTemplateError &e) {
      if (!f.keepGoing)
        throw LineError(where(lineNo) + e.what());
      ++failed;
      std::cerr << "hflow-tokenize: error: " << where(lineNo) << e.what() << "\n";
      std::cout << ordered_json{{"error", e.what()}}.dump() << "\n";
      return;
    }
    ordered_json out;
    out["text"] = text;
    if (f.tokenize)
      out["ids"] = tok->encode(text);
    std::cout << out.dump() << "\n";
  });
  return failed ? 1 : 0;
}

/// episode: each line's scripted episode through a Conversation.
int runEpisode(const hflow::data::Tokenizer &tok, const std::string &spec) {
  const std::string source = tok.chatTemplate();
  if (source.empty())
    throw std::runtime_error("tokenizer '" + spec +
                             "' has no chat template (tokenizer_config.json's "
                             "chat_template)");
  auto tmpl = std::make_shared<const hflow::data::ChatTemplate>(hflow::data::ChatTemplate::parse(
      source, hflow::data::PromptEncoder::templateOrigin(tok)));
  const std::vector<int64_t> stops = tok.stopIds();
  forEachLine<ordered_json>([&](const ordered_json &j, size_t lineNo) {
    if (!j.is_object() || !j.contains("messages") || !j.contains("turns") ||
        !j["turns"].is_array())
      throw LineError(where(lineNo) + "expected an object with 'messages' and 'turns'");
    try {
      hflow::data::Conversation c(tok, tmpl, j["messages"]);
      // The stop token a scripted model ends its turns on.
      std::vector<int64_t> stop;
      if (j.contains("stop"))
        stop = tok.encode(j["stop"].get<std::string>());
      else if (!stops.empty())
        stop = {stops.front()};
      ordered_json generated = ordered_json::array(), states = ordered_json::array();
      auto state = [&](size_t appended) {
        const std::vector<int64_t> tail(c.ids().end() - (std::ptrdiff_t)appended, c.ids().end());
        states.push_back({{"messages", c.messages()},
                          {"text", tok.decodeKeepSpecial(c.ids())},
                          {"appended", tok.decodeKeepSpecial(tail)},
                          {"drifts", c.drifts()}});
      };
      state(c.ids().size());
      for (const ordered_json &t : j["turns"]) {
        if (t.contains("assistant") || t.contains("assistant_ids") ||
            t.contains("assistant_chars") || t.contains("assistant_cut")) {
          std::vector<int64_t> ids;
          if (t.contains("assistant_ids")) {
            ids = t["assistant_ids"].get<std::vector<int64_t>>();
          } else if (t.contains("assistant_chars")) {
            // A model that spelled its text character by character (ids a
            // re-tokenization of the text would not give back).
            const std::string text = t["assistant_chars"].get<std::string>();
            for (size_t i = 0; i < text.size();) {
              size_t n = 1;
              while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80)
                ++n;
              for (int64_t id : tok.encode(text.substr(i, n)))
                ids.push_back(id);
              i += n;
            }
            ids.insert(ids.end(), stop.begin(), stop.end());
          } else if (t.contains("assistant_cut")) {
            // A turn cut at its token limit: no stop token.
            ids = tok.encode(t["assistant_cut"].get<std::string>());
          } else {
            ids = tok.encode(t["assistant"].get<std::string>());
            ids.insert(ids.end(), stop.begin(), stop.end());
          }
          c.assistant(ids);
          generated.push_back(ids);
        } else {
          state(t.contains("environment")
                    ? c.environment(t["environment"])
                    : c.environment(t.at("role").get<std::string>(),
                                    t.at("content").get<std::string>()));
        }
      }
      ordered_json out;
      out["ids"] = c.ids();
      out["trained"] = c.trained();
      out["generated"] = generated;
      out["messages"] = c.messages();
      out["drifts"] = c.drifts();
      out["text"] = tok.decodeKeepSpecial(c.ids());
      out["states"] = states;
      std::cout << out.dump() << "\n";
    } catch (const LineError &) {
      throw;
    } catch (const std::exception &e) {
      throw LineError(where(lineNo) + e.what());
    }
  });
  return 0;
}

int run(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto &a : args)
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
  if (args.size() < 2)
    throw UsageError("expected TOKENIZER and COMMAND");
  const std::string spec = args[0], cmd = args[1];
  Flags f;
  for (size_t k = 2; k < args.size(); ++k) {
    const std::string &a = args[k];
    if (a == "--bos" && cmd == "encode")
      f.bos = true;
    else if (a == "--time" && cmd == "encode")
      f.time = true;
    else if (a == "--keep-special" && cmd == "decode")
      f.keepSpecial = true;
    else if (a == "--stream" && cmd == "decode")
      f.stream = true;
    else if (a == "--tokenize" && cmd == "render")
      f.tokenize = true;
    else if (a == "--keep-going" && cmd == "render")
      f.keepGoing = true;
    else
      throw UsageError("unknown option '" + a + "' for '" + cmd + "'");
  }
  if (cmd != "info" && cmd != "encode" && cmd != "decode" && cmd != "render" && cmd != "episode")
    throw UsageError("unknown command '" + cmd + "' (info, encode, decode, render, episode)");

  std::unique_ptr<hflow::data::Tokenizer> tok = hflow::data::makeTokenizer(spec);
  std::ios::sync_with_stdio(false);
  if (cmd == "info")
    return runInfo(*tok);
  if (cmd == "encode")
    return runEncode(*tok, f);
  if (cmd == "decode")
    return runDecode(*tok, f);
  if (cmd == "episode")
    return runEpisode(*tok, spec);
  return runRender(*tok, spec, f);
}

} // namespace

int main(int argc, char **argv) {
  try {
    const int rc = run(argc, argv);
    // Every line written, or a non-zero exit (a full disk, a closed pipe).
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "hflow-tokenize: error: cannot write to standard output: "
                << std::strerror(errno ? errno : EIO) << "\n";
      return 1;
    }
    return rc;
  } catch (const std::bad_alloc &) {
    std::cout.flush();
    std::cerr << "hflow-tokenize: error: ran out of memory (the allocator refused a request; "
                 "a tokenizer file or an input too large for this process's memory limit)\n";
    return 1;
  } catch (const UsageError &e) {
    std::cerr << "hflow-tokenize: error: " << e.what() << "\n"
              << "Run 'hflow-tokenize --help' for the usage.\n";
    return 2;
  } catch (const std::exception &e) {
    std::cout.flush();
    std::cerr << "hflow-tokenize: error: " << e.what() << "\n";
    return 1;
  }
}
