// `duet make-test-model` (write the project's deterministic tiny test model) and
// `duet generate` (a quick look at a real model on the CPU backend: tokenize, run the shared
// engine loop over the paged KV cache, stream the continuation, optionally record step timings).
#include "cli/commands.h"

#include <unistd.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "backend/engine/local_engine.h"
#include "backend/model/test_model.h"
#include "backend/registry.h"
#include "backend/tokenizer/chat_template.h"
#include "backend/tokenizer/tokenizer.h"

namespace po = boost::program_options;

namespace duet::cli {
int MakeTestModel(int argc, char** argv) {
  po::options_description opts("duet make-test-model: write the deterministic tiny test model");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("out", po::value<std::string>()->required(), "directory to write (created if missing)")
    ("seed", po::value<std::uint64_t>()->default_value(1), "random seed of the weights")
    ("dtype", po::value<std::string>()->default_value("F32"), "weight dtype: F32, BF16 or F16")
    ("preset", po::value<std::string>()->default_value("tiny"),
     "tiny (2 layers, hidden 64), bench (~125M parameters) or llama-3.2-1b (Llama-3.2-1B's "
     "dimensions, 1.24B parameters); the last two are bf16 unless --dtype says otherwise");
  // clang-format on
  po::variables_map vm;
  int code = 0;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  const std::string preset = vm["preset"].as<std::string>();
  backend::TestModelOptions options;
  if (preset == "bench") {
    options = backend::TestModelOptions::Benchmark();
  } else if (preset == "llama-3.2-1b") {
    options = backend::TestModelOptions::Llama32_1B();
  } else if (preset != "tiny") {
    return Fail("--preset must be tiny, bench or llama-3.2-1b", kExitUsage);
  }
  options.seed = vm["seed"].as<std::uint64_t>();
  if (!vm["dtype"].defaulted() || preset == "tiny") {
    auto dtype = backend::DtypeFromName(vm["dtype"].as<std::string>());
    if (!dtype) return Fail("--dtype must be F32, BF16 or F16", kExitUsage);
    options.dtype = *dtype;
  }
  if (Status s = backend::WriteTestModel(vm["out"].as<std::string>(), options); !s.ok())
    return Fail(s.message());
  std::printf("wrote %s\n", vm["out"].as<std::string>().c_str());
  return kExitOk;
}

Status CheckKvCacheFits(const models::ModelSpec& config, std::int64_t num_blocks,
                        std::int32_t block_tokens) {
  // fp32: the most a backend stores per element.
  const double kv_bytes = static_cast<double>(num_blocks) * block_tokens *
                          static_cast<double>(config.KvBytesPerToken(models::Dtype::kF32));
  const double memory_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (memory_bytes > 0 && kv_bytes > memory_bytes) {
    char numbers[128];
    std::snprintf(numbers, sizeof numbers, "%.1f GB of KV cache, more than the %.1f GB of memory",
                  kv_bytes / 1e9, memory_bytes / 1e9);
    return Status::Error(std::to_string(num_blocks) + " blocks need " + numbers +
                         " this machine has");
  }
  return Status::Ok();
}

int Generate(int argc, char** argv) {
  po::options_description opts("duet generate: run a model on the CPU backend");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("model", po::value<std::string>()->required(),
     "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
    ("prompt", po::value<std::string>()->required(), "prompt text")
    ("chat", "wrap the prompt as a user message in the tokenizer's chat template")
    ("ignore-eos", "generate --max-tokens tokens whatever is sampled (for benchmarks)")
    ("max-tokens", po::value<std::int64_t>()->default_value(32), "tokens to generate at most")
    ("temperature", po::value<float>()->default_value(0.0f), "0: greedy")
    ("top-k", po::value<std::int32_t>()->default_value(0), "0: off")
    ("top-p", po::value<float>()->default_value(1.0f), "1: off")
    ("seed", po::value<std::uint64_t>()->default_value(0), "sampling seed")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu or cuda")
    ("threads", po::value<int>()->default_value(0), "CPU threads (0: all)")
    ("kv-blocks", po::value<std::int64_t>()->default_value(0),
     "KV cache blocks of 16 tokens (0: enough for this prompt)")
    ("timings", po::value<std::string>(), "write each step's shape and measured time (JSONL)")
    ("warmup", "run the prompt, a decode step after it and a 16-row decode step through the "
     "model once before generating, untimed (benchmarks: one-time costs such as kernel "
     "compilation out of the timings; duet serve does the same at start)");
  // clang-format on
  po::variables_map vm;
  int code = 0;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  const std::int64_t max_tokens = vm["max-tokens"].as<std::int64_t>();
  if (max_tokens < 1) return Fail("--max-tokens must be at least 1", kExitUsage);
  const float temperature = vm["temperature"].as<float>(), top_p = vm["top-p"].as<float>();
  if (!(temperature >= 0) || !std::isfinite(temperature))
    return Fail("--temperature must be >= 0", kExitUsage);
  if (!(top_p > 0 && top_p <= 1)) return Fail("--top-p must be in (0, 1]", kExitUsage);
  const std::int32_t top_k = vm["top-k"].as<std::int32_t>();
  if (top_k < 0) return Fail("--top-k must be >= 0 (0: off)", kExitUsage);
  const int threads = vm["threads"].as<int>();
  if (Status s = CheckThreadsFlag(threads); !s.ok()) return Fail(s.message(), kExitUsage);
  const std::int64_t kv_blocks_flag = vm["kv-blocks"].as<std::int64_t>();
  if (kv_blocks_flag < 0) return Fail("--kv-blocks must be >= 0 (0: enough)", kExitUsage);
  // Checked before the run, which takes long: the timings go to a temporary file beside the
  // path, renamed into place at the end.
  std::string timings_path, timings_tmp;
  if (vm.count("timings")) {
    timings_path = vm["timings"].as<std::string>();
    timings_tmp = timings_path + ".tmp";
    if (!std::ofstream(timings_tmp)) return Fail("--timings: cannot write " + timings_tmp);
  }
  struct RemoveTmp {
    const std::string& path;
    ~RemoveTmp() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } remove_tmp{timings_tmp};

  auto model = backend::LoadModelDir(vm["model"].as<std::string>());
  if (!model) return Fail(model.error());
  if (model->tokenizer_json_path.empty())
    return Fail(vm["model"].as<std::string>() + ": no tokenizer.json");
  auto tokenizer = backend::Tokenizer::Load(model->tokenizer_json_path);
  if (!tokenizer) return Fail(tokenizer.error());

  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> stop_ids;
  for (std::int64_t id : model->config.eos_token_ids)
    stop_ids.push_back(static_cast<std::int32_t>(id));
  if (vm.count("chat")) {
    auto format = backend::DetectChatFormat(*tokenizer, model->tokenizer_config_path);
    if (!format) return Fail("--chat: " + format.error());
    const std::string text = backend::ApplyChatTemplate(
        *format, {{"user", vm["prompt"].as<std::string>()}}, /*add_generation_prompt=*/true);
    prompt = tokenizer->Encode(text, /*add_bos=*/false);
    for (std::int32_t id : backend::StopTokenIds(*format, *tokenizer)) stop_ids.push_back(id);
  } else {
    prompt = tokenizer->Encode(vm["prompt"].as<std::string>(), /*add_bos=*/true);
  }
  if (prompt.empty()) return Fail("--prompt: the prompt encodes to no tokens", kExitUsage);
  // The model's context: the prompt and every generated token need a position.
  const std::int64_t context = model->config.max_position_embeddings;
  const auto prompt_tokens = static_cast<std::int64_t>(prompt.size());
  if (prompt_tokens >= context) {
    return Fail("--prompt: " + std::to_string(prompt_tokens) + " tokens leave no room in " +
                    vm["model"].as<std::string>() + "'s context of " + std::to_string(context) +
                    " tokens (max_position_embeddings)",
                kExitUsage);
  }
  if (max_tokens > context - prompt_tokens) {
    return Fail("--max-tokens: " + std::to_string(max_tokens) + " after a prompt of " +
                    std::to_string(prompt_tokens) + " tokens exceeds " +
                    vm["model"].as<std::string>() + "'s context of " + std::to_string(context) +
                    " tokens (max_position_embeddings); at most " +
                    std::to_string(context - prompt_tokens),
                kExitUsage);
  }

  backend::ModelPlacement placement;
  placement.device = vm["device"].as<std::string>();
  if (placement.device != "cpu" && placement.device != "cuda")
    return Fail("--device must be cpu or cuda", kExitUsage);
  placement.block_tokens = 16;
  placement.cpu_threads = threads;
  const std::int64_t needed = (prompt_tokens + max_tokens + 15) / 16 + 2;
  if (kv_blocks_flag != 0 && kv_blocks_flag < needed) {
    return Fail("--kv-blocks: " + std::to_string(kv_blocks_flag) +
                    " blocks of 16 tokens cannot hold " + std::to_string(prompt_tokens) +
                    " prompt tokens plus --max-tokens " + std::to_string(max_tokens) +
                    "; give at least " + std::to_string(needed) + " (or 0)",
                kExitUsage);
  }
  placement.num_blocks = kv_blocks_flag != 0 ? kv_blocks_flag : needed;
  if (Status s = CheckKvCacheFits(model->config, placement.num_blocks, placement.block_tokens);
      !s.ok())
    return Fail("--kv-blocks: " + s.message(), kExitUsage);
  auto forward_model = backend::CreateForwardModel(std::move(*model), placement);
  if (!forward_model) return Fail("--device " + placement.device + ": " + forward_model.error());

  // Straight through the model, not the engine: nothing enters the prefix cache, and the
  // blocks it writes are overwritten by the run.
  if (vm.count("warmup")) {
    if (Status s = backend::WarmUp(**forward_model, prompt); !s.ok())
      return Fail("--warmup: " + s.message());
  }

  backend::IncrementalDecoder decoder(*tokenizer, /*skip_special_tokens=*/true);
  backend::LocalEngineOptions options;
  options.scheduler.watermark = 0;
  options.on_token = [&](const policies::RequestSpec&, std::int32_t token) {
    std::fputs(decoder.Push(token).c_str(), stdout);
    std::fflush(stdout);
  };
  backend::GenerationRequest request{prompt, max_tokens, {}};
  request.sampling.temperature = temperature;
  request.sampling.top_k = top_k;
  request.sampling.top_p = top_p;
  request.sampling.seed = vm["seed"].as<std::uint64_t>();
  if (!vm.count("ignore-eos")) request.sampling.stop_token_ids = stop_ids;
  backend::LocalEngine engine(**forward_model, options);
  const auto results = engine.Generate({request});
  std::fputs(decoder.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const policies::RequestRecord& r = results[0].record;
  if (r.state != policies::RequestState::kCompleted) return Fail("generation failed: " + r.reason);
  const double prefill_s = r.first_token_s - r.first_scheduled_s;
  const double decode_s = r.finished_s - r.first_token_s;
  const auto generated = static_cast<double>(results[0].tokens.size());
  std::fprintf(stderr,
               "duet generate: %zu prompt tokens in %.3f s (%.1f tok/s), %zu generated, "
               "decode %.1f tok/s, on %s\n",
               prompt.size(), prefill_s, static_cast<double>(prompt.size()) / prefill_s,
               results[0].tokens.size(), generated > 1 ? (generated - 1) / decode_s : 0.0,
               placement.device.c_str());
  if (!timings_path.empty()) {
    if (Status s = backend::WriteStepTimings(engine.timings(), timings_tmp); !s.ok())
      return Fail(s.message());
    if (std::rename(timings_tmp.c_str(), timings_path.c_str()) != 0)
      return Fail("--timings: cannot rename " + timings_tmp + " to " + timings_path);
  }
  return kExitOk;
}

}  // namespace duet::cli
