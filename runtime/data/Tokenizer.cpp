//===- Tokenizer.cpp - byte and SentencePiece tokenizers ------------------===//
#include "runtime/data/Tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <sys/stat.h>

namespace hflow {
namespace data {
namespace {

class ByteTokenizer final : public Tokenizer {
public:
  std::vector<int64_t> encode(const std::string &text) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text)
      ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int64_t> &ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int64_t id : ids)
      if (id >= 0 && id < 256)
        s.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    return s;
  }
  int64_t vocabSize() const override { return 256; }
  int64_t eosId() const override { return '\n'; }
  int64_t padId() const override { return 0; }
  int64_t bosId() const override { return -1; }
  std::string name() const override { return "byte"; }
};

/// The SentencePiece module (SentencePieceShim.cpp), loaded once.
struct SpmApi {
  void *(*load)(const char *, char *, size_t) = nullptr;
  void (*free)(void *) = nullptr;
  void (*info)(void *, int *, int *, int *, int *) = nullptr;
  int (*encode)(void *, const char *, size_t, int **, size_t *, char *, size_t) = nullptr;
  int (*decode)(void *, const int *, size_t, char **, size_t *) = nullptr;
  void (*freeBuf)(void *) = nullptr;
};

std::string exeDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return ".";
  std::string p(buf, (size_t)n);
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

const SpmApi &spmApi() {
  static SpmApi api;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    std::vector<std::string> candidates;
    if (const char *e = std::getenv("HFLOW_SPM_MODULE"); e && *e)
      candidates.push_back(e);
    candidates.push_back(exeDir() + "/../lib/libhflow_spm.so");
#ifdef HFLOW_SPM_MODULE_BUILD_PATH
    candidates.push_back(HFLOW_SPM_MODULE_BUILD_PATH);
#endif
    void *h = nullptr;
    for (const auto &c : candidates) {
      h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h)
        break;
      const char *d = ::dlerror();
      error += (error.empty() ? "" : "; ") + std::string(d ? d : c);
    }
    if (h) {
      api.load = (decltype(api.load))::dlsym(h, "hflow_spm_load");
      api.free = (decltype(api.free))::dlsym(h, "hflow_spm_free");
      api.info = (decltype(api.info))::dlsym(h, "hflow_spm_info");
      api.encode = (decltype(api.encode))::dlsym(h, "hflow_spm_encode");
      api.decode = (decltype(api.decode))::dlsym(h, "hflow_spm_decode");
      api.freeBuf = (decltype(api.freeBuf))::dlsym(h, "hflow_spm_free_buf");
      if (!api.load || !api.free || !api.info || !api.encode || !api.decode ||
          !api.freeBuf) {
        api = SpmApi();
        error = "libhflow_spm.so lacks the hflow_spm_* functions";
      }
    }
  }
  if (!api.load)
    throw std::runtime_error("SentencePiece is unavailable: cannot load hflow's "
                             "SentencePiece module (" + error + ")");
  return api;
}

class SentencePieceTokenizer final : public Tokenizer {
public:
  explicit SentencePieceTokenizer(const std::string &path) : path_(path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      throw std::runtime_error("cannot load SentencePiece model '" + path +
                               "': " + std::strerror(errno));
    if (S_ISDIR(st.st_mode))
      throw std::runtime_error("cannot load SentencePiece model '" + path +
                               "': " + std::strerror(EISDIR));
    const SpmApi &api = spmApi();
    char err[512] = {0};
    h_ = api.load(path.c_str(), err, sizeof err);
    if (!h_)
      throw std::runtime_error("cannot load SentencePiece model '" + path +
                               "': " + err);
    int vocab = 0, eos = -1, bos = -1, pad = -1;
    api.info(h_, &vocab, &eos, &bos, &pad);
    vocab_ = vocab;
    if (vocab_ <= 0) {
      api.free(h_);
      throw std::runtime_error("cannot load SentencePiece model '" + path +
                               "': the model has no pieces");
    }
    auto inVocab = [&](int id) { return id >= 0 && id < vocab_ ? id : -1; };
    eos_ = inVocab(eos);
    bos_ = inVocab(bos);
    pad_ = inVocab(pad) >= 0 ? pad : 0;
    if (eos_ < 0) {
      api.free(h_);
      throw std::runtime_error("cannot use SentencePiece model '" + path +
                               "': it defines no EOS piece, so generation "
                               "could never stop");
    }
  }
  ~SentencePieceTokenizer() override { spmApi().free(h_); }

  std::vector<int64_t> encode(const std::string &text) const override {
    const SpmApi &api = spmApi();
    int *ids = nullptr;
    size_t n = 0;
    char err[512] = {0};
    if (api.encode(h_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
      throw std::runtime_error("SentencePiece model '" + path_ +
                               "': cannot encode text: " + err);
    std::vector<int64_t> out(ids, ids + n);
    api.freeBuf(ids);
    return out;
  }

  std::string decode(const std::vector<int64_t> &ids) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (int64_t id : ids)
      if (id >= 0 && id < vocab_)
        kept.push_back(static_cast<int>(id));
    std::string text;
    if (decodeInts(kept, text))
      return text;
    // Should not happen with in-range ids; fall back to the pieces one by
    // one, dropping any that will not decode.
    text.clear();
    for (int id : kept) {
      std::string piece;
      if (decodeInts({id}, piece))
        text += piece;
    }
    return text;
  }

  int64_t vocabSize() const override { return vocab_; }
  int64_t eosId() const override { return eos_; }
  int64_t padId() const override { return pad_; }
  int64_t bosId() const override { return bos_; }
  std::string name() const override { return "sentencepiece:" + path_; }

private:
  bool decodeInts(const std::vector<int> &ids, std::string &out) const {
    const SpmApi &api = spmApi();
    char *text = nullptr;
    size_t len = 0;
    if (api.decode(h_, ids.data(), ids.size(), &text, &len) != 0)
      return false;
    out.assign(text, len);
    api.freeBuf(text);
    return true;
  }

  std::string path_;
  void *h_ = nullptr;
  int vocab_ = 0;
  int64_t eos_ = -1, bos_ = -1, pad_ = 0;
};

bool isDirectory(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// True when the file's first non-blank byte is '{' (a JSON object, never
/// a SentencePiece protobuf, whose first byte is a field tag).
bool looksLikeJson(const std::string &p) {
  FILE *f = std::fopen(p.c_str(), "rb");
  if (!f)
    return false;
  int c;
  while ((c = std::fgetc(f)) != EOF && (c == ' ' || c == '\t' || c == '\n' || c == '\r'))
    ;
  std::fclose(f);
  return c == '{';
}

} // namespace

std::unique_ptr<Tokenizer> makeByteTokenizer() {
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> makeSentencePieceTokenizer(const std::string &modelPath) {
  return std::make_unique<SentencePieceTokenizer>(modelPath);
}

std::unique_ptr<Tokenizer> makeTokenizer(const std::string &spec) {
  static const char *kAccepted =
      "expected \"byte\", the path of a tokenizer.json or of a SentencePiece "
      ".model file, or a directory holding either";
  if (spec == "byte")
    return makeByteTokenizer();
  if (spec.empty())
    throw std::runtime_error(std::string("empty tokenizer name: ") + kAccepted);
  if (isDirectory(spec)) {
    std::string base = spec + (endsWith(spec, "/") ? "" : "/");
    if (exists(base + "tokenizer.json"))
      return makeHfTokenizer(base + "tokenizer.json");
    if (!exists(base + "tokenizer.model"))
      throw std::runtime_error("tokenizer '" + spec +
                               "': the directory has neither tokenizer.json nor "
                               "tokenizer.model (" + kAccepted + ")");
    return makeSentencePieceTokenizer(base + "tokenizer.model");
  }
  if (endsWith(spec, ".json") || looksLikeJson(spec))
    return makeHfTokenizer(spec); // names the file when it fails
  if (exists(spec) || endsWith(spec, ".model"))
    return makeSentencePieceTokenizer(spec); // names the file when it fails
  throw std::runtime_error("unknown tokenizer '" + spec + "': " + kAccepted +
                           " (no such file)");
}

} // namespace data
} // namespace hflow
