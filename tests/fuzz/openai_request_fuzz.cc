// libFuzzer target: the OpenAI-compatible HTTP API's request parser (http/openai_api.h), the
// JSON body of POST /v1/chat/completions and /v1/completions as a client sends it. The first
// byte picks the endpoint; the rest is the body. Any input must give a request or an
// INVALID_ARGUMENT with a parameter name, never a crash, hang, leak or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "http/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazyrag::http;
  if (size == 0) return 0;
  const OpenAiEndpoint endpoint =
      data[0] % 2 == 0 ? OpenAiEndpoint::kChatCompletions : OpenAiEndpoint::kCompletions;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto request = ParseOpenAiRequest(endpoint, body);
  if (!request.ok()) {
    if (request.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    (void)ParamOf(request.status());
    (void)HttpStatusOf(request.status().code());
    return 0;
  }
  // What the server forwards: the proto must serialize.
  std::string wire;
  if (!request->generate.SerializeToString(&wire)) __builtin_trap();
  return 0;
}
