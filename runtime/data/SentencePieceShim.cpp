//===- SentencePieceShim.cpp - SentencePiece behind a C interface ----------===//
//
// Debian's libsentencepiece carries its own copy of protobuf-lite and
// exports its symbols; LibTorch loads libprotobuf. Linked into one process
// the two clash during static initialisation (a crash before main). So the
// processes that run models never link SentencePiece: Tokenizer.cpp loads
// this small module with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), which binds
// SentencePiece to its own protobuf and keeps its symbols out of the global
// scope. Only plain C types cross this interface.
//
//===----------------------------------------------------------------------===//
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
void setError(char *err, size_t cap, const std::string &msg) {
  if (err && cap > 0) {
    std::strncpy(err, msg.c_str(), cap - 1);
    err[cap - 1] = '\0';
  }
}
} // namespace

extern "C" {

void *hflow_spm_load(const char *path, char *err, size_t cap) {
  try {
    auto *sp = new sentencepiece::SentencePieceProcessor();
    auto s = sp->Load(path);
    if (!s.ok()) {
      setError(err, cap, s.ToString());
      delete sp;
      return nullptr;
    }
    return sp;
  } catch (const std::exception &e) {
    setError(err, cap, e.what());
    return nullptr;
  }
}

void hflow_spm_free(void *h) { delete static_cast<sentencepiece::SentencePieceProcessor *>(h); }

void hflow_spm_info(void *h, int *vocab, int *eos, int *bos, int *pad) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  *vocab = sp->GetPieceSize();
  *eos = sp->eos_id();
  *bos = sp->bos_id();
  *pad = sp->pad_id();
}

/// Returns 0 and a malloc'ed array in *ids (free with hflow_spm_free_buf).
int hflow_spm_encode(void *h, const char *text, size_t len, int **ids, size_t *n,
                     char *err, size_t cap) {
  try {
    auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
    std::vector<int> out;
    auto s = sp->Encode(std::string(text, len), &out);
    if (!s.ok()) {
      setError(err, cap, s.ToString());
      return 1;
    }
    *n = out.size();
    *ids = static_cast<int *>(std::malloc(sizeof(int) * (out.empty() ? 1 : out.size())));
    if (!*ids) {
      setError(err, cap, "out of memory");
      return 1;
    }
    if (!out.empty())
      std::memcpy(*ids, out.data(), sizeof(int) * out.size());
    return 0;
  } catch (const std::exception &e) {
    setError(err, cap, e.what());
    return 1;
  }
}

/// Returns 0 and a malloc'ed string in *text (free with hflow_spm_free_buf).
int hflow_spm_decode(void *h, const int *ids, size_t n, char **text, size_t *len) {
  try {
    auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
    std::string out;
    if (!sp->Decode(std::vector<int>(ids, ids + n), &out).ok())
      return 1;
    *len = out.size();
    *text = static_cast<char *>(std::malloc(out.size() + 1));
    if (!*text)
      return 1;
    std::memcpy(*text, out.data(), out.size());
    (*text)[out.size()] = '\0';
    return 0;
  } catch (...) {
    return 1;
  }
}

void hflow_spm_free_buf(void *p) { std::free(p); }

} // extern "C"
