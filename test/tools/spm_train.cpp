//===- spm_train.cpp - train a SentencePiece model (tests only) ------------===//
//
// hflow-spm-train INPUT.txt PREFIX VOCAB: trains a BPE model on a text file
// and writes PREFIX.model. The integration tests use it to make a tokenizer
// for hflow-run --tokenizer (SentencePiece then runs inside a process that
// also loads LibTorch, through runtime/data's module). No LibTorch here.
//
//===----------------------------------------------------------------------===//
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <string>

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hflow-spm-train INPUT.txt PREFIX VOCAB\n");
    return 2;
  }
  std::string args = std::string("--input=") + argv[1] + " --model_prefix=" + argv[2] +
                     " --vocab_size=" + argv[3] +
                     " --model_type=bpe --character_coverage=1.0 --num_threads=1"
                     " --minloglevel=2 --pad_id=3";
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    std::fprintf(stderr, "hflow-spm-train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
