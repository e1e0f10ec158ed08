// Fuzzes tokenizer.json loading (Tokenizer::from_json). Input = tokenizer.json
// text, optionally a NUL byte and tokenizer_config.json text. A tokenizer that
// loads is then exercised: encode a few texts (and the input itself), decode
// the ids with and without special tokens, stream them through StreamDecoder
// (whose output must equal decode; ByteRuns::Eager's too where decode has no U+FFFD),
// and decode ids around the vocabulary edge.
#include <cstring>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {
void exercise(const ptllm::Tokenizer& tok, std::string_view text) {
  const int32_t vocab = tok.vocab_size();
  for (bool add_special : {true, false}) {
    const std::vector<int32_t> ids = tok.encode(text, add_special);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) fuzz::finding("encode produced id " + std::to_string(id) + " outside the vocabulary");
    const std::string whole = tok.decode(ids, true);
    (void)tok.decode(ids, false);
    ptllm::StreamDecoder stream(tok, true);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (streamed != whole) fuzz::finding("StreamDecoder output differs from decode()");
    // The server's ByteRuns::Eager: equal to decode() unless decode() gave U+FFFD for a run.
    ptllm::StreamDecoder eager(tok, true, ptllm::ByteRuns::Eager);
    std::string eager_text;
    for (int32_t id : ids) eager_text += eager.push(id);
    eager_text += eager.flush();
    if (whole.find("\xEF\xBF\xBD") == std::string::npos && eager_text != whole)
      fuzz::finding("StreamDecoder (ByteRuns::Eager) output differs from decode()");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view json = all.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);
  try {
    const ptllm::Tokenizer tok = ptllm::Tokenizer::from_json(json, config);
    const int32_t vocab = tok.vocab_size();
    if (vocab < 0) fuzz::finding("negative vocab_size");
    for (const char* text : {"Hello world", " leading  spaces\n\ttabs", "caf\xC3\xA9 \xE2\x96\x81 \xF0\x9F\x98\x80 12345",
                             "<s></s><unk><|endoftext|>", "\xFF\xFE bad \xC3 utf8", ""})
      exercise(tok, text);
    exercise(tok, json.substr(0, 256));
    std::vector<int32_t> edge;
    for (int32_t id = 0; id < vocab && id < 64; ++id) edge.push_back(id);
    for (int32_t id = std::max(0, vocab - 8); id < vocab; ++id) edge.push_back(id);
    (void)tok.decode(edge, false);
    (void)tok.decode(edge, true);
    for (int32_t bad : {-1, vocab}) {
      try {
        const int32_t one[1] = {bad};
        (void)tok.decode(one);
        fuzz::finding("decode accepted id " + std::to_string(bad) + " outside the vocabulary");
      } catch (const ptllm::Error& e) {
        fuzz::check_error(e);
      }
    }
    for (int32_t id = 0; id < vocab && id < 16; ++id) {
      try {
        (void)tok.id_to_piece(id);
      } catch (const ptllm::Error& e) {
        fuzz::check_error(e);  // holes in the vocabulary
      }
    }
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
