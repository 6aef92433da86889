//===- hflow-hf-logits - the logits of a Hugging Face model directory ------===//
//
// For the architecture tests (test/integration/hf-architectures.test):
//   hflow-hf-logits DIR TOKENS.json OUT.json
// builds the runtime's Llama from DIR (config.json + safetensors, as
// loadHfLlama does) and writes the logits of the left-padded rows of
// TOKENS.json ({"tokens": [[..]], "mask": [[0/1..]], "prefill": P}) twice:
// "logits" from one forward of the whole rows, "cached" from a prefill of
// the first P columns and then one column at a time through the KV cache
// (the sampling loop's path). Both are [B][T][V], float32 printed exactly.
// An independent reference (Inputs/hf_arch_reference.py) compares them.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/Safetensors.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

using namespace hflow::models;

static nlohmann::json toJson(const at::Tensor &logits) {
  at::Tensor l = logits.contiguous().to(at::kFloat);
  nlohmann::json out = nlohmann::json::array();
  for (int64_t b = 0; b < l.size(0); ++b) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t t = 0; t < l.size(1); ++t) {
      at::Tensor v = l[b][t];
      const float *p = v.data_ptr<float>();
      row.push_back(std::vector<float>(p, p + v.numel()));
    }
    out.push_back(std::move(row));
  }
  return out;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hflow-hf-logits DIR TOKENS.json OUT.json\n");
    return 2;
  }
  try {
    c10::InferenceMode guard;
    std::unique_ptr<Llama> model = loadHfLlama(argv[1]);
    std::ifstream in(argv[2]);
    nlohmann::json j = nlohmann::json::parse(in);
    const auto tokens = j.at("tokens").get<std::vector<std::vector<int64_t>>>();
    const auto mask = j.at("mask").get<std::vector<std::vector<int64_t>>>();
    const int64_t B = (int64_t)tokens.size(), T = (int64_t)tokens.at(0).size();
    const int64_t P = j.at("prefill").get<int64_t>();
    auto lopts = at::TensorOptions().dtype(at::kLong);
    at::Tensor tok = at::empty({B, T}, lopts), msk = at::empty({B, T}, lopts);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        tok[b][t] = tokens.at(b).at(t);
        msk[b][t] = mask.at(b).at(t);
      }
    at::Tensor real = msk.ne(0);
    at::Tensor pos = positionsFromMask(real);
    at::Tensor whole = model->logits(model->hidden(tok, pos, real));
    KVCache cache;
    std::vector<at::Tensor> parts;
    parts.push_back(model->logits(model->hidden(tok.narrow(1, 0, P), pos.narrow(1, 0, P),
                                                real.narrow(1, 0, P), &cache)));
    for (int64_t t = P; t < T; ++t)
      parts.push_back(model->logits(model->hidden(tok.narrow(1, t, 1), pos.narrow(1, t, 1),
                                                  real.narrow(1, t, 1), &cache)));
    nlohmann::json out;
    out["logits"] = toJson(whole);
    out["cached"] = toJson(at::cat(parts, 1));
    std::ofstream o(argv[3]);
    o << out.dump() << "\n";
    if (!o)
      throw std::runtime_error(std::string("cannot write ") + argv[3]);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "hflow-hf-logits: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
