// Fuzzes arbitrary prompt bytes through a real tokenizer (PTLLM_FUZZ_TOKENIZER,
// fixed at build time: the bundled Llama 2 SentencePiece-BPE one, or a
// byte-level BPE one). Checks: ids inside the vocabulary, StreamDecoder ==
// decode, and for valid UTF-8 without special tokens the exact round trip
// decode(encode(text)) == text that both tokenizer kinds promise (except for a
// literal U+2581 "▁", which SentencePiece-style decoders turn into a space).
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min = n == 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ptllm::Tokenizer tok = ptllm::Tokenizer::from_file(PTLLM_FUZZ_TOKENIZER);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (bool add_special : {true, false}) {
      const std::vector<int32_t> ids = tok.encode(text, add_special);
      bool special = false;
      for (int32_t id : ids) {
        if (id < 0 || id >= tok.vocab_size()) fuzz::finding("encode produced id outside the vocabulary");
        special = special || tok.is_special(id);
      }
      const std::string whole = tok.decode(ids, true);
      ptllm::StreamDecoder stream(tok, true);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      if (streamed != whole) fuzz::finding("StreamDecoder output differs from decode()");
      if (!add_special && !special && valid_utf8(text) && text.find("\xE2\x96\x81") == std::string_view::npos &&
          tok.decode(ids, false) != text)
        fuzz::finding("decode(encode(text)) != text for valid UTF-8 without special tokens");
    }
  } catch (const ptllm::Error& e) {
    fuzz::finding(std::string("encode/decode of a prompt threw: ") + e.what());
  }
  return 0;
}
